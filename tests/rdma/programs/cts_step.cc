// rdma-cts-step: the ibverbs transport's clear-to-send numbering stays in
// step with its sender's count of large messages when a large receive is
// taken before it was offered (run in the soft-RoCE VM by
// tests/rdma/guest/ibverbs_forge.sh under braid-launch, 2 ranks, 2 queue
// pairs per peer).
//
// offer_cts offers at most kCtsSlots receives ahead of those completed. A
// large receive past that window whose message comes through the ring, and
// is taken in the same pump_recvs that completes the receives ahead of it,
// was never offered: the receiver's Cts count stayed one behind the
// sender's count of large messages for good, and no large message to that
// rank was written directly again.
//
// Rank 0 makes that order: it polls its completion queue itself
// (TestAccess::step) and holds back the receive completions of queue pair
// 1 (completions of different queue pairs carry no order between them) until
// rank 1's 9th large message has come through the ring.
//   Phase 1: rank 0 posts 9 receives of 1 MiB (the first 8 get a Cts);
//     rank 1 sends 9 once the 8 Cts are in. Messages 0..7 go direct (2
//     stripes each); message 8 waits for a Cts that cannot come (the window
//     is full) and goes through the ring. Once the held stripes are
//     delivered, one pump_recvs completes 0..7 and takes message 8.
//   Phase 2: 10 more, one at a time: rank 0 posts the receive and its Cts
//     goes out; rank 1 sends once that Cts is in. Each must be written
//     directly: rank 1 prints "phase 2: N of 10 large messages written
//     directly" and exits 1 unless N is 10. Every message's bytes are
//     checked on rank 0.
// HOLD=0 runs it without the hold-back (the control).
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/transport/ibverbs/ids.h"
#include "comm/transport/ibverbs/transport.h"
#include "comm/wire.h"
#include "runtime/errors.h"
#include "runtime/rank_info.h"
#include "runtime/store.h"
#include "tests/rdma/programs/pair.h"

namespace braid::comm::ibverbs {

struct TestAccess {
  static IbTransport::Peer& peer(IbTransport& t, int rank) { return t.peer_of(rank); }
  static std::uint64_t direct_sent(IbTransport& t) { return t.direct_sent_; }
  // One turn of the transport with the CQ polled here: receive completions
  // of queue pair `hold_qp` go to `held` instead of the transport.
  static void step(IbTransport& t, int hold_qp, std::vector<ibv_wc>& held) {
    ibv_wc wcs[32];
    int n = ibv_poll_cq(t.verbs_->cq, 32, wcs);
    if (n < 0) throw SystemError("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      if (hold_qp >= 0 && kind_of(wcs[i].wr_id) == Work::receive && qp_of(wcs[i].wr_id) == hold_qp &&
          wcs[i].status == IBV_WC_SUCCESS)
        held.push_back(wcs[i]);
      else
        t.on_completion(wcs[i]);
    }
    for (auto& p : t.peers_) {
      t.pump_sends(p);
      t.pump_recvs(p);
    }
  }
  static void deliver(IbTransport& t, std::vector<ibv_wc>& held) {
    for (const ibv_wc& wc : held) t.on_completion(wc);
    held.clear();
    for (auto& p : t.peers_) {
      t.pump_sends(p);
      t.pump_recvs(p);
    }
  }
};

}  // namespace braid::comm::ibverbs

using namespace braid;
using namespace braid::comm;
using ibverbs::TestAccess;

namespace {

constexpr std::size_t kBytes = 1u << 20;
constexpr std::uint32_t kComm = 16;

WireHeader header_of(std::uint32_t segment) {
  WireHeader h;
  h.kind = static_cast<std::uint8_t>(OpKind::send);
  h.comm_id = kComm;
  h.root = 0;
  h.count = kBytes;
  h.segment = segment;
  h.seq = segment;
  h.payload_bytes = kBytes;
  return h;
}

void drive(Transport& t, RequestId r) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!t.is_done(r))
    if (!t.progress(deadline) && Clock::now() >= deadline) throw TimeoutError("no progress in 20 s");
}

bool check_bytes(const std::vector<unsigned char>& b, std::uint32_t segment) {
  for (unsigned char c : b)
    if (c != static_cast<unsigned char>(segment * 7 + 1)) return false;
  return true;
}

}  // namespace

int main() {
  runtime::RankInfo info = runtime::rank_info_from_env();
  if (info.world_size != 2) {
    std::fprintf(stderr, "rdma-cts-step: run with 2 ranks\n");
    return 2;
  }
  const bool hold = !(std::getenv("HOLD") && std::string(std::getenv("HOLD")) == "0");
  ibverbs::IbOptions options;
  options.qps = 2;
  ibverbs::Pair pair(info, "cts-step", kComm, options);
  ibverbs::IbTransport& t = *pair.transport;
  const int peer = 1 - info.rank;
  auto& p = TestAccess::peer(t, peer);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  int wrong = 0;

  // Phase 1.
  if (info.rank == 0) {
    std::vector<std::vector<unsigned char>> bufs(9, std::vector<unsigned char>(kBytes, 0));
    std::vector<RequestId> rs;
    for (std::uint32_t g = 0; g < 9; ++g) rs.push_back(t.post_recv(peer, header_of(g), bufs[g].data(), Placement{}));
    std::vector<ibv_wc> held;
    // With HOLD: until message 8's first ring piece is in (after the 8 direct
    // headers; message 0 waits for its QP 1 stripe, so only its header slot
    // was freed: the credit write a stalled sender gets at once lets rank 1
    // post one piece of message 8, after its cts_wait_ ran out) and the 8
    // stripes of QP 1 are held back.
    while (hold && !(p.arrived >= 9 && held.size() >= 8)) {
      if (Clock::now() >= deadline) {
        std::printf("rank 0: phase 1 stalled (arrived %llu, held %zu)\n", (unsigned long long)p.arrived, held.size());
        return 1;
      }
      TestAccess::step(t, hold ? 1 : -1, held);
    }
    TestAccess::deliver(t, held);
    for (std::uint32_t g = 0; g < 9; ++g) {
      drive(t, rs[g]);
      if (!check_bytes(bufs[g], g)) {
        std::printf("rank 0: message %u has wrong bytes\n", g);
        ++wrong;
      }
      t.release(rs[g]);
    }
    std::printf("rank 0: phase 1 done: Cts written %llu for 9 large receives (large_done %llu)\n",
                (unsigned long long)p.cts_sent, (unsigned long long)p.large_done);
  } else {
    while (p.cts_arrived < 8) {
      if (Clock::now() >= deadline) { std::printf("rank 1: no Cts\n"); return 1; }
      t.progress(deadline);
    }
    std::vector<std::vector<unsigned char>> bufs;
    std::vector<RequestId> ss;
    for (std::uint32_t g = 0; g < 9; ++g) {
      bufs.emplace_back(kBytes, static_cast<unsigned char>(g * 7 + 1));
      ss.push_back(t.post_send(peer, header_of(g), bufs.back().data()));
    }
    for (RequestId s : ss) {
      drive(t, s);
      t.release(s);
    }
    std::printf("rank 1: phase 1 done: %llu large messages started, %llu written directly\n",
                (unsigned long long)p.large_sent, (unsigned long long)TestAccess::direct_sent(t));
  }

  // Phase 2: one at a time, the Cts always in hand before the send starts.
  // First let late Cts writes of phase 1 land and be counted.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int k = 0; k < 100; ++k) t.progress(Clock::now());
  const std::uint64_t base = p.cts_arrived;
  int direct = 0;
  for (std::uint32_t i = 0; i < 10; ++i) {
    const std::uint32_t g = 100 + i;
    if (info.rank == 0) {
      std::vector<unsigned char> buf(kBytes, 0);
      const auto before = p.cts_sent;
      RequestId r = t.post_recv(peer, header_of(g), buf.data(), Placement{});
      while (p.cts_sent == before) t.progress(Clock::now());  // offer_cts runs in pump_recvs
      drive(t, r);
      if (!check_bytes(buf, g)) {
        std::printf("rank 0: message %u has wrong bytes\n", g);
        ++wrong;
      }
      t.release(r);
    } else {
      std::vector<unsigned char> buf(kBytes, static_cast<unsigned char>(g * 7 + 1));
      const auto want = base + i + 1;  // rank 0's Cts for this message is in
      const auto until = Clock::now() + std::chrono::seconds(5);
      while (p.cts_arrived < want && Clock::now() < until) t.progress(until);
      const auto before = TestAccess::direct_sent(t);
      RequestId s = t.post_send(peer, header_of(g), buf.data());
      drive(t, s);
      t.release(s);
      const bool d = TestAccess::direct_sent(t) > before;
      direct += d;
      std::printf("rank 1: message %u: Cts count %llu, large_sent %llu before it: %s\n", g,
                  (unsigned long long)want, (unsigned long long)(p.large_sent - 1), d ? "direct" : "through the ring");
    }
  }
  if (info.rank == 1) std::printf("rank 1: phase 2: %d of 10 large messages written directly\n", direct);
  // Let the last acknowledgements land before either side shuts down.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (info.rank == 0) std::printf("rank 0: %d message(s) with wrong bytes\n", wrong);
  return (info.rank == 1 && direct != 10) || wrong != 0 ? 1 : 0;
}
