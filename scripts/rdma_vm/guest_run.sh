#!/bin/bash
# Runs inside the RDMA VM, chrooted into the host's root (read-only, with
# fresh tmpfs on /tmp, /run and /dev/shm), as the VM's /init hands over.
# Loads soft-RoCE, then runs the guest script with the helper functions of
# guest_lib.sh defined (through BASH_ENV, so the script is an ordinary bash
# script with its own $0, arguments and exit status). Its exit status becomes
# rdma_vm.sh's.
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
BASH_ENV="$RDMA_VM_LIB" exec bash "$RDMA_VM_SCRIPT" "${args[@]}"
