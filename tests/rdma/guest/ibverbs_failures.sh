#!/bin/bash
# Guest script (runs inside the VM, see scripts/rdma_vm/guest_lib.sh): how
# braid's ibverbs transport fails across the two hosts of rxe_two_hosts
# (BRAID_TRANSPORT=ibverbs, BRAID_TIMEOUT=20). Each failure must be a named
# error on every rank, well within the timeout (no hang, no TimeoutError),
# and leave nothing behind: no braid process, no /dev/shm/braid* file.
#  - mismatched collectives: rank 0 all_reduce of N elements, the others of
#    N + 1 (small, and 1 Mi elements: the large-message path), and rank 0
#    all_reduce against all_gather on 2+1 ranks: every rank fails with
#    "mismatched collectives" (braid-check --expect-mismatch);
#  - a rank that fails before it publishes its connection data (a GID
#    index its device does not have, on one host): its peer names it;
#  - a wrong BRAID_IB_GID_INDEX: each RDMA wire end also gets an IPv4
#    address, so GID index 1 exists on both hosts (::ffff:10.12.0.x, RoCE
#    v2) but does not route between them (both rxe netdevs live in the
#    initial namespace: a packet to the other, local, address goes through
#    lo, where no rxe device listens; as a GID on a network that does not
#    reach the peer; braid's default choice prefers it too). With index 1 on
#    both hosts, and 0 (link-local) on h1 against 1 on h2, every rank fails
#    at set-up naming the device, the GID index and the remedy;
#  - the wire fails mid-collective while braid-bench loops (1 MiB messages):
#    `ip link set down` on one end of the veth (both rxe ports go down: a
#    pulled cable; 1+1 all_reduce, 2+2 all_gather), and, with both ports up,
#    a wire that drops every packet (netem loss 100%: a failed switch; only
#    the transport's retries can tell; 1+1 all_reduce, 2+2 all_gather).
#    Every rank names the port error or the peer that stopped answering;
#  - the wire goes down while the transport is only polled (rdma-polled: the
#    communicator blocked on shared memory to a local peer gives it turns),
#    with a receive from the other host posted and with none: every rank
#    names the port error (or, waiting, the silent peer) within the bound;
#  - a device that breaks what the keepalive leans on (faults.cc,
#    LD_PRELOAD): its port events lost (the wire down under rdma-polled, no
#    receive posted: every rank reads its port's state and names it), and
#    its writes retried forever (every packet dropped mid all_reduce: every
#    rank names the peer whose writes stalled, at half of BRAID_TIMEOUT);
#    and a peer that is slow, not silent (SIGSTOPped for 12 s mid
#    all_reduce, its device still answering) is not taken for a stalled
#    one: the job ends well;
#  - Communicator::abort from a thread of rank 0 while its all_reduce sleeps
#    in the RDMA transport (rdma-abort): the call is cut short within 2 s
#    naming the reason, and rank 1, joining later, names rank 0's abort.
# With 3 ranks, the rank that finds a mismatch may have sent nothing to the
# others yet, and the store that carries its reason may have been its own:
# its farewell (transport.h) still tells every peer why, and they name the
# mismatch too.
# A rank SIGKILLed mid all_reduce is ibverbs_peer_killed.sh.
# $1: the build folder holding tools/braid-bench and tools/check/braid-check.
build=${1:?usage: ibverbs_failures.sh BUILD_VM_DIR}
bench=$build/tools/braid-bench check=$build/tools/check/braid-check
polled=$build/tests/rdma/programs/rdma-polled
late_qp=$build/tests/rdma/programs/librdma-late-qp.so
faults=$build/tests/rdma/programs/librdma-faults.so
busy=$build/tests/rdma/programs/rdma-busy
abort_program=$build/tests/rdma/programs/rdma-abort

export BRAID_TRANSPORT=ibverbs BRAID_TIMEOUT=20
# Every failure below is named in 1-10 s in TCG (set-up ones include
# starting the job); the bound stays below BRAID_TIMEOUT so that a failure
# found only by a timeout fails the check.
bound_ms=18000

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Runs LAYOUT's job to its end and prints its output without info lines;
# job_out holds it, job_status launch_ranks' status. Fails unless the job
# ended within bound_ms and left nothing behind.
job() { # LAYOUT -- PROGRAM ARG...
  local layout=$1 start took
  shift
  start=$(now_ms)
  job_out=$(launch_ranks "$layout" 40 "$@" 2>&1)
  job_status=$?
  took=$(($(now_ms) - start))
  grep -v '\[info\]' <<<"$job_out"
  echo "# job took ${took} ms"
  [ "$took" -lt "$bound_ms" ] || { echo "# not within ${bound_ms} ms"; return 1; }
  no_leftovers
}

# Every rank of LAYOUT printed a line matching PATTERN (ERE).
every_rank_says() { # LAYOUT PATTERN
  local spec ranks=0 r
  for spec in $1; do ranks=$((ranks + ${spec#*:})); done
  for ((r = 0; r < ranks; r++)); do
    grep -qE "\[rank $r\] .*$2" <<<"$job_out" || { echo "# rank $r did not say: $2"; return 1; }
  done
}

# A rank that quotes a peer blaming it ("rank N did not answer RDMA", in
# rank N's own output) says that it still runs, so the network is at fault.
no_rank_blames_itself_bare() { # LAYOUT
  local spec ranks=0 r
  for spec in $1; do ranks=$((ranks + ${spec#*:})); done
  for ((r = 0; r < ranks; r++)); do
    if grep -E "\[rank $r\] .*: rank $r did not answer RDMA" <<<"$job_out" | grep -qv "rank $r, this rank, still runs"; then
      echo "# rank $r quotes its own silence without saying that it still runs"
      return 1
    fi
  done
}

# A job whose rank 0 creates its queue pairs 4 s after its peers (late_qp.cc,
# LD_PRELOAD), 2+2 with shared memory inside each host: a peer proved its
# path to a rank whose queue pair to it was not up yet (that rank brought it
# up only once it had rank 0's data), and every rank failed, told to set
# BRAID_IB_GID_INDEX.
late_queue_pairs() { # LAYOUT
  job "$1" -- env BRAID_TRANSPORT=auto LD_PRELOAD="$late_qp" BRAID_TEST_LATE_QP_RANK=0 BRAID_TEST_LATE_QP_MS=4000 \
    "$bench" --memcpy_bytes 0 -b 8 -e 64K -f 64 -n 2 -w 0 -c 1 || return 1
  [ "$job_status" -eq 0 ] || { echo "# the job failed"; return 1; }
  grep -q '# Out of bounds values : 0 OK' <<<"$job_out" || { echo "# wrong values"; return 1; }
}

# Rank 3 alone with two queue pairs per peer (2+2, shm inside each host):
# ranks 0, 1 and 3 refuse each other's connection data, and rank 2, whose
# peers 0 and 1 fail before their queue pairs come up, must not wait for
# them until BRAID_TIMEOUT.
qps_differ() { # LAYOUT
  # shellcheck disable=SC2016 # expanded by the wrapper, in each rank
  job "$1" -- bash -c 'export BRAID_IB_QPS_PER_PEER=$([ "$RANK" = 3 ] && echo 2 || echo 1); exec "$@"' wrapper \
    env BRAID_TRANSPORT=auto "$bench" -b 8 -e 8 -n 1 -w 0 || return 1
  [ "$job_status" -ne 0 ] || { echo "# the job succeeded"; return 1; }
  every_rank_says "$1" "braid-bench: rank [0-9]+.*BRAID_IB_QPS_PER_PEER"
}

# rdma-busy (3 ranks on one host): rank 2 dies while rank 0 waits on it
# and streams to rank 1. The keepalive probing rank 2 ran only while
# nothing moved with any peer: rank 2 was named once the stream stopped.
dead_peer_while_busy() { # LAYOUT
  local took
  job "$1" -- "$busy" 15 || return 1
  took=$(grep -oE 'rdma-busy: rank 0 failed after [0-9.]+ s: .*rank 2' <<<"$job_out" | grep -oE '[0-9]+\.[0-9]+' | head -1)
  [ -n "$took" ] || { echo "# rank 0 did not name rank 2"; return 1; }
  [ "${took%.*}" -lt 6 ] || { echo "# rank 0 named rank 2 only after ${took} s"; return 1; }
}

# rdma-abort (1+1): each rank checks its own error and says ok.
abort_mid_call() { # LAYOUT
  job "$1" -- "$abort_program" 4 || return 1
  [ "$job_status" -eq 0 ] || { echo "# a rank's error was not what it should be"; return 1; }
  every_rank_says "$1" "rdma-abort: rank [01]: ok: "
}

# BRAID_IB_GID_INDEX=3 on h2 only, which its device does not have: rank 1
# fails before it publishes its connection data, and rank 0, waiting for
# that data, hears of the failure within the bound, not at BRAID_TIMEOUT.
early_failure() { # LAYOUT
  # shellcheck disable=SC2016 # expanded by the wrapper, in each rank
  job "$1" -- bash -c 'export BRAID_IB_GID_INDEX=$([ "$BRAID_HOST_ID" = h2 ] && echo 3 || echo 0); exec "$@"' \
    wrapper "$bench" -b 8 -e 8 -n 1 -w 0 || return 1
  [ "$job_status" -ne 0 ] || { echo "# the job succeeded"; return 1; }
  every_rank_says "$1" "braid-bench: rank [0-9]+.*BRAID_IB_GID_INDEX=3"
}

# Every rank's call fails with one of braid's errors (braid-check exits 0
# when it names the mismatch, 1 for another error), and the mismatch is
# named; every_rank_says "$mismatched" then asks it of every rank.
mismatched="failed as expected: .*mismatched collectives: rank [0-9]+ called"
mismatch() { # LAYOUT BRAID_CHECK_ARG...
  local layout=$1
  shift
  job "$layout" -- "$check" "$@" || return 1
  every_rank_says "$layout" "braid-check: rank [0-9]+: .* failed( as expected|, but not naming the mismatch): rank [0-9]+" \
    || return 1
  grep -qE "$mismatched" <<<"$job_out" || { echo "# no rank named the mismatch"; return 1; }
}

wrong_gid() { # LAYOUT PROGRAM ARG... (a wrapper that sets BRAID_IB_GID_INDEX)
  job "$1" -- "${@:2}" || return 1
  [ "$job_status" -ne 0 ] || { echo "# the job succeeded"; return 1; }
  every_rank_says "$1" "braid-bench: rank [0-9]+.*rxe[01] port 1 GID index [01].*BRAID_IB_GID_INDEX.*BRAID_TRANSPORT=tcp"
}

# Starts braid-bench looping over LAYOUT, runs BREAK once rank 0 printed its
# first row, and expects every rank to fail naming the cause. The ranks run
# under ${wrap[@]} (break_wire_with sets it).
wrap=()
break_wire() { # LAYOUT COLLECTIVE PATTERN BREAK... (PATTERN: what every rank's error says)
  local layout=$1 coll=$2 pattern=$3
  shift 3
  run_and_break "$layout" '^ +[0-9]' "braid-bench: rank [0-9]+.*($pattern)" \
    "${wrap[@]}" "$bench" --memcpy_bytes 0 --coll "$coll" -b 1M -e 1M -n 10 -w 0 -c 1 -N 0 -T 20 -- "$@"
}

# break_wire on a device with FAULT (faults.cc).
break_wire_with() { # FAULT LAYOUT COLLECTIVE PATTERN BREAK...
  local -a wrap=(env LD_PRELOAD="$faults" BRAID_TEST_RDMA_FAULT="$1")
  shift
  break_wire "$@"
}

# The same with rdma-polled (1+1): the transport only polled, as while the
# communicator blocks on shared memory to a local peer, when the wire breaks.
break_polled() { # PATTERN MODE BREAK... (MODE: waiting; idle: no receive posted; idle-no-events: and the device's port events lost)
  local pattern=$1
  local -a program=("$polled" 15)
  case $2 in
    idle) program+=(idle) ;;
    idle-no-events) program=(env LD_PRELOAD="$faults" BRAID_TEST_RDMA_FAULT=lose_events "${program[@]}" idle) ;;
  esac
  shift 2
  run_and_break "h1:1 h2:1" '^polling' "rdma-polled: rank [0-9]+: .*($pattern)" "${program[@]}" -- "$@"
}

# Starts PROGRAM over LAYOUT, runs BREAK once rank 0's output has a line
# matching READY (ERE), and expects every rank to fail within bound_ms with
# a line matching SAYS, leaving nothing behind. SAYS empty: the job must
# instead end well (status 0, no wrong value) after BREAK returned.
run_and_break() { # LAYOUT READY SAYS PROGRAM ARG... -- BREAK...
  local layout=$1 ready=$2 says=$3 logs pid start took status i clean
  local -a program=()
  shift 3
  while [ "$1" != -- ]; do program+=("$1"); shift; done
  shift
  logs=$(mktemp -d)
  RDMA_VM_LAUNCH_LOGS=$logs launch_ranks "$layout" 60 -- "${program[@]}" >"$logs/all" 2>&1 &
  pid=$!
  for ((i = 0; i < 300; i++)); do
    grep -qE "$ready" "$logs/0" 2>/dev/null && break
    sleep 0.1
  done
  grep -qE "$ready" "$logs/0" || { echo "# the job did not start looping"; wait "$pid"; cat "$logs/all"; rm -rf "$logs"; return 1; }
  start=$(now_ms)
  echo "# breaking the wire at $(date +%T.%3N) (the ranks' clock): $*"
  if ! "$@"; then
    echo "# could not break the wire; stopping the job"
    pkill -TERM -P "$pid"; wait "$pid"; rm -rf "$logs"; return 1
  fi
  wait "$pid"; status=$?
  took=$(($(now_ms) - start))
  job_out=$(grep -vE '\[info\]|^\[h[12]\] \[rank 0\] ( +[0-9]|#)' "$logs/all")
  clean=$(grep -c "# Out of bounds values : 0 OK" "$logs/all")
  rm -rf "$logs"
  echo "$job_out"
  echo "# every rank ended ${took} ms after the break, status $status"
  if [ -z "$says" ]; then
    if [ "$status" -ne 0 ] || [ "$clean" -ne 1 ]; then echo "# the job did not end well"; return 1; fi
  else
    [ "$status" -ne 0 ] || return 1
    [ "$took" -lt "$bound_ms" ] || { echo "# not within ${bound_ms} ms"; return 1; }
    every_rank_says "$layout" "$says" || return 1
  fi
  no_leftovers
}

# What a rank that lost its wire must say: the port went down, or the peer
# stopped answering (any other error names the device at least).
down="got RDMA event 'port error' on rxe[01] port 1|this rank's port is [A-Za-z_]+: its link went down|did not answer RDMA \(retries exhausted\)"

# Rank 1 of LAYOUT SIGSTOPped for 12 s mid all_reduce, past half of
# BRAID_TIMEOUT (20 s): soft-RoCE acknowledges its writes in the kernel, so
# the keepalives of the ranks waiting on it complete, and the write
# watchdog (transport.h: a write outstanding and nothing heard for half of
# BRAID_TIMEOUT) leaves it alone. The job must end well, after the pause.
paused_peer() { # LAYOUT
  # Line-buffered: rank 0's first row (of 3) says that the loop runs.
  run_and_break "$1" '^ +[0-9]' "" \
    stdbuf -oL "$bench" --memcpy_bytes 0 --coll all_reduce -b 1M -e 1M -n 20 -w 0 -c 1 -N 3 -T 20 -- pause_rank 1 12
}

# SIGSTOPs rank RANK's braid-bench for SECONDS, then lets it go on.
pause_rank() { # RANK SECONDS
  local p
  for p in $(pgrep -x braid-bench); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$1" || continue
    echo "# rank $1 (pid $p) stopped for $2 s"
    kill -STOP "$p" && sleep "$2" && kill -CONT "$p"
    return
  done
  echo "# rank $1's braid-bench not found"
  return 1
}

wire_up() { # brings both ends of the RDMA wire back, without loss
  local i
  tc qdisc del dev rxe-h2 root 2>/dev/null
  ip link set rxe-h1 up && ip link set rxe-h2 up && rxe_wait_gid rxe0 0 && rxe_wait_gid rxe1 0 || return 1
  for ((i = 0; i < 50; i++)); do
    [ "$(rdma link show | grep -c 'state ACTIVE')" -eq 2 ] && return 0
    sleep 0.1
  done
  echo "# the rxe ports did not come back: $(rdma link show)"; return 1
}


check "two hosts h1 and h2" rxe_two_hosts h1 h2
check "rank 0's queue pairs come up 4 s after its peers' (2+2, shm inside each host): the job sets up and runs" \
  late_queue_pairs "h1:2 h2:2"
check "a dead peer waited on while data flows to another (3 ranks, one host): named within 6 s" \
  dead_peer_while_busy "h1:3"
check "Communicator::abort while the running call sleeps in the RDMA transport (1+1): cut short within 2 s, the peer names the abort" \
  abort_mid_call "h1:1 h2:1"
check "BRAID_IB_QPS_PER_PEER=2 on rank 3 only (2+2): every rank fails at set-up within the bound naming it" \
  qps_differ "h1:2 h2:2"
check "BRAID_IB_GID_INDEX=3 on h2 only (1+1): rank 1 fails before it publishes its connection data, rank 0 names it within the bound" \
  early_failure "h1:1 h2:1"
for args in "h1:1 h2:1|count|1000" "h1:1 h2:1|count|1048576" "h1:2 h2:1|kind|1000"; do
  IFS='|' read -r layout what count <<<"$args"
  check "mismatched $what (count $count), ranks $layout: every rank fails with a named error, the mismatch named" \
    mismatch "$layout" --expect-mismatch "$what" --mismatch-count "$count"
  check "... and every rank names the mismatch" every_rank_says "$layout" "$mismatched"
done

check "IPv4 addresses on the RDMA wire: GID index 1 on both hosts" eval \
  'ip addr add 10.12.0.1/24 dev rxe-h1 && ip addr add 10.12.0.2/24 dev rxe-h2 && rxe_wait_gid rxe0 1 && rxe_wait_gid rxe1 1'
check "BRAID_IB_GID_INDEX=1 (does not route) on both hosts: every rank fails at set-up naming it" \
  wrong_gid "h1:1 h2:1" env BRAID_IB_GID_INDEX=1 "$bench" -b 8 -e 8 -n 1 -w 0
# shellcheck disable=SC2016 # expanded by the wrapper, in each rank
check "BRAID_IB_GID_INDEX=0 on h1 (link-local), 1 on h2 (IPv4): every rank fails at set-up naming it" \
  wrong_gid "h1:1 h2:1" bash -c 'export BRAID_IB_GID_INDEX=$([ "$BRAID_HOST_ID" = h2 ] && echo 1 || echo 0); exec "$@"' \
  wrapper "$bench" -b 8 -e 8 -n 1 -w 0
check "IPv4 addresses removed" eval 'ip addr del 10.12.0.1/24 dev rxe-h1 && ip addr del 10.12.0.2/24 dev rxe-h2'

check "wire down mid all_reduce (1+1): every rank fails within the bound naming its device" \
  break_wire "h1:1 h2:1" all_reduce "rxe[01]" ip link set rxe-h2 down
check "... and every rank names the port error or the silent peer" every_rank_says "h1:1 h2:1" "$down"
check "wire back up" wire_up
check "wire down mid all_gather (2+2): every rank fails within the bound naming its device" \
  break_wire "h1:2 h2:2" all_gather "rxe[01]" ip link set rxe-h1 down
check "... and every rank names the port error or the silent peer" every_rank_says "h1:2 h2:2" "$down"
check "wire back up" wire_up
check "wire down while the transport is only polled (1+1): every rank names the port error or the silent peer" \
  break_polled "$down" waiting ip link set rxe-h1 down
check "wire back up" wire_up
# The event, or the port's state where a probe read it first (the state
# changes a moment before the event is queued).
check "wire down while the transport is only polled, no receive posted (1+1): every rank names the port error" \
  break_polled "got RDMA event 'port error' on rxe[01] port 1|rxe[01] port 1 while waiting: this rank's port is down" \
  idle ip link set rxe-h1 down
check "wire back up" wire_up
check "the same, the device's port events lost: every rank reads its port's state and names it" \
  break_polled "read the state of rxe[01] port 1 while waiting: this rank's port is [A-Za-z_]+: its link went down" \
  idle-no-events ip link set rxe-h1 down
check "wire back up" wire_up
check "wire drops every packet mid all_reduce (1+1, ports up: a failed switch): every rank names the silent peer" \
  break_wire "h1:1 h2:1" all_reduce "rank [01] did not answer RDMA \(retries exhausted\)" \
  eval 'modprobe sch_netem && tc qdisc add dev rxe-h2 root netem loss 100%'
check "wire back up" wire_up
check "the same, the device retrying each write forever: every rank names the peer whose writes stalled" \
  break_wire_with retry_forever "h1:1 h2:1" all_reduce "rank [01] did not answer RDMA \(a write to it outstanding, no completion or data from it for" \
  eval 'tc qdisc add dev rxe-h2 root netem loss 100%'
check "wire back up" wire_up
check "a peer stopped for 12 s mid all_reduce (1+1, its device answering): not taken for a stalled one, the job ends well" \
  paused_peer "h1:1 h2:1"
# 2+2: each rank meets the silence on its own RDMA peer (a write of its own
# or a keepalive, also while it waits on its local peer over shared memory),
# or is told by a local peer that did ("... told rank N why: ...").
check "wire drops every packet mid all_gather (2+2, ports up): every rank names the silent peer" \
  break_wire "h1:2 h2:2" all_gather "rank [0-3] did not answer RDMA \(retries exhausted\)" \
  eval 'tc qdisc add dev rxe-h2 root netem loss 100%'
check "... and a rank told that it did not answer says that it still runs" no_rank_blames_itself_bare "h1:2 h2:2"
finish
