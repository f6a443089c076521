#!/bin/bash
# Guest script (runs inside the VM, see scripts/rdma_vm/guest_lib.sh): the
# region-bounds check of the ibverbs transport over real verbs. Across the
# two rxe hosts, rank 0 offers rank 1 a clear-to-send whose buffer lies
# beyond the registration it advertises (rdma-forge-cts forges it): rank 1
# must refuse to write, naming rank 0 and the registration, and fail; rank 0
# must fail naming rank 1, with no byte of its buffer written; nothing hangs
# (well within BRAID_TIMEOUT) and no process is left. Then the numbering of
# clear-to-sends after a large receive taken before it was offered
# (rdma-cts-step, cts_step.cc).
# $1: the build folder holding tools/braid-launch and tests/rdma/programs/.
build=${1:?usage: ibverbs_forge.sh BUILD_VM_DIR}
export BRAID_TIMEOUT=20

forged() {
  local out status start=$SECONDS
  out=$(launch_two_hosts "$build/tools/braid-launch" h1 h2 1 40 -- "$build/tests/rdma/programs/rdma-forge-cts" 2>&1)
  status=$?
  echo "$out" | grep -E 'rank [01]:|launch_two_hosts'
  echo "# $((SECONDS - start)) s"
  grep -q "rank 1: refused the forged range, as it must" <<<"$out" || return 1
  grep -q "rank 0: 0 byte(s) of the buffer written; the error names rank 1" <<<"$out" || return 1
  [ "$status" -eq 0 ] || return 1
  [ $((SECONDS - start)) -lt 30 ] || { echo "# too slow"; return 1; }
  ! pgrep -f rdma-forge-cts >/dev/null || { echo "# a rank was left running"; return 1; }
}

# rdma-cts-step (2 queue pairs per peer): a large receive taken before it
# was offered leaves the clear-to-send numbering in step, and every later
# large message is written directly (HOLD=0 runs it without the late
# stripes that make that order: by hand, the control).
cts_step() { # HOLD
  local out status
  out=$(HOLD=$1 launch_two_hosts "$build/tools/braid-launch" h1 h2 1 40 -- "$build/tests/rdma/programs/rdma-cts-step" 2>&1)
  status=$?
  grep -E 'rank [01]:|launch_two_hosts' <<<"$out"
  grep -q "rank 1: phase 2: 10 of 10 large messages written directly" <<<"$out" || return 1
  grep -q "rank 0: 0 message(s) with wrong bytes" <<<"$out" || return 1
  [ "$status" -eq 0 ]
}

check "two hosts h1 and h2" rxe_two_hosts h1 h2
check "a clear-to-send beyond its advertised registration is refused; nothing written, both ranks fail by name" forged
check "a large receive taken before it was offered: the later ones are still written directly" cts_step 1
finish
