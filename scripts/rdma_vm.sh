#!/bin/bash
# rdma_vm.sh WORKDIR GUEST_SCRIPT[,GUEST_SCRIPT...] [TIMEOUT_S [ARG...]]
# rdma_vm.sh --check     exit 0 if the VM can run here, else 77 and why
#
# Runs GUEST_SCRIPT (a bash script, with ARGs) inside a small QEMU VM that
# boots Debian's kernel with soft-RoCE (rdma_rxe), so RDMA code runs against
# real verbs on a machine without an RDMA NIC (see README, "RDMA VM tests").
# The VM sees the host's / and this repository read-only at the same paths
# (the repository shared on its own, so that a checkout under /tmp, which is
# a fresh tmpfs in the guest, is still seen), and WORKDIR writable
# at its own path; /tmp, /run and /dev/shm are fresh tmpfs in the guest.
# The guest script runs (as a copy in WORKDIR/vm/script/) as root in the
# caller's directory, with the helpers of scripts/rdma_vm/guest_lib.sh
# defined and RDMA_VM_REPO (this repository) and RDMA_VM_WORKDIR set.
#
# Prints the guest script's stdout and stderr and exits with its status.
# Several scripts, comma-separated, share one boot (~13 s of TCG each saved):
# each runs in turn with the same ARGs and from a clean state, its stderr
# interleaved with its stdout; the status is the first non-zero one
# (guest_run.sh).
# Exit 77: the VM cannot run here (no kernel, qemu or 9p module; meson's
# skip code). Exit 99: the VM did not boot, or ran past TIMEOUT_S (default
# 60) and was killed; the console log is printed. WORKDIR/vm/ keeps
# stdout, stderr, status and console.log. The initramfs is cached in
# $RDMA_VM_CACHE (default build/rdma-vm/) and rebuilt when the kernel or the
# VM's init changes. Nothing is left running on any exit path.
#
# Environment: RDMA_VM_KERNEL (a vmlinuz; default the newest /boot/vmlinuz-*
# with modules), RDMA_VM_CACHE, RDMA_VM_MEM_MB (2048), RDMA_VM_CPUS (2).
set -euo pipefail

self_dir=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$self_dir/.." && pwd)
vm_dir="$self_dir/rdma_vm"

skip() { echo "rdma_vm: SKIP: $*" >&2; exit 77; }
fail() { echo "rdma_vm: ERROR: $*" >&2; exit 99; }
usage() { echo "usage: rdma_vm.sh WORKDIR GUEST_SCRIPT[,GUEST_SCRIPT...] [TIMEOUT_S [ARG...]] | rdma_vm.sh --check" >&2; exit 2; }

check_only=0
if [ "${1:-}" = --check ]; then
  check_only=1
else
  [ $# -ge 2 ] || usage
  mkdir -p "$1"
  workdir=$(cd "$1" && pwd -P)
  scripts=()
  IFS=, read -r -a given <<<"$2"
  for s in "${given[@]}"; do
    [ -f "$s" ] || { echo "rdma_vm: no guest script $s" >&2; exit 2; }
    scripts+=("$(cd "$(dirname "$s")" && pwd -P)/$(basename "$s")")
  done
  [ "${#scripts[@]}" -gt 0 ] || usage
  timeout_s=${3:-60}
  shift $(( $# >= 3 ? 3 : 2 ))
  case $timeout_s in ''|*[!0-9]*) usage ;; esac
fi

# ---- can the VM run here? -------------------------------------------------
qemu=$(command -v qemu-system-x86_64 || true)
[ -n "$qemu" ] || skip "no qemu-system-x86_64 (install qemu-system-x86; scripts/setup.sh does)"
pick_kernel() {
  local k v
  for k in $(ls /boot/vmlinuz-* 2>/dev/null | sort -V -r); do
    v=${k#/boot/vmlinuz-}
    [ -d "/lib/modules/$v" ] && { echo "$k"; return; }
  done
}
kernel=${RDMA_VM_KERNEL:-$(pick_kernel)}
[ -n "$kernel" ] && [ -r "$kernel" ] \
  || skip "no readable /boot/vmlinuz-* with modules (install linux-image-amd64; scripts/setup.sh does)"
kver=${kernel##*/vmlinuz-}
modinfo -k "$kver" -n 9p >/dev/null 2>&1 || skip "kernel $kver has no 9p module"
modinfo -k "$kver" -n rdma_rxe >/dev/null 2>&1 || skip "kernel $kver has no rdma_rxe module"
busybox=/bin/busybox
[ -x "$busybox" ] && case $(LC_ALL=C ldd "$busybox" 2>&1 || true) in *"not a dynamic"*) true ;; *) false ;; esac \
  || skip "no static /bin/busybox (install busybox-static; scripts/setup.sh does)"
[ "$check_only" = 0 ] || { echo "rdma_vm: the VM can run here (kernel $kver, $qemu)"; exit 0; }
case $workdir in *[[:space:]\'\"\\:]*) fail "WORKDIR path must not contain spaces, quotes or colons: $workdir" ;; esac

# ---- the initramfs (cached) -----------------------------------------------
# Modules that mount the host's root over 9p, dependencies first.
ordered_modules() {
  local seen="" out=""
  visit() {
    local m=$1 d
    case " $seen " in *" $m "*) return ;; esac
    seen="$seen $m"
    for d in $(modinfo -k "$kver" -F depends "$m" | tr ',' ' '); do visit "$d"; done
    out="$out $m"
  }
  for m in virtio_pci 9pnet_virtio 9p; do visit "$m"; done
  echo $out
}

build_initramfs() {
  local dest=$1 tmp m ko base
  tmp=$(mktemp -d "$cache/initramfs.XXXXXX")
  mkdir -p "$tmp/bin" "$tmp/modules" "$tmp/proc" "$tmp/sys" "$tmp/dev" "$tmp/mnt"
  cp "$busybox" "$tmp/bin/busybox"
  cp "$vm_dir/init" "$tmp/init"
  chmod 755 "$tmp/init" "$tmp/bin/busybox"
  : > "$tmp/modules.order"
  for m in $(ordered_modules); do
    ko=$(modinfo -k "$kver" -n "$m")
    base=$(basename "$ko"); base=${base%.xz}; base=${base%.zst}
    case $ko in
      *.xz) xz -dc "$ko" > "$tmp/modules/$base" ;;
      *.zst) zstd -qdc "$ko" > "$tmp/modules/$base" ;;
      *) cp "$ko" "$tmp/modules/$base" ;;
    esac
    echo "$base" >> "$tmp/modules.order"
  done
  (cd "$tmp" && find . | cpio -o -H newc --quiet | gzip -1) > "$dest.tmp.$$"
  mv "$dest.tmp.$$" "$dest"
  rm -rf "$tmp"
}

cache=${RDMA_VM_CACHE:-$repo/build/rdma-vm}
mkdir -p "$cache"
key=$( { echo "$kver"; cat "$vm_dir/init"; sha256sum "$busybox"; } | sha256sum | cut -c1-12)
initrd="$cache/initramfs-$kver-$key.cpio.gz"
if [ ! -s "$initrd" ]; then
  echo "rdma_vm: building $initrd" >&2
  build_initramfs "$initrd"
  for old in "$cache"/initramfs-*.cpio.gz; do
    [ "$old" = "$initrd" ] || rm -f "$old"
  done
fi

# ---- run ------------------------------------------------------------------
out="$workdir/vm"
mkdir -p "$out"
rm -f "$out/stdout" "$out/stderr" "$out/status" "$out/status.tmp" "$out/console.log" "$out/args"
# The guest runs a copy in WORKDIR: the script's own folder may be hidden in
# the guest (its /tmp is a fresh tmpfs).
rm -rf "$out/script"; mkdir -p "$out/script"
copies=""
for s in "${scripts[@]}"; do
  [ ! -e "$out/script/$(basename "$s")" ] || fail "two guest scripts named $(basename "$s")"
  cp "$s" "$out/script/"
  copies+="${copies:+:}$out/script/$(basename "$s")"
done
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
{
  echo "export RDMA_VM_WORKDIR=$(q "$workdir")"
  echo "export RDMA_VM_SCRIPT=$(q "$copies")"
  echo "export RDMA_VM_RUNNER=$(q "$vm_dir/guest_run.sh")"
  echo "export RDMA_VM_CWD=$(q "$(pwd -P)")"
  echo "export RDMA_VM_REPO=$(q "$repo")"
} > "$out/guest.env"
[ $# -eq 0 ] || printf '%s\0' "$@" > "$out/args"

qemu_pid=""
cleanup() {
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill -KILL "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

started_ns=$(date +%s%N)
"$qemu" -accel tcg,thread=multi -cpu max -m "${RDMA_VM_MEM_MB:-2048}" -smp "${RDMA_VM_CPUS:-2}" \
  -nic none -nographic -no-reboot \
  -kernel "$kernel" -initrd "$initrd" \
  -append "console=ttyS0 quiet panic=-1" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$repo",mount_tag=repo,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$workdir",mount_tag=work,security_model=none,multidevs=remap \
  </dev/null >"$out/console.log" 2>&1 &
qemu_pid=$!

deadline=$(( $(date +%s) + timeout_s ))
while kill -0 "$qemu_pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
  sleep 0.2
done
timed_out=0
if kill -0 "$qemu_pid" 2>/dev/null; then
  timed_out=1
  cleanup
fi
wait "$qemu_pid" 2>/dev/null || true
qemu_pid=""
elapsed_ms=$(( ($(date +%s%N) - started_ns) / 1000000 ))

[ -f "$out/stdout" ] && cat "$out/stdout"
[ -f "$out/stderr" ] && cat "$out/stderr" >&2
if [ -f "$out/status" ]; then
  status=$(cat "$out/status")
  echo "rdma_vm: guest script exited with $status (VM ran ${elapsed_ms} ms)" >&2
  exit "$status"
fi
echo "---- VM console (last 40 lines of $out/console.log) ----" >&2
tail -n 40 "$out/console.log" >&2 || true
if [ "$timed_out" = 1 ]; then
  fail "the VM ran past ${timeout_s}s and was killed (TCG is slow: raise TIMEOUT_S, or see the console above)"
fi
fail "the VM stopped without a guest exit status (did not boot? see the console above)"
