#!/bin/bash
# Guest script (runs inside the VM, see scripts/rdma_vm/guest_lib.sh): the
# collective grid over real verbs, across the two hosts of rxe_two_hosts.
# braid-check (tools/check/) runs every collective (all_reduce,
# reduce_scatter, all_gather, broadcast, reduce, all_to_all, send/recv,
# barrier) x f32, bf16, i64 x sum, max, avg (where they reduce) x counts 0,
# 1, 97 (a prime) and 1025 (divisible by none of 2, 3, 4) x out of place and
# in place, roots taking turns, then each collective once in and once out
# of place at a large count (the dtype and op taking turns), and checks
# every element against an expectation it computes without braid; the
# barrier is checked to hold every rank back until all arrived (marks in a
# shared folder). Rank layouts over the two hosts (launch_ranks): 1+1 and
# 2+1 with large count 1 Mi (4 MiB of f32, 8 MiB of i64), 2+2 with 512 Ki
# and buffers from Communicator::allocate (registered memory). Large
# messages dominate the time in TCG (~1 s per case on 4 ranks): the whole
# script takes ~90 s.
#
# Transports: BRAID_TRANSPORT=ibverbs puts every peer on RDMA, within a host
# too (the ranks of one host share its rxe device); braid-check refuses to
# run the grid unless every peer is on ibverbs (--expect-transport).
# Under BRAID_TRANSPORT=auto braid must pick shm within a host and ibverbs
# between hosts (both have a usable rxe device), and say so in its info
# log: the 2+2 grid runs under auto too, with both checked (grid_auto=0
# leaves it out).
# $1: the build folder holding tools/check/braid-check.
build=${1:?usage: ibverbs_grid.sh BUILD_VM_DIR}
check=$build/tools/check/braid-check
grid_auto=1

export BRAID_TIMEOUT=30
grid_args=(--counts "0,1,97,1025")

# The ranks of each host in LAYOUT ("h1:2 h2:1"), host by host.
ranks_of() { # LAYOUT HOST
  local spec rank=0 i list=""
  for spec in $1; do
    for ((i = 0; i < ${spec#*:}; i++, rank++)); do
      [ "${spec%%:*}" = "$2" ] && list+="${list:+,}$rank"
    done
  done
  echo "${list:-none}"
}

# Under auto, each rank's info line must put its own host's other ranks on
# shm and the other host's on ibverbs, none on tcp.
auto_logged() { # LAYOUT OUTPUT
  local spec host other rank=0 i line mine
  for spec in $1; do
    host=${spec%%:*}
    other=$(for s in $1; do [ "${s%%:*}" != "$host" ] && echo "${s%%:*}"; done)
    for ((i = 0; i < ${spec#*:}; i++, rank++)); do
      line=$(grep -m1 "^\[$host\] \[rank $rank\] .*rank $rank/[0-9]* on host .*shm to ranks" <<<"$2")
      mine=$(ranks_of "$1" "$host" | tr ',' '\n' | grep -vx "$rank" | paste -sd, -)
      if ! grep -q "shm to ranks ${mine:-none};" <<<"$line" || ! grep -q "tcp to ranks none " <<<"$line" ||
        ! grep -q "ibverbs to ranks $(ranks_of "$1" "$other");" <<<"$line"; then
        echo "# rank $rank's info log does not say shm to ${mine:-none}, ibverbs to $(ranks_of "$1" "$other"): $line"
        return 1
      fi
    done
  done
}

grid() { # TRANSPORT LAYOUT [BRAID_CHECK_ARG...]
  local transport=$1 layout=$2 out status dir ranks=0 spec start=$SECONDS
  shift 2
  for spec in $layout; do ranks=$((ranks + ${spec#*:})); done
  dir=$(mktemp -d)
  out=$(BRAID_TRANSPORT=$transport BRAID_TIMEOUT=${grid_timeout:-30} BRAID_LOG_LEVEL=info launch_ranks "$layout" 150 -- \
    "$check" "${grid_args[@]}" --barrier-dir "$dir" --expect-transport "$transport" "$@" 2>&1)
  status=$?
  rm -rf "$dir"
  grep -E 'braid-check|launch_ranks|rror|WRONG' <<<"$out" | grep -v '\[info\]'
  echo "# the grid took $((SECONDS - start)) s"
  [ "$status" -eq 0 ] || return 1
  [ "$(grep -c 'braid-check: rank [0-9]*: [0-9]* cases, 0 wrong' <<<"$out")" -eq "$ranks" ] \
    || { echo "# not every rank reported a clean grid"; return 1; }
  if [ "$transport" = auto ]; then
    grep -o '\[rank [0-9]*\] .*: rank [0-9]*/[0-9]* on host .*' <<<"$out" | sed 's/^/  /'
    auto_logged "$layout" "$out" || return 1
  fi
  no_leftovers
}

check "two hosts h1 and h2" rxe_two_hosts h1 h2
check "grid over ibverbs, 2 ranks (1 on h1, 1 on h2), every element right" \
  grid ibverbs "h1:1 h2:1" --large 1048576
check "grid over ibverbs, 3 ranks (2 on h1, 1 on h2), every element right" \
  grid ibverbs "h1:2 h2:1" --large 1048576
# reduce_scatter on 4 ranks once deadlocked here (b862c46: every send waited
# for its receiver's clear-to-send while the out-of-place ring waited for its
# sends before posting its receives); senders no longer wait for one.
check "grid over ibverbs, 4 ranks (2 on h1, 2 on h2), registered buffers, every element right" \
  grid ibverbs "h1:2 h2:2" --large 524288 --registered
if [ "$grid_auto" = 1 ]; then
  check "grid under auto, 4 ranks (2+2): shm within a host, ibverbs between, every element right" \
    grid auto "h1:2 h2:2" --large 524288
else
  echo "# grid under BRAID_TRANSPORT=auto left out (grid_auto=0)"
fi
finish
