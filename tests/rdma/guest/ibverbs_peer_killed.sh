#!/bin/bash
# Guest script (runs inside the VM, see scripts/rdma_vm/guest_lib.sh): a
# peer SIGKILLed mid-run on the ibverbs transport (BRAID_TRANSPORT=ibverbs,
# one rxe host). soft-RoCE drops packets to the dead rank's destroyed queue
# pair without a word, so the survivor, blocked on the dead peer's data or
# credits, learns of it only from a write of its own: one still pending
# (data, credits) or else the transport's keepalive
# (comm/transport/ibverbs/transport.h). That write runs out of retries
# (6: rxe retries forever at 7) and the survivor fails with a RemoteError naming
# rank 1, "did not answer RDMA (retries exhausted)", within the keepalive
# interval plus the queue pair's 7 tries (about 2 s in all), far below
# BRAID_TIMEOUT (20 s), not with a TimeoutError at 20 s.
# Four ways to be blocked: small messages (recursive doubling) and 1 MiB
# ones (ring, several pieces per message, so sends wait for credits), each
# with nonblocking and blocking collectives (braid-bench -z).
# $1: the build folder holding tools/braid-launch and tools/braid-bench.
build=${1:?usage: ibverbs_peer_killed.sh BUILD_VM_DIR}
launch=$build/tools/braid-launch bench=$build/tools/braid-bench

export BRAID_TRANSPORT=ibverbs BRAID_TIMEOUT=20
# Measured in this VM (TCG): node 0's launcher ends 2.8-5.1 s after the kill
# (48 kills; the retries take ~1.9 s, then the keepalive's interval, the
# transport's drain and the launcher's own exit). The bound leaves room for
# a slow emulated CPU and stays well below 20 s.
bound_ms=12000
log=$RDMA_VM_WORKDIR/peer_killed
mkdir -p "$log"

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Two braid-launch nodes on this host (one rank each) so that node 0's
# launcher does not stop its rank when rank 1 dies: rank 0 must find out
# from the transport. braid-bench loops all_reduce (-N 0, -T 20) until
# rank 1 is SIGKILLed once rank 0 has printed its first row.
peer_killed() { # BENCH_ARG...
  local port=29531 p0 p1 pid1 i start took status0 status1 ranks="$log/run"
  mkdir -p "$ranks"; rm -f "$ranks"/*
  local token; token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  local common=(--nproc-per-node 1 --nnodes 2 --master-addr 127.0.0.1 --master-port "$port")
  # the rank records its pid, then becomes braid-bench ($$ expands there)
  # shellcheck disable=SC2016
  local rank_cmd=(bash -c 'echo $$ > "$0.$BRAID_RANK"; exec "$@"' "$ranks/pid"
    "$bench" --memcpy_bytes 0 "$@" -N 0 -T 20)
  BRAID_JOB_TOKEN=$token bounded 50 "$launch" "${common[@]}" --node-rank 0 -- "${rank_cmd[@]}" >"$ranks/node0" 2>&1 &
  p0=$!
  wait_tcp_port "" "$port" 20
  BRAID_JOB_TOKEN=$token bounded 50 "$launch" "${common[@]}" --node-rank 1 -- "${rank_cmd[@]}" >"$ranks/node1" 2>&1 &
  p1=$!
  for ((i = 0; i < 300; i++)); do
    grep -q '^\[rank 0\] \+[0-9]' "$ranks/node0" 2>/dev/null && break
    kill -0 "$p0" 2>/dev/null || break
    sleep 0.1
  done
  pid1=$(cat "$ranks/pid.1" 2>/dev/null)
  if ! grep -q '^\[rank 0\] \+[0-9]' "$ranks/node0" || [ -z "$pid1" ]; then
    echo "# the job did not start running all_reduce"; kill "$p0" "$p1" 2>/dev/null; wait "$p0" "$p1"
    sed 's/^/  node0: /' "$ranks/node0"; sed 's/^/  node1: /' "$ranks/node1"; return 1
  fi
  start=$(now_ms)
  echo "# killing rank 1 (pid $pid1) with SIGKILL at $(date +%T.%3N) (the ranks' clock)"
  kill -KILL "$pid1"
  wait "$p0"; status0=$?
  took=$(($(now_ms) - start))
  wait "$p1"; status1=$?
  grep -v '^\[rank 0\] \+[0-9]' "$ranks/node0" | grep -v '^\[rank 0\] #' | sed 's/^/  node0: /'
  sed 's/^/  node1: /' "$ranks/node1"
  echo "# node 0 (survivor) status $status0 after ${took} ms; node 1 status $status1"
  if [ "$status0" -eq 0 ] || [ "$status0" -eq 124 ] || [ "$status0" -eq 137 ]; then
    echo "# survivor did not fail by itself"; return 1
  fi
  [ "$took" -lt "$bound_ms" ] || { echo "# survivor took ${took} ms: not well within BRAID_TIMEOUT (20 s)"; return 1; }
  # A write into the ring or a keepalive runs out of retries; a direct write
  # of a large message may instead meet the dead rank's registrations gone.
  grep -qE 'braid-bench: rank 0.* with rank 1 failed: (transport retry counter exceeded .* on rxe0 port 1 GID index 0: rank 1 did not answer RDMA \(retries exhausted\): it exited, crashed or its link is down; .*BRAID_TRANSPORT=tcp|remote access error .* on rxe0 port 1 GID index 0: rank 1 no longer holds the buffer it offered for this message: it exited or crashed .*see rank 1.s own output)' "$ranks/node0" \
    || { echo "# survivor's error is not the transport's RemoteError naming rank 1, the device and the remedy"; return 1; }
}

check "one rxe host" rxe_one_host
check "small messages, nonblocking: rank 1 killed, rank 0 names it within ${bound_ms} ms" \
  peer_killed -b 8 -e 64K -f 8 -n 10 -w 0 -c 1
check "1 MiB messages, nonblocking: rank 1 killed, rank 0 names it within ${bound_ms} ms" \
  peer_killed -b 1M -e 1M -n 10 -w 0 -c 1
check "small messages, blocking: rank 1 killed, rank 0 names it within ${bound_ms} ms" \
  peer_killed -b 8 -e 64K -f 8 -n 10 -w 0 -c 1 -z 1
check "1 MiB messages, blocking: rank 1 killed, rank 0 names it within ${bound_ms} ms" \
  peer_killed -b 1M -e 1M -n 10 -w 0 -c 1 -z 1
finish
