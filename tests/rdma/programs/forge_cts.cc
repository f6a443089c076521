// rdma-forge-cts: the ibverbs transport refuses a receive range its peer
// advertises beyond the registration it advertises with it (issue 15's
// region-bounds test; run in the soft-RoCE VM by tests/rdma/guest/
// ibverbs_forge.sh under braid-launch, 2 ranks).
//
// Rank 0 receives 1 MiB from rank 1, but instead of the clear-to-send its
// transport would write, it writes a forged one (TestAccess below): the
// right header and buffer address, with a registration of 4 KiB around it;
// rank 1 sends once that Cts is in (as a sender that finds it in time does).
// Rank 1 must refuse to write (a RemoteError naming rank 0 and the
// registration) and fail; rank 0 must then fail naming rank 1 (gone), with
// not one byte of its buffer written. Exit 0 when the rank saw exactly that.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/transport/ibverbs/ids.h"
#include "comm/transport/ibverbs/transport.h"
#include "comm/wire.h"
#include "runtime/errors.h"
#include "runtime/rank_info.h"
#include "runtime/store.h"
#include "tests/rdma/programs/pair.h"

namespace braid::comm::ibverbs {

// The one door into the transport's internals: forge rank `peer`'s Cts for
// the receive at the front of its queue.
struct TestAccess {
  static void forge_cts(IbTransport& t, int peer_rank, std::uint64_t region_bytes) {
    IbTransport::Peer& peer = t.peer_of(peer_rank);
    IbTransport::Request& r = t.requests_[peer.recvs.front()];
    const std::uint64_t seq = peer.cts_sent++;
    Cts& cts = t.control(peer).cts_out[seq % kCtsSlots];
    cts = Cts{};
    cts.expected = r.header;
    cts.seq = seq;
    cts.address = reinterpret_cast<std::uint64_t>(r.data);
    cts.region_base = cts.address;
    cts.region_bytes = region_bytes;  // the lie: far less than the payload
    cts.rkey = t.ring_.rkey();        // any key: the sender must not get as far as using it
    cts.offer = 1;
    r.offered = true;
    t.post_write(peer, wr_id(Work::cts, t.index_of(peer)), &cts, t.control_.lkey(), sizeof cts,
                 peer.remote.credit_address + offsetof(IbTransport::ControlBlock, cts_in) +
                     (seq % kCtsSlots) * sizeof(Cts),
                 peer.remote.control_rkey, true, kCtsImm);
    ++peer.cts_writes;
  }
  // Until rank `peer_rank`'s first clear-to-send is here: a sender writes
  // directly only with the Cts in hand, and otherwise sends through the ring.
  static bool wait_cts(IbTransport& t, int peer_rank, Clock::time_point deadline) {
    while (t.peer_of(peer_rank).cts_arrived == 0) {
      if (Clock::now() >= deadline) return false;
      t.progress(deadline);
    }
    return true;
  }
};

}  // namespace braid::comm::ibverbs

using namespace braid;
using namespace braid::comm;

namespace {

constexpr std::size_t kBytes = 1u << 20;
constexpr unsigned char kSentinel = 0x5a;

// Runs the transport until `request` completes or it throws; the error text, or "" on completion.
std::string run(Transport& t, RequestId request, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  try {
    while (!t.is_done(request)) {
      if (Clock::now() >= deadline) return "TIMEOUT";
      t.progress(deadline);
    }
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

int main() {
  runtime::RankInfo info = runtime::rank_info_from_env();
  if (info.world_size != 2) {
    std::fprintf(stderr, "rdma-forge-cts: run with 2 ranks\n");
    return 2;
  }
  ibverbs::Pair pair(info, "forge", 7);
  auto& transport = pair.transport;

  std::vector<unsigned char> buffer(kBytes, info.rank == 0 ? kSentinel : 1);
  WireHeader header;
  header.kind = static_cast<std::uint8_t>(OpKind::send);
  header.comm_id = 7;
  header.root = 0;
  header.count = kBytes;
  header.payload_bytes = kBytes;
  std::string error;
  if (info.rank == 0) {
    RequestId r = transport->post_recv(1, header, buffer.data(), Placement{});
    ibverbs::TestAccess::forge_cts(*transport, 1, 4096);
    error = run(*transport, r, std::chrono::seconds(15));
  } else {
    if (!ibverbs::TestAccess::wait_cts(*transport, 0, Clock::now() + std::chrono::seconds(15))) {
      std::printf("rank 1: no clear-to-send from rank 0\n");
      return 1;
    }
    RequestId r = transport->post_send(0, header, buffer.data());
    error = run(*transport, r, std::chrono::seconds(15));
  }
  std::printf("rank %d: %s\n", info.rank, error.empty() ? "completed" : error.c_str());
  if (info.rank == 1) {
    const bool refused = error.find("rank 1 refused a receive buffer rank 0 advertised: 1048576 bytes") !=
                             std::string::npos && error.find("registration of 4096 bytes") != std::string::npos;
    std::printf("rank 1: %s\n", refused ? "refused the forged range, as it must" : "DID NOT refuse the forged range");
    return refused ? 0 : 1;
  }
  std::size_t written = 0;
  for (unsigned char b : buffer) written += b != kSentinel;
  const bool named = error.find("rank 1") != std::string::npos && error != "TIMEOUT";
  std::printf("rank 0: %zu byte(s) of the buffer written; the error %s rank 1\n", written,
              named ? "names" : "does not name");
  return written == 0 && named ? 0 : 1;
}
