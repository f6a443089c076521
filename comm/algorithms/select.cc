// The algorithm table: the one place that decides which algorithm runs a
// call. The engine asks it for every call, the device path when it stages a
// call (to know whether the kernels over mapped peers run it), and
// braid-bench prints what it returned.
//
//   device buffers      cuda_ipc: the direct collective (<kind>_direct.cc,
//                       kernels over the peers' buffers mapped through
//                       CUDA IPC) on one host of at most kMaxDirectRanks
//                       ranks when every buffer is shareable, but never an
//                       in-place all_to_all; else staged through pinned
//                       host memory and the host table below
//   one-shot            all_reduce, reduce, broadcast, all_gather and
//                       barrier through the shared slots (oneshot.h) when
//                       every rank is on this host over shm, up to 16 ranks,
//                       whenever the call (each rank's part) fits a slot:
//                       64 KiB + 32 B (shm/memory.h)
//   all_reduce          direct on registered buffers of one host from
//                       kDirectAllReduceMinBytes; else recursive doubling
//                       up to small_all_reduce_bytes(N), ring above
//   reduce_scatter      ring
//   all_gather          ring
//   broadcast           binomial tree up to kSmallBroadcastBytes, pipelined chain above
//   reduce              pipelined chain
//   all_to_all          pairwise
//   barrier             dissemination
//   send / recv         direct
//
// BRAID_ALGO forces a choice where the collective has it (ring or
// recursive_doubling for all_reduce, binomial or pipelined for broadcast)
// and turns off direct; `direct` forces the direct collective of any kind on
// registered host buffers of one host (as cuda_ipc would run it), whatever
// the size (an in-place all_to_all then reads a registered copy of its
// input, made at submit: communicator.cc); BRAID_TRANSPORT other than auto turns off cuda_ipc. Elsewhere
// they are ignored.
//
// Every collective first proves that all ranks called it with the same
// arguments (agree_signatures) unless its schedule proves that by itself
// before writing a user buffer (Algorithm::agrees): a mismatch never
// delivers data on any rank.
//
// The all-reduce thresholds come from braid-bench on the 2-core development
// machine (BRAID_ALGO=ring vs recursive_doubling, -b 4K -e 1M, in place):
//   2 ranks: recursive doubling wins to 16 KiB (TCP) / 16 KiB (shm), the ring
//            from 64 KiB on both;
//   4 ranks: recursive doubling wins to 256 KiB on both (log2 N exchanges
//            instead of 2(N-1) ring steps, each a context switch when ranks
//            outnumber cores).
//
// One-shot against the others (issue 18; 2 cores, load 5-7 from other
// builds: medians of 5 alternating braid-bench runs, out of place, us per
// call at 1 KiB / 16 KiB / 64 KiB; 4 and 8 ranks share the 2 cores):
//   all_reduce  2 ranks: oneshot 1.07 / 2.50 / 6.46, recursive doubling
//               2.61 / 4.02 / 7.05, ring 2.64 / 3.76 / 7.63;
//               4 ranks: 5.3 / 8.5 / 20.2 vs 21.7 / 12.0 / 21.0 and 34.7 / 20.1 / 26.6;
//               8 ranks: 20.9 / 19.0 / 51.9 vs 57.3 / 47.5 / 90.1 and 153 / 192 / 217
//   broadcast   4 ranks: 5.5 / 6.3 / 8.3 vs binomial 13.4 / 10.1 / 13.3;
//               8 ranks: 22.3 / 23.9 / 30.9 vs 41.9 / 46.8 / 66.5
//   reduce      4 ranks: 5.8 / 6.8 / 14.0 vs pipelined 16.1 / 14.9 / 18.9;
//               8 ranks: 19.7 / 25.1 / 44.3 vs 61.8 / 68.9 / 88.2
//   all_gather  4 ranks: 5.8 / 6.7 / 9.0 vs ring 17.4 / 20.1 / 24.9;
//               8 ranks: 17.5 / 22.7 / 32.6 vs 91.6 / 118 / 132
// and on 2 ranks broadcast, reduce and all_gather one-shot took 25 us
// against 45-50 us for the others at every size (in a busy spell where every
// call slept). So one-shot runs whatever fits a slot.
//
// The direct all-reduce on registered buffers (since its rewrite on
// direct.h) beats the ring at every size past one-shot: 2 ranks with the
// cores free (SCHED_FIFO, braid-bench -R 1, 3 runs) 256 KiB 7.4-7.9 us vs
// ring 19-21, 1 MiB 21-23 vs 54-56, 4 MiB 72-75 vs 311-316; loaded (medians
// of 5) 128 KiB 17 vs 25 us on 2 ranks, 36 vs 81 us on 4. So
// kDirectAllReduceMinBytes stays 64 KiB, below which one-shot runs anyway.
#include <optional>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/oneshot.h"
#include "comm/algorithms/reducer.h"

namespace braid::comm {
namespace {

constexpr std::size_t kSmallBroadcastBytes = 32u << 10;

std::size_t small_all_reduce_bytes(int ranks) { return ranks <= 2 ? 32u << 10 : 256u << 10; }

void (*oneshot_of(OpKind kind))(Exchange&) {
  switch (kind) {
    case OpKind::all_reduce: return all_reduce_oneshot;
    case OpKind::reduce: return reduce_oneshot;
    case OpKind::broadcast: return broadcast_oneshot;
    case OpKind::all_gather: return all_gather_oneshot;
    case OpKind::barrier: return barrier_oneshot;
    default: return nullptr;
  }
}

// The direct collective of `kind`, null where there is none.
void (*direct_of(OpKind kind))(Exchange&) {
  switch (kind) {
    case OpKind::all_reduce: return all_reduce_direct;
    case OpKind::reduce: return reduce_direct;
    case OpKind::reduce_scatter: return reduce_scatter_direct;
    case OpKind::all_gather: return all_gather_direct;
    case OpKind::broadcast: return broadcast_direct;
    case OpKind::all_to_all: return all_to_all_direct;
    default: return nullptr;
  }
}

// Whether a direct collective can run the call: registered buffers on every
// rank of one host, and not an in-place all-to-all (it would overwrite a
// block of a peer's input before that peer has read it).
bool direct_possible(const CallShape& call) {
  return direct_of(call.kind) && call.registered && call.one_host && call.ranks > 1 &&
         !(call.kind == OpKind::all_to_all && call.in_place);
}

using Rule = Reason::Rule;

Reason because(Rule rule, std::size_t bytes = 0, std::size_t limit = 0, int ranks = 0) {
  Reason reason;
  reason.rule = rule;
  reason.bytes = bytes;
  reason.limit = limit;
  reason.ranks = ranks;
  return reason;
}

Reason forced(const CallShape& call) {
  Reason reason = because(Rule::forced);
  reason.forced = call.forced;
  return reason;
}

// The call's bytes against `limit`, by `rule`; the bytes are a rank's part
// where the call's count is (communicator.h).
Reason sized(Rule rule, const CallShape& call, std::size_t limit, int ranks = 0) {
  Reason reason = because(rule, call.bytes, limit, ranks);
  if (call.kind == OpKind::all_gather || call.kind == OpKind::reduce_scatter) reason.bytes_of = " per rank";
  if (call.kind == OpKind::all_to_all) reason.bytes_of = " per peer";
  return reason;
}

// `bytes` against `limit`: at most (the small-message algorithm) or above.
Reason size_rule(const CallShape& call, std::size_t limit, int ranks) {
  return sized(call.bytes <= limit ? Rule::at_most : Rule::above, call, limit, ranks);
}

// A ring that reduces (all_reduce, reduce_scatter): it scales the inputs of
// an avg of halves as it reads them (reduce_scatter_ring.cc), so they need
// no scaled copy.
Algorithm reducing_ring(void (*run)(Exchange&), Reason reason) {
  Algorithm ring{run, "ring", false, reason};
  ring.scales_avg_inputs = true;
  return ring;
}

// A direct collective on host memory: its reduce steps read the ranks'
// inputs and scale those of an avg of halves as they read them (direct.cc:
// direct_step), so they need no scaled copy either. A scaled copy of a
// registered input had to be registered memory for the peers to map, and
// a fresh region mapped by every peer for every call made a registered
// f16 avg 30 to 70 times slower than the sum (16 MiB on 2 ranks: 248 ms).
Algorithm host_direct(void (*run)(Exchange&), Reason reason) {
  Algorithm direct{run, "direct", true, reason};
  direct.scales_avg_inputs = true;
  direct.maps_inputs = true;
  return direct;
}

Algorithm select_all_reduce(const CallShape& call) {
  const std::size_t limit = small_all_reduce_bytes(call.ranks);
  if (call.forced == "recursive_doubling") return {all_reduce_recursive_doubling, "recursive_doubling", true, forced(call)};
  if (call.forced == "ring") return reducing_ring(all_reduce_ring, forced(call));
  if (call.registered && call.one_host && call.ranks > 1 && call.bytes >= kDirectAllReduceMinBytes)
    return host_direct(all_reduce_direct, sized(Rule::registered, call, kDirectAllReduceMinBytes));
  if (call.bytes <= limit && call.ranks > 1)
    return {all_reduce_recursive_doubling, "recursive_doubling", true, size_rule(call, limit, call.ranks)};
  return reducing_ring(all_reduce_ring, size_rule(call, limit, call.ranks));
}

Algorithm select_broadcast(const CallShape& call) {
  if (call.forced == "binomial") return {broadcast_binomial, "binomial", false, forced(call)};
  if (call.forced == "pipelined") return {broadcast_pipelined, "pipelined", false, forced(call)};
  const Reason reason = size_rule(call, kSmallBroadcastBytes, 0);
  if (call.bytes <= kSmallBroadcastBytes) return {broadcast_binomial, "binomial", false, reason};
  return {broadcast_pipelined, "pipelined", false, reason};
}

// The one-shot collective for `call` where the communicator has shared
// slots, the collective has one and the call fits a slot (under BRAID_ALGO
// auto or oneshot). It beat every other algorithm up to the slot's 64 KiB
// (see the table above).
std::optional<Algorithm> select_oneshot(const CallShape& call) {
  auto run = oneshot_of(call.kind);
  if (!run || call.slot_bytes == 0 || call.ranks < 2 || call.ranks > kMaxOneshotRanks || call.bytes > call.slot_bytes)
    return std::nullopt;
  if (call.forced == "oneshot") return Algorithm{run, "oneshot", true, forced(call)};
  if (call.forced != "auto") return std::nullopt;
  return Algorithm{run, "oneshot", true, sized(Rule::slots, call, call.slot_bytes, call.ranks)};
}

Algorithm select_host(const CallShape& call) {
  if (call.forced == "direct" && direct_possible(call)) return host_direct(direct_of(call.kind), forced(call));
  if (auto oneshot = select_oneshot(call)) return *oneshot;
  switch (call.kind) {
    case OpKind::all_reduce: return select_all_reduce(call);
    case OpKind::reduce_scatter: return reducing_ring(reduce_scatter, because(Rule::only_one));
    case OpKind::all_gather: return {all_gather, "ring", false, because(Rule::only_one)};
    case OpKind::broadcast: return select_broadcast(call);
    case OpKind::reduce: return {reduce_pipelined, "pipelined", false, because(Rule::only_one)};
    case OpKind::all_to_all: return {all_to_all_pairwise, "pairwise", false, because(Rule::only_one)};
    case OpKind::barrier: return {barrier_dissemination, "dissemination", true, because(Rule::only_one)};
    case OpKind::send: return {send_direct, "direct", true, because(Rule::point_to_point)};
    case OpKind::recv: return {recv_direct, "direct", true, because(Rule::point_to_point)};
  }
  return {};
}

std::string rule_text(const Reason& r) {
  const std::string size = std::to_string(r.bytes) + " B" + std::string(r.bytes_of);
  const std::string limit = std::to_string(r.limit) + " B";
  const std::string on = r.ranks > 0 ? " on " + std::to_string(r.ranks) + " ranks" : "";
  switch (r.rule) {
    case Rule::only_one: return "the only one";
    case Rule::point_to_point: return "point-to-point";
    case Rule::forced: return "BRAID_ALGO=" + std::string(r.forced);
    case Rule::registered: return "registered buffers on one host, " + size + " >= " + limit;
    case Rule::at_most: return size + " <= " + limit + on;
    case Rule::above: return size + " > " + limit + on;
    case Rule::cuda_ipc: return "device buffers on one host, every peer's mapped through CUDA IPC";
    case Rule::slots: return "shared slots on one host, " + size + " <= " + limit + on;
  }
  return {};
}

}  // namespace

std::string describe(const Reason& reason) {
  return (reason.staged ? "device buffers staged through pinned host memory; " : "") + rule_text(reason);
}

bool registration_matters(const CallShape& call) {
  if (!call.device && select_oneshot(call)) return false;  // the common small call: one look, not two selections
  CallShape registered = call, not_registered = call;
  registered.registered = true;
  not_registered.registered = false;
  return select_algorithm(registered).name != select_algorithm(not_registered).name;
}

// select_host asks nothing of a call before select_oneshot but whether
// BRAID_ALGO forces the direct collective, and select_oneshot only its kind,
// ranks and size against the slot.
std::optional<Algorithm> oneshot_whenever_fits(const CallShape& call) {
  if (call.device || call.forced == "direct") return std::nullopt;
  CallShape largest = call;
  largest.bytes = call.slot_bytes;
  auto oneshot = select_oneshot(largest);
  if (oneshot) oneshot->id = algorithm_id(oneshot->name);
  return oneshot;
}

// Every rule of the host table is a single crossover in bytes (one
// algorithm up to a threshold, another above it), so the answers at 0 bytes
// and at `up_to`, registered or not, in place or not, being one and the same
// algorithm for the same reason means it is the answer in between too.
std::optional<Algorithm> steady_algorithm(const CallShape& call, std::size_t up_to) {
  if (call.device || call.kind == OpKind::send || call.kind == OpKind::recv) return std::nullopt;
  std::optional<Algorithm> steady;
  for (const std::size_t bytes : {std::size_t{0}, up_to})
    for (const bool registered : {false, true})
      for (const bool in_place : {false, true}) {
        CallShape shape = call;
        shape.bytes = bytes;
        shape.registered = registered;
        shape.in_place = in_place;
        const Algorithm answer = select_algorithm(shape);
        if (!steady) steady = answer;
        else if (answer.run != steady->run || answer.agrees != steady->agrees || answer.reason.rule != steady->reason.rule)
          return std::nullopt;
      }
  return steady;
}

namespace {

Algorithm choose(const CallShape& call) {
  if (!call.device) return select_host(call);
  if (direct_possible(call) && call.ranks <= kMaxDirectRanks && call.transport == "auto") {
    Algorithm ipc{direct_of(call.kind), "cuda_ipc", true, because(Rule::cuda_ipc)};
    ipc.maps_inputs = true;
    return ipc;
  }
  CallShape host = call;
  host.device = false;
  host.registered = false;  // the staging buffers are not
  Algorithm staged = select_host(host);
  staged.reason.staged = true;
  return staged;
}

}  // namespace

// On a communicator with shared slots a rank may rewrite a slot only once
// every peer has finished reading it (oneshot.h), which a collective that
// ends on a rank only after every rank has entered it proves by itself
// (the one-shot broadcast alone leaves early, and later publishes look at
// the peers' flags: exchange_slots.cc). The other one-shot ones wait for
// every slot; the direct ones
// (direct, cuda_ipc) end with a barrier of messages, and a one-shot peer
// that meets their first message fails at once (shm/slots.h); every other
// collective agrees through the slots first (agree_signatures), even where
// its own schedule proves agreement (recursive doubling, the dissemination
// barrier), which keeps the rule simple. The direct ones skip it because it
// cost them 0.5-1 us at 256 KiB (2 ranks, 5.4 against 6.3 us).
Algorithm select_algorithm(const CallShape& call) {
  Algorithm algorithm = choose(call);
  const bool point_to_point = call.kind == OpKind::send || call.kind == OpKind::recv;
  const bool own_barrier = algorithm.name == "oneshot" || algorithm.name == "direct" || algorithm.name == "cuda_ipc";
  if (call.slot_bytes > 0 && !point_to_point && !own_barrier) algorithm.agrees = false;
  algorithm.id = point_to_point ? 0 : algorithm_id(algorithm.name);
  return algorithm;
}

}  // namespace braid::comm
