#!/bin/bash
# rdma_targets.sh [BUILD_VM_DIR [ROUNDS]]
#
# Issue 15's RDMA targets, measured in the soft-RoCE VM (scripts/rdma_vm.sh)
# in one run: braid-bench all_gather busbw over ibverbs at 4, 8 and 16 MiB
# against ib_write_bw on the same rxe devices and sizes (target >= 0.8 x),
# and the 8-byte all_reduce time on 2 ranks against ibv_rc_pingpong's round
# trip (target <= 1.0 x); scripts/rdma_vm/targets_guest.sh says how each
# number is taken. Two hosts (network namespaces, each with its own rxe
# device on one end of a veth wire), one rank each. The CPU is emulated
# (TCG): absolute numbers are ~50-100x below native and vary with the load
# of this machine; the ratios are what counts, and they come from the same
# run: each measurement ROUNDS times (default 3), interleaved, medians
# compared. Prints the table; exits 0 when every measurement ran, 77 where
# the VM cannot run. ~1 min of VM per round.
#
# BUILD_VM_DIR: a -Dnative=false build (default build-vm, as
# scripts/setup.sh configures it; or $RDMA_VM_BUILD); braid-bench and
# braid-launch are brought up to date there first.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-${RDMA_VM_BUILD:-$repo/build-vm}}" && pwd)
[ -f "$build/build.ninja" ] || { echo "rdma_targets: $build is not a configured build folder (scripts/setup.sh makes build-vm)" >&2; exit 2; }

"$repo/scripts/rdma_vm.sh" --check || exit $?
ninja -C "$build" tools/braid-bench tools/braid-launch tests/rdma/programs/rdma-exchange >&2

workdir=$(mktemp -d "${TMPDIR:-/tmp}/braid-rdma-targets.XXXXXX")
trap 'rm -rf "$workdir"' EXIT
rounds=${2:-3}
echo "# host load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$repo/scripts/rdma_vm.sh" "$workdir" "$repo/scripts/rdma_vm/targets_guest.sh" $((60 + 120 * rounds)) "$build" "$rounds"
echo "# host load after: $(cut -d' ' -f1-3 /proc/loadavg)"
