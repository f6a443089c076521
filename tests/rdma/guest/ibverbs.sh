#!/bin/bash
# Guest script (runs inside the VM, see scripts/rdma_vm/guest_lib.sh): braid's
# ibverbs transport on real verbs (soft-RoCE), forced with
# BRAID_TRANSPORT=ibverbs.
#  - one rxe host, 2 ranks: braid-bench all_reduce and send_recv over
#    ibverbs, no wrong value (every collective, every element, runs across
#    two hosts in ibverbs_grid.sh: a run per collective here cost ~6 s of
#    TCG each and took no path the grid does not);
#  - BRAID_IB_GID_INDEX=1 (rxe has index 0 only): both ranks fail at set-up,
#    at once, with an error naming the GID index and the remedy;
#  - two hosts (rxe_two_hosts), one rank each, each naming its own rxe
#    device (BRAID_IB_HCA, set by on_host): all_reduce, no wrong value.
# A peer killed mid-run is ibverbs_peer_killed.sh (its own VM run).
# $1: the build folder holding tools/braid-launch and tools/braid-bench.
build=${1:?usage: ibverbs.sh BUILD_VM_DIR}
launch=$build/tools/braid-launch bench=$build/tools/braid-bench

export BRAID_TRANSPORT=ibverbs BRAID_TIMEOUT=20

bench_one_host() { # COLLECTIVE
  local out status
  out=$(bounded 30 "$launch" --nproc-per-node 2 -- \
    "$bench" --memcpy_bytes 0 --coll "$1" -b 8 -e 256K -f 32 -n 3 -w 0 -c 1 2>&1)
  status=$?
  echo "$out" | grep -E '^\[rank 0\] (#  +[0-9]| +[0-9])|Out of bounds|transport|braid-bench:|braid-launch:'
  [ "$status" -eq 0 ] || { echo "# braid-launch exited with $status"; return 1; }
  grep -q "braid-bench $1: 2 ranks, transport ibverbs," <<<"$out" || { echo "# not run over ibverbs"; return 1; }
  grep -q '# Out of bounds values : 0 OK' <<<"$out" || { echo "# wrong values"; return 1; }
}

# Both ranks must name the GID index and the remedy; the job must fail fast
# (well under BRAID_TIMEOUT: the choice fails before any connection is tried).
wrong_gid() {
  local out status start=$SECONDS
  out=$(BRAID_IB_GID_INDEX=1 bounded 30 "$launch" --nproc-per-node 2 -- "$bench" -b 8 -e 8 -n 1 -w 0 2>&1)
  status=$?
  while IFS= read -r line; do echo "  $line"; done <<<"$out"
  echo "# status $status after $((SECONDS - start)) s"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ "$status" -ne 137 ] || return 1
  [ $((SECONDS - start)) -lt 15 ] || { echo "# too slow for a set-up error"; return 1; }
  # Each rank refuses on its own at set-up; the launcher stops the others
  # as soon as the first one exits, so the first one's words are checked
  # (a second rank may be stopped before it prints its own).
  [ "$status" -eq 2 ] || { echo "# not the set-up refusal's status 2"; return 1; }
  grep -qE "rank [01] found no usable RDMA device: it needs an active port with a GID at BRAID_IB_GID_INDEX=1, and this host offers: rxe0 port 1 GID index 0" <<<"$out" \
    || { echo "# no rank named the GID index and what the host offers"; return 1; }
  grep -q "Set BRAID_IB_HCA / BRAID_IB_GID_INDEX to one of those" <<<"$out" || { echo "# no remedy"; return 1; }
}

# One rank on each of two hosts (rxe_two_hosts: rxe0 for h1, rxe1 for h2,
# named per host by on_host's BRAID_IB_HCA), RDMA across the veth wire.
bench_two_hosts() {
  local out status
  out=$(BRAID_LOG_LEVEL=info launch_two_hosts "$launch" h1 h2 1 40 -- "$bench" --memcpy_bytes 0 -b 8 -e 256K -f 32 -n 3 -w 0 -c 1 2>&1)
  status=$?
  echo "$out" | grep -E '^\[h1\] \[rank 0\] (#  +[0-9]| +[0-9])|Out of bounds|transport|braid-bench:|braid-launch:|launch_two_hosts|ibverbs: rank'
  [ "$status" -eq 0 ] || return 1
  if ! grep -q "ibverbs: rank 0 uses rxe0 port 1 GID index 0 .*on BRAID_IB_HCA=rxe0" <<<"$out" ||
    ! grep -q "ibverbs: rank 1 uses rxe1 port 1 GID index 0 .*on BRAID_IB_HCA=rxe1" <<<"$out"; then
    echo "# the ranks did not use their own host's rxe device"; return 1
  fi
  grep -q "braid-bench all_reduce: 2 ranks, transport ibverbs," <<<"$out" || { echo "# not run over ibverbs"; return 1; }
  grep -q '# Out of bounds values : 0 OK' <<<"$out" || { echo "# wrong values"; return 1; }
}

check "one rxe host" rxe_one_host
for coll in all_reduce send_recv; do
  check "braid-bench $coll, 2 ranks over ibverbs, no wrong value" bench_one_host "$coll"
done
check "BRAID_IB_GID_INDEX=1: both ranks fail at set-up naming the index and the remedy" wrong_gid
check "rxe_reset, then two hosts h1 and h2" eval 'rxe_reset && rxe_two_hosts h1 h2'
check "braid-bench all_reduce, one rank on each of two hosts over ibverbs, no wrong value" bench_two_hosts
finish
