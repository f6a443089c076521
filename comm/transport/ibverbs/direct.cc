// Large messages of the ibverbs transport: written straight from the
// sender's registered buffer into the receiver's (the protocol is in
// transport.h; registration in memory.h).
#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "comm/transport/ibverbs/ids.h"
#include "comm/transport/ibverbs/transport.h"

namespace braid::comm::ibverbs {
namespace {

constexpr std::size_t kHeaderBytes = sizeof(WireHeader);
// A stripe is worth a queue pair of its own from this size on.
constexpr std::uint64_t kMinStripeBytes = 64u << 10;
// One write per stripe: larger messages than this per queue pair go through the ring.
constexpr std::uint64_t kMaxStripeBytes = std::uint64_t{1} << 30;

}  // namespace

int stripes_of(std::uint64_t payload_bytes, int qps) {
  const std::uint64_t wanted = (payload_bytes + kMinStripeBytes - 1) / kMinStripeBytes;
  return static_cast<int>(std::clamp<std::uint64_t>(wanted, 1, static_cast<std::uint64_t>(std::max(qps, 1))));
}

std::string advertised_range_error(const Cts& cts, std::uint64_t payload_bytes, int rank, int peer) {
  const std::uint64_t end = cts.region_base + cts.region_bytes;
  if (cts.region_bytes >= payload_bytes && cts.address >= cts.region_base && cts.address <= end - payload_bytes &&
      end >= cts.region_base)
    return {};
  return "rank " + std::to_string(rank) + " refused a receive buffer rank " + std::to_string(peer) +
         " advertised: " + std::to_string(payload_bytes) + " bytes at " + std::to_string(cts.address) +
         " do not lie within its registration of " + std::to_string(cts.region_bytes) + " bytes at " +
         std::to_string(cts.region_base) + " (a corrupted or forged clear-to-send)";
}

void IbTransport::unpin(Request& r) {
  if (r.key) cache_.unpin(*r.key);
  r.key.reset();
}

// The sender's side, for the front message m of its large messages: direct
// only when the receiver's Cts for m is here within cts_wait_ (never waiting
// longer: a receiver that posts its receive only after its own sends
// complete must not deadlock, as it would if every send waited for its
// peer's receive),
// offers a buffer, expects exactly this header, and the offered range lies
// within the advertised registration; otherwise the message goes through
// the ring as any other, and a receiver that expected something else names
// the mismatch from its header. Returns false while it waits (for the Cts,
// or after a refusal, for good).
bool IbTransport::start_large(Peer& peer, Request& r, bool& advanced) {
  const std::uint64_t m = peer.large_sent;
  const std::uint64_t payload = r.header.payload_bytes;
  if (peer.cts_arrived <= m && r.data) {  // a few round trips for the Cts, then the ring
    const auto now = Clock::now();
    if (r.cts_wait_until == Clock::time_point{}) r.cts_wait_until = now + cts_wait_;
    if (now < r.cts_wait_until) {
      wake_by_ = std::min(wake_by_, r.cts_wait_until);
      return false;
    }
  }
  r.mode = Mode::ring;
  ++peer.large_sent;
  if (peer.cts_arrived <= m || !r.data) return true;
  for (const auto& pending : peer.direct_writes)
    if (pending.size() >= 2 * kCtsSlots) return true;  // the send queue's share for direct writes is in use
  Cts cts;
  std::atomic_thread_fence(std::memory_order_acquire);
  std::memcpy(&cts, &control(peer).cts_in[m % kCtsSlots], sizeof cts);
  if (cts.seq != m || !cts.offer || !header_mismatch(cts.expected, r.header, peer.rank, rank_).empty()) return true;
  if (std::string refusal = advertised_range_error(cts, payload, rank_, peer.rank); !refusal.empty()) {
    peer.failure = refusal;  // thrown by pump_all once what was posted before has gone
    return false;
  }
  const int qps = static_cast<int>(peer.qps.size());
  if (payload > kMaxStripeBytes * static_cast<std::uint64_t>(stripes_of(payload, qps))) return true;
  r.key = cache_.pin(r.data, payload);
  if (!r.key) return true;
  write_direct(peer, r, cts);
  // The header alone, flagged, follows in the ring: the receiver takes it
  // in order with the other messages and then waits for the stripes.
  post_piece(peer, r, kHeaderBytes, kDirectHeader);
  peer.front_posted = kHeaderBytes + payload;
  r.mode = Mode::direct;
  ++direct_sent_;
  direct_bytes_ += payload;
  advanced = true;
  return true;
}

// Stripe q of the payload goes over queue pair q, its last (only) write with
// kStripeImm; the receiver counts those per queue pair.
void IbTransport::write_direct(Peer& peer, Request& r, const Cts& cts) {
  const std::uint64_t payload = r.header.payload_bytes;
  const int stripes = stripes_of(payload, static_cast<int>(peer.qps.size()));
  const std::uint64_t per = (payload + static_cast<std::uint64_t>(stripes) - 1) / static_cast<std::uint64_t>(stripes);
  const RequestId id = peer.sends.front();  // r
  for (int q = 0; q < stripes; ++q) {
    const std::uint64_t from = static_cast<std::uint64_t>(q) * per, bytes = std::min(per, payload - from);
    post_write(peer, wr_id(Work::direct, index_of(peer), q), r.data + from, r.key->lkey,
               static_cast<std::uint32_t>(bytes), cts.address + from, cts.rkey, true, kStripeImm, q);
    peer.direct_writes[static_cast<std::size_t>(q)].push_back(id);
    ++r.writes_left;
  }
}

// The receiver's side: a Cts for each large receive in posting order, at
// most kCtsSlots ahead of the large receives completed (so the sender's Cts
// slot is free: it consumed the Cts before it sent any of that payload).
void IbTransport::offer_cts(Peer& peer) {
  for (RequestId id : peer.recvs) {
    Request& r = requests_[id];
    if (r.mode != Mode::large || r.offered) continue;
    if (peer.cts_sent - peer.large_done >= kCtsSlots) return;
    const std::uint64_t payload = r.header.payload_bytes;
    if (!r.data) {
      r.staging = staging_pool_.take(payload);
      r.data = r.staging->data();
    }
    r.key = cache_.pin(r.data, payload);
    const std::uint64_t seq = peer.cts_sent++;
    Cts& cts = control(peer).cts_out[seq % kCtsSlots];
    cts = Cts{};
    cts.expected = r.header;
    cts.seq = seq;
    if (r.key) {
      cts.address = reinterpret_cast<std::uint64_t>(r.data);
      cts.region_base = r.key->region_base;
      cts.region_bytes = r.key->region_bytes;
      cts.rkey = r.key->rkey;
      cts.offer = 1;
    }
    r.offered = true;
    post_write(peer, wr_id(Work::cts, index_of(peer)), &cts, control_.lkey(), sizeof cts,
               peer.remote.credit_address + offsetof(ControlBlock, cts_in) + (seq % kCtsSlots) * sizeof(Cts),
               peer.remote.control_rkey, true, kCtsImm);
    ++peer.cts_writes;
  }
}

// A direct message is complete when the immediate of each of its stripes is in.
bool IbTransport::take_stripes(Peer& peer, Request& r) {
  const int stripes = stripes_of(r.header.payload_bytes, static_cast<int>(peer.qps.size()));
  for (int q = 0; q < stripes; ++q)
    if (peer.stripes_arrived[static_cast<std::size_t>(q)] == peer.stripes_taken[static_cast<std::size_t>(q)])
      return false;
  for (int q = 0; q < stripes; ++q) ++peer.stripes_taken[static_cast<std::size_t>(q)];
  r.moved = kHeaderBytes + r.header.payload_bytes;
  r.done = true;
  return true;
}

}  // namespace braid::comm::ibverbs
