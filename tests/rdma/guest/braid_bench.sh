#!/bin/bash
# Guest script (runs inside the VM, see scripts/rdma_vm/guest_lib.sh): the
# VM's braid binaries (build-vm, -Dnative=false: TCG's CPU has no AVX-512)
# run in the guest. A 2-rank braid-bench all_reduce over TCP and over
# shared memory, with its result check: no wrong value.
# $1: the build folder holding tools/braid-launch and tools/braid-bench.
build=${1:?usage: braid_bench.sh BUILD_VM_DIR}

bench() { # TRANSPORT
  local out
  out=$(BRAID_TRANSPORT=$1 BRAID_TIMEOUT=30 bounded 40 "$build/tools/braid-launch" --nproc-per-node 2 -- \
    "$build/tools/braid-bench" -b 8 -e 1M -f 32 -c 1 2>&1)
  local status=$?
  echo "$out"
  [ "$status" -eq 0 ] || { echo "# braid-launch exited with $status"; return 1; }
  grep -q "2 ranks, transport $1," <<<"$out" || { echo "# not run over $1"; return 1; }
  grep -q '# Out of bounds values : 0 OK' <<<"$out" || { echo "# wrong values"; return 1; }
}

check "braid-bench all_reduce, 2 ranks over tcp, no wrong value" bench tcp
check "braid-bench all_reduce, 2 ranks over shm, no wrong value" bench shm
finish
