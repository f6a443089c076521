#!/bin/bash
# Guest script of scripts/rdma_targets.sh (runs inside the VM, see
# scripts/rdma_vm/guest_lib.sh): measures issue 15's two targets on the two
# rxe hosts of rxe_two_hosts, braid and the verbs tools on the same devices
# (rxe0 on h1, rxe1 on h2, GID index 0) and the same sizes, one after the
# other in this one run, and prints the ratios:
#  - bandwidth: braid-bench all_gather busbw over ibverbs (one rank per
#    host, out of place) against ib_write_bw's average bandwidth (perftest:
#    one RC queue pair, h2 writing to h1) at 4, 8 and 16 MiB; target >= 0.8.
#    ib_write_bw's MB/sec are MiB/s (perftest divides by 0x100000); both are
#    shown in GB/s (1e9 B/s), busbw as nccl-tests defines it. An all_gather
#    moves data both ways at once, so ib_write_bw -b (both ends writing at
#    once; perftest reports the sum of the two directions, halved here) is
#    shown beside it as the like-for-like reference: in this VM the "wire"
#    is the emulated CPU, which both directions share, so one direction of a
#    bidirectional run gets far less than a unidirectional run (on a real
#    full-duplex link the two are the same).
#  - latency: braid-bench's time per 8-byte all_reduce on the 2 ranks
#    (nccl-tests style: -n calls back to back, out of place) against
#    ibv_rc_pingpong -s 8's usec/iter, which is one round trip (each
#    iteration sends one message each way and waits for the other's);
#    target <= 1.0 x the round trip. One exchange is half a round trip, so
#    the ratio to half the round trip is shown too, and the blocking
#    all_reduce (-z 1: each call waited for before the next) as well, and
#    the transport alone (tests/rdma/programs/exchange.cc: the 8-byte
#    exchange a 2-rank all_reduce makes, and a ping-pong round trip, with
#    no communicator above), which tells the wire's share from the layers';
#    in the same process right after, the same exchange as a communicator's
#    all_reduce and a 1-rank all_reduce (the layers alone, no wire). And
#    the time inside the transport's posting call during an exchange:
#    soft-RoCE does a message's whole protocol path (the peer's receive and
#    the acknowledgement too) inside the sender's post system call, so on
#    the VM's 2 CPUs a 2-rank exchange, both ranks posting at once, takes at
#    least one post. ibv_rc_pingpong's round trip is about one post too (the
#    answer is posted as soon as the message lands, halfway through the
#    sender's post), so "<= 1.0 x the round trip" is this floor exactly.
# Every measurement is taken ROUNDS times, interleaved, and the medians
# are compared (TCG's speed follows the load of the machine running it).
# $1: the build folder holding tools/braid-launch and tools/braid-bench;
# $2: ROUNDS (default 3).
# Exit status 0 when every measurement ran (targets met or not).
build=${1:?usage: targets_guest.sh BUILD_VM_DIR [ROUNDS]}
repeats=${2:-3}
launch=$build/tools/braid-launch bench=$build/tools/braid-bench
sizes=(4194304 8388608 16777216)

export BRAID_TRANSPORT=ibverbs BRAID_TIMEOUT=60
fail() { echo "rdma_targets: $*" >&2; exit 1; }

rxe_two_hosts h1 h2 || fail "could not set up the two rxe hosts"

# ib_write_bw at SIZE from h2 (rxe1) to h1 (rxe0); prints its average in
# MiB/s. Under TCG its closing exchange over TCP sometimes fails ("Failed to
# exchange data between server and clients"): up to 5 tries.
write_bw() { # SIZE ITERS [-b]
  local _
  for _ in 1 2 3 4 5; do write_bw_once "$@" && return 0; done
  return 1
}

# Prints MiB/s per direction: with -b, half the sum perftest reports.
write_bw_once() { # SIZE ITERS [-b]
  local log spid out
  log=$(mktemp)
  ip netns exec h1 timeout -k 2 120 ib_write_bw -d rxe0 -x 0 -s "$1" -n "$2" ${3:-} >"$log" 2>&1 &
  spid=$!
  wait_tcp_port h1 18515 15 || { kill "$spid"; wait "$spid"; cat "$log" >&2; return 1; }
  out=$(ip netns exec h2 timeout -k 2 120 ib_write_bw -d rxe1 -x 0 -s "$1" -n "$2" ${3:-} "$(rxe_addr h1)" 2>&1)
  wait "$spid"
  rm -f "$log"
  awk -v s="$1" -v d="$([ "${3:-}" = -b ] && echo 2 || echo 1)" \
    '$1 == s && NF >= 4 { print $4 / d; found = 1 } END { exit !found }' <<<"$out" \
    || { echo "$out" >&2; return 1; }
}

# One braid-bench run across the hosts; prints its table rows (rank 0's).
bench_rows() { # BRAID_BENCH_ARG...
  local out
  out=$(launch_two_hosts "$launch" h1 h2 1 240 -- "$bench" "$@" 2>&1) || { echo "$out" >&2; return 1; }
  grep -E '^\[h1\] \[rank 0\] +[0-9]' <<<"$out" | sed 's/^\[h1\] \[rank 0\] *//'
}

# The microseconds rdma-exchange's rank 0 printed for LABEL ("LABEL: X us ...").
us_of() { # LABEL
  sed -n "s/.*\[rank 0\] $1: \([0-9.]*\) us.*/\1/p"
}

median() { # VALUE...
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# One round of every measurement; appends to the sample lists.
declare -A bw_mibs bidi_mibs busbw
rtts=() lat0=() lat1=() xchg=() xpp=() xcomm=() xone=() xpost=()
measure_round() {
  local size rows row mode pp rtt out
  for size in "${sizes[@]}"; do
    bw_mibs[$size]+=" $(write_bw "$size" 10)" || fail "ib_write_bw at $size B failed"
    bidi_mibs[$size]+=" $(write_bw "$size" 10 -b)" || fail "ib_write_bw -b at $size B failed"
  done
  rows=$(bench_rows --coll all_gather -b "${sizes[0]}" -e "${sizes[-1]}" -f 2 -n 5 -w 1 -c 0) \
    || fail "braid-bench all_gather failed"
  for size in "${sizes[@]}"; do
    row=$(awk -v s="$size" '$1 == s { print $9 }' <<<"$rows")
    [ -n "$row" ] || fail "no braid-bench row for $size B"
    busbw[$size]+=" $row"
  done
  pp=$(rxe_pingpong h1 h2 rxe0 rxe1 0 "$(rxe_addr h1)" -s 8 -n 1000) || { echo "$pp" >&2; fail "ibv_rc_pingpong failed"; }
  rtt=$(awk '/client: .* iters in .* usec\/iter/ { for (i = 1; i <= NF; i++) if ($i == "=") print $(i + 1) }' <<<"$pp")
  [ -n "$rtt" ] || fail "no usec/iter in ibv_rc_pingpong's output"
  rtts+=("$rtt")
  out=$(launch_two_hosts "$launch" h1 h2 1 240 -- "$build/tests/rdma/programs/rdma-exchange" 5000 2>&1) \
    || { echo "$out" >&2; fail "rdma-exchange failed"; }
  xchg+=("$(us_of 'exchange' <<<"$out")")
  xpp+=("$(us_of 'pingpong round trip' <<<"$out")")
  xcomm+=("$(us_of 'communicator all_reduce' <<<"$out")")
  xone+=("$(us_of '1-rank all_reduce' <<<"$out")")
  xpost+=("$(us_of "exchange's post call" <<<"$out")")
  for mode in 0 1; do
    row=$(bench_rows --coll all_reduce -b 8 -e 8 -n 1000 -w 50 -c 0 -z "$mode") || fail "braid-bench all_reduce failed"
    if [ "$mode" = 0 ]; then lat0+=("$(awk '{ print $7 }' <<<"$row")"); else lat1+=("$(awk '{ print $7 }' <<<"$row")"); fi
  done
}

echo "# rdma_targets: soft-RoCE in QEMU TCG, rxe0 (host h1) <-> rxe1 (host h2) over a veth wire, GID index 0"
echo "# braid: one rank per host, BRAID_TRANSPORT=ibverbs; $repeats rounds in this one run, each round"
echo "# every measurement once (interleaved, so the machine's load weighs on both sides alike); medians"
for ((round = 0; round < repeats; round++)); do measure_round; done
echo
echo "bandwidth: all_gather busbw (braid-bench -n 5, out of place) vs ib_write_bw average (-n 10), GB/s;"
echo "  bidi: ib_write_bw -b, per direction (both ends writing at once, as in an all_gather)"
printf '  %10s %9s %12s %7s %9s %7s   %s\n' "size (B)" "braid" "ib_write_bw" "ratio" "bidi" "ratio" \
  "samples (braid / ib_write_bw / bidi)"
for size in "${sizes[@]}"; do
  # shellcheck disable=SC2086 # the sample lists are space-separated on purpose
  b=$(median ${busbw[$size]}) m=$(median ${bw_mibs[$size]}) m2=$(median ${bidi_mibs[$size]})
  samples=$(for x in ${bw_mibs[$size]}; do awk -v m="$x" 'BEGIN { printf " %.4f", m * 1048576 / 1e9 }'; done)
  samples2=$(for x in ${bidi_mibs[$size]}; do awk -v m="$x" 'BEGIN { printf " %.4f", m * 1048576 / 1e9 }'; done)
  awk -v s="$size" -v b="$b" -v m="$m" -v m2="$m2" -v bs="${busbw[$size]}" -v ws="$samples" -v ws2="$samples2" 'BEGIN {
    w = m * 1048576 / 1e9; w2 = m2 * 1048576 / 1e9; r = b / w; r2 = b / w2
    printf "  %10d %9.4f %12.4f %7.2f %9.4f %7.2f   %s /%s /%s  (>= 0.8 x unidirectional: %s; x bidirectional: %s)\n", \
      s, b, w, r, w2, r2, bs, ws, ws2, (r >= 0.8 ? "met" : "missed"), (r2 >= 0.8 ? "met" : "missed") }'
done
echo
echo "latency: 8-byte all_reduce on 2 ranks vs ibv_rc_pingpong -s 8 round trip (usec/iter), us"
rtt=$(median "${rtts[@]}")
echo "  ibv_rc_pingpong round trip: $rtt (samples ${rtts[*]})"
for mode in 0 1; do
  if [ "$mode" = 0 ]; then t=$(median "${lat0[@]}") list="${lat0[*]}"; else t=$(median "${lat1[@]}") list="${lat1[*]}"; fi
  awk -v t="$t" -v rtt="$rtt" -v mode="$mode" -v list="$list" 'BEGIN {
    r = t / rtt
    printf "  %-38s %9.1f: ratio %.2f (target <= 1.0: %s), %.2f x half a round trip (samples %s)\n", \
      (mode ? "braid all_reduce, blocking (-z 1):" : "braid all_reduce (nccl-tests style):"), t, r, \
      (r <= 1.0 ? "met" : "missed"), t / (rtt / 2), list }'
done
x=$(median "${xchg[@]}") p=$(median "${xpp[@]}") c=$(median "${xcomm[@]}") o=$(median "${xone[@]}")
q=$(median "${xpost[@]}")
awk -v x="$x" -v p="$p" -v c="$c" -v o="$o" -v q="$q" -v rtt="$rtt" -v xs="${xchg[*]}" -v ps="${xpp[*]}" \
    -v cs="${xcomm[*]}" -v os="${xone[*]}" -v qs="${xpost[*]}" 'BEGIN {
  printf "  transport alone, time inside one post call:       %.1f (%.2f x the round trip: the floor; samples %s)\n", q, q / rtt, qs
  printf "  transport alone (rdma-exchange), 8-byte exchange: %.1f (%.2f x the round trip; samples %s)\n", x, x / rtt, xs
  printf "  transport alone, ping-pong round trip:            %.1f (%.2f x ibv_rc_pingpong; samples %s)\n", p, p / rtt, ps
  printf "  the same process, communicator all_reduce:        %.1f (%.2f x the round trip; samples %s)\n", c, c / rtt, cs
  printf "  the same process, 1-rank all_reduce (no wire):    %.1f (samples %s)\n", o, os }'
