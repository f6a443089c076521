#!/bin/bash
# Runs inside the RDMA VM, chrooted into the host's root (read-only, with
# fresh tmpfs on /tmp, /run and /dev/shm), as the VM's /init hands over.
# Loads soft-RoCE, then runs the guest script with the helper functions of
# guest_lib.sh defined (through BASH_ENV, so the script is an ordinary bash
# script with its own $0, arguments and exit status). Its exit status becomes
# rdma_vm.sh's. Several scripts (colon-separated in RDMA_VM_SCRIPT) run
# one after the other, each from a clean state (see below).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8
here=$(dirname "$RDMA_VM_RUNNER")

ip link set lo up
# crc32_generic first: without it rdma_rxe fails to load ("failed to init
# crc32 algorithm err:-2").
for m in crc32_generic rdma_rxe ib_uverbs veth; do
  if ! modprobe "$m"; then
    echo "rdma_vm guest: modprobe $m failed" >&2
    exit 99
  fi
done

args=()
[ -s "$RDMA_VM_WORKDIR/vm/args" ] && mapfile -d '' -t args < "$RDMA_VM_WORKDIR/vm/args"
cd "$RDMA_VM_CWD" || exit 99
export RDMA_VM_LIB="$here/guest_lib.sh"
IFS=: read -r -a scripts <<<"$RDMA_VM_SCRIPT"
[ "${#scripts[@]}" -gt 1 ] || BASH_ENV="$RDMA_VM_LIB" exec bash "$RDMA_VM_SCRIPT" "${args[@]}"

# Several scripts (rdma_vm.sh A.sh,B.sh ...): one boot for all of them, each
# in turn with the same ARGs, its stderr interleaved with its stdout, and
# between them everything a script may leave behind removed, so that each
# starts as it would in a VM of its own: processes, network namespaces, rxe
# devices and their veths (with any qdisc on them), /dev/shm. The status is
# the first non-zero one; a last line sums up every script's.
guest_reset() { # [PID_TO_SPARE]
  local p pid cmd d
  # Every user process but init and this runner (kernel threads have no
  # command line), read without a fork per process: forks are slow in TCG.
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = 1 ] || [ "$pid" = $$ ] || [ "$pid" = "${1:-}" ] && continue
    cmd=""
    { IFS= read -r -d '' cmd < "$p/cmdline"; } 2>/dev/null
    [ -n "$cmd" ] && kill -KILL "$pid" 2>/dev/null
  done
  ip -all netns delete 2>/dev/null
  for d in /sys/class/infiniband/rxe*; do [ -e "$d" ] && rdma link delete "${d##*/}"; done
  for d in /sys/class/net/rxe-*; do [ -e "$d" ] && ip link delete "${d##*/}" 2>/dev/null; done
  rm -rf /dev/shm/* 2>/dev/null
  true
}
# What a failed check printed, again at the very end: the test log a CI
# shows is often only its last lines, and those belong to the scripts after
# the one that failed. Each "not ok" line comes with the lines its check
# printed before it (at most 40), or, where the script failed with no
# "not ok" (it stopped), with its last 40 lines; all under "# | ".
failed_checks() { # OUTPUT_FILE
  awk '
    /^(not )?ok / { if (/^not ok /) { for (i = n > 40 ? n - 40 : 0; i < n; i++) print "# | " buf[i % 40]; print "# | " $0; bad++ }
                    n = 0; next }
    { buf[n % 40] = $0; n++ }
    END { if (!bad) { for (i = n > 40 ? n - 40 : 0; i < n; i++) print "# | " buf[i % 40] } }' "$1"
}
status=0 summary="" recap=""
for script in "${scripts[@]}"; do
  name=$(basename "$script" .sh) started=$EPOCHREALTIME
  echo "# ==== guest script $name"
  # A copy for the recap through tee, which guest_reset spares: processes
  # the script left behind may hold its pipe open, and tee ends once they
  # are gone (a plain pipeline would wait for them).
  # (The guest has no /dev/fd, so no >(tee ...): a FIFO.)
  mkfifo "/tmp/rdma_vm_fifo.$name"
  tee "/tmp/rdma_vm_out.$name" < "/tmp/rdma_vm_fifo.$name" &
  tee_pid=$!
  BASH_ENV="$RDMA_VM_LIB" bash "$script" "${args[@]}" > "/tmp/rdma_vm_fifo.$name" 2>&1
  st=$?
  [ "$st" -eq 0 ] || recap+="$name "
  took=$(( (${EPOCHREALTIME//[.,]/} - ${started//[.,]/}) / 1000000 ))
  started=$EPOCHREALTIME
  guest_reset "$tee_pid"
  wait "$tee_pid"
  echo "# ==== guest script $name exited with $st after ${took} s"
  echo "# ==== state after $name removed in $(( (${EPOCHREALTIME//[.,]/} - ${started//[.,]/}) / 1000 )) ms"
  summary+=" $name:$st"
  [ "$status" -ne 0 ] || status=$st
done
for name in $recap; do
  echo "# ==== guest script $name failed; what its failed checks printed:"
  failed_checks "/tmp/rdma_vm_out.$name"
done
echo "# guest scripts (name:status):$summary"
exit "$status"
