#!/bin/bash
# Guest script (runs inside the VM, see scripts/rdma_vm/guest_lib.sh): the
# VM's braid binaries (build-vm, -Dnative=false: TCG's CPU has no AVX-512)
# run in the guest. A 2-rank braid-bench all_reduce over TCP and over
# shared memory, with its result check: no wrong value; and one job over
# the two "hosts" of rxe_two_hosts (one rank on each, launched by
# launch_two_hosts): under BRAID_TRANSPORT=auto braid connects them over
# RDMA (both hosts have a verbs device), under BRAID_TRANSPORT=tcp over TCP.
# $1: the build folder holding tools/braid-launch and tools/braid-bench.
build=${1:?usage: braid_bench.sh BUILD_VM_DIR}

bench_args=(-b 8 -e 1M -f 32 -w 0 -c 1 --memcpy_bytes 0)
export BRAID_TIMEOUT=30

expect_clean_run() { # STATUS TRANSPORT OUTPUT
  [ "$1" -eq 0 ] || { echo "# braid-launch exited with $1"; return 1; }
  grep -q "2 ranks, transport $2," <<<"$3" || { echo "# not run over $2"; return 1; }
  grep -q '# Out of bounds values : 0 OK' <<<"$3" || { echo "# wrong values"; return 1; }
}

bench_one_host() { # TRANSPORT
  local out status
  out=$(BRAID_TRANSPORT=$1 bounded 40 "$build/tools/braid-launch" --nproc-per-node 2 -- \
    "$build/tools/braid-bench" "${bench_args[@]}" 2>&1)
  status=$?
  echo "$out"
  expect_clean_run "$status" "$1" "$out"
}

bench_two_hosts() { # BRAID_TRANSPORT EXPECTED
  local out status
  out=$(BRAID_TRANSPORT=$1 launch_two_hosts "$build/tools/braid-launch" h1 h2 1 40 -- "$build/tools/braid-bench" "${bench_args[@]}" 2>&1)
  status=$?
  echo "$out"
  expect_clean_run "$status" "$2" "$out"
}

check "braid-bench all_reduce, 2 ranks over tcp, no wrong value" bench_one_host tcp
check "braid-bench all_reduce, 2 ranks over shm, no wrong value" bench_one_host shm
check "two hosts h1 and h2 set up" rxe_two_hosts h1 h2
check "braid-bench all_reduce, one rank on each of two hosts (auto: ibverbs), no wrong value" bench_two_hosts auto ibverbs
check "braid-bench all_reduce, one rank on each of two hosts (tcp), no wrong value" bench_two_hosts tcp tcp
finish
