#!/bin/bash
# run.sh [--build-vm] GUEST[,GUEST...] TIMEOUT_S [ARG...]
# run.sh --build-only
#
# One test of the meson suite 'rdma': boots the soft-RoCE VM
# (scripts/rdma_vm.sh) and runs tests/rdma/guest/GUEST.sh in it with ARGs
# (several GUESTs, comma-separated: one after the other in one boot),
# in a fresh work folder that is removed afterwards (RDMA_VM_KEEP=1 keeps
# it and says where). With --build-vm it first brings the VM's binaries up
# to date (ninja in build-vm/, which scripts/setup.sh configures with
# -Dnative=false) and passes that folder as the guest script's first
# argument. Exits with the guest script's status; 77 (skip) where the VM
# cannot run here, with the reason; 99 when the VM did not boot or timed out.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

vm_build=${RDMA_VM_BUILD:-$repo/build-vm}
# The binaries the guest scripts run, brought up to date in build-vm.
build_vm_binaries() {
  if [ ! -f "$vm_build/build.ninja" ]; then
    echo "rdma test: $vm_build is not configured; run scripts/setup.sh (it builds the VM's binaries with -Dnative=false)" >&2
    exit 1
  fi
  ninja -C "$vm_build" comm/libbraid_comm_ibverbs.so tools/braid-bench tools/braid-launch tools/check/braid-check tests/rdma/programs/rdma-forge-cts tests/rdma/programs/rdma-cts-step \
    tests/rdma/programs/rdma-polled tests/rdma/programs/librdma-late-qp.so tests/rdma/programs/librdma-faults.so \
    tests/rdma/programs/rdma-busy tests/rdma/programs/rdma-abort >&2
}
# scripts/setup.sh builds them up front (--build-only), so that no test's
# time goes into compiling them.
if [ "${1:-}" = --build-only ]; then build_vm_binaries; exit 0; fi

build_vm=0
[ "${1:-}" = --build-vm ] && { build_vm=1; shift; }
[ $# -ge 2 ] || { echo "usage: run.sh [--build-vm] GUEST[,GUEST...] TIMEOUT_S [ARG...] | run.sh --build-only" >&2; exit 2; }
guest="" timeout_s=$2
IFS=, read -r -a names <<<"$1"
for name in "${names[@]}"; do guest+="${guest:+,}$here/guest/$name.sh"; done
shift 2

scripts/rdma_vm.sh --check || exit $?

args=()
if [ "$build_vm" = 1 ]; then
  build_vm_binaries
  args=("$vm_build")
fi

workdir=$(mktemp -d "${TMPDIR:-/tmp}/braid-rdma-vm.XXXXXX")
cleanup() {
  if [ "${RDMA_VM_KEEP:-0}" = 1 ]; then echo "rdma test: work folder kept: $workdir" >&2
  else rm -rf "$workdir"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

status=0
scripts/rdma_vm.sh "$workdir" "$guest" "$timeout_s" "${args[@]}" || status=$?
exit "$status"
