// rdma-polled: the ibverbs transport only polled, never blocked in: what it
// sees while the communicator blocks on another transport (shared memory to
// a local peer) and gives it turns with a deadline already passed. Two
// ranks under braid-launch, one per host. After one exchange proves the
// wire, each posts a receive its peer never answers (with `idle`, nothing:
// the rank waits on its local peer alone), prints "polling" and polls the
// transport (progress with a passed deadline, then 200 us asleep, as
// Exchange::drive's turns go) until the transport fails, or gives up after
// SECONDS. tests/rdma/guest/ibverbs_failures.sh breaks the wire meanwhile:
// a polled transport must name the port error or the silent peer as a
// blocked one does, and idle, the port error.
//
//   braid-launch ... -- rdma-polled [SECONDS [idle]]
//
// Exits 1 printing "rdma-polled: rank N: ERROR" when the transport fails,
// 3 when it did not within SECONDS.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

#include "braid/config.h"
#include "comm/wire.h"
#include "runtime/errors.h"
#include "tests/rdma/programs/pair.h"

using namespace braid;
using namespace braid::comm;

namespace {

int rank_of_this = -1;

}  // namespace

int main(int argc, char** argv) try {
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 15;
  const bool idle = argc > 2 && std::string(argv[2]) == "idle";
  runtime::RankInfo info = runtime::rank_info_from_env();
  rank_of_this = info.rank;
  if (info.world_size != 2 || seconds < 1 || (argc > 2 && !idle)) {
    std::fprintf(stderr, "usage: braid-launch (2 ranks) -- rdma-polled [SECONDS >= 1 [idle]]\n");
    return 2;
  }
  ibverbs::IbOptions options;
  options.spin = std::chrono::microseconds(runtime::config().spin_us);
  ibverbs::Pair pair(info, "polled", 11, options);
  Transport& t = *pair.transport;
  const int peer = 1 - info.rank;
  WireHeader h = ibverbs::double_message(11);
  double out = info.rank + 1.0, in = 0;
  RequestId s = t.post_send(peer, h, &out);
  ibverbs::finish(t, t.post_recv(peer, h, &in, Placement{}));
  ibverbs::finish(t, s);

  h.seq = 1;  // a message neither rank sends
  const RequestId never = idle ? RequestId{} : t.post_recv(peer, h, &in, Placement{});
  std::printf("polling\n");
  std::fflush(stdout);
  const auto give_up = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < give_up) {
    t.progress(Clock::time_point::min());
    if (!idle && t.is_done(never)) {
      std::fprintf(stderr, "rdma-polled: rank %d: a message nobody sent arrived\n", info.rank);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::fprintf(stderr, "rdma-polled: rank %d: the transport named no failure in %d s of polling\n", info.rank,
               seconds);
  return 3;
} catch (const std::exception& e) {
  std::fprintf(stderr, "rdma-polled: rank %d: %s\n", rank_of_this, e.what());
  return 1;
}
