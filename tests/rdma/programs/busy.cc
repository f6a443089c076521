// rdma-busy: a dead peer waited on while data flows to another. Three
// ranks; after one all_reduce, rank 2 dies (SIGKILL). Rank 0 waits on a
// receive from rank 2 while it sends 1 MiB messages to rank 1, posted
// faster than they move, for up to SECONDS; rank 1 receives them. Rank 0 prints
//   rdma-busy: rank 0 failed after T s: ERROR
// (T from rank 2's death) and exits 1 when its communicator fails, or 3
// when it streamed for SECONDS without one. The keepalive that probes rank
// 2 ran only while nothing moved with any peer, so the stream held it back
// and rank 2 was named only once the stream stopped
// (tests/rdma/guest/ibverbs_failures.sh).
//
//   rdma-busy [SECONDS]
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <exception>
#include <vector>

#include "comm/communicator.h"
#include "runtime/rank_info.h"

using namespace braid;
using namespace braid::comm;

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 20;
  runtime::RankInfo info = runtime::rank_info_from_env();
  if (info.world_size != 3 || !(seconds > 0)) {
    std::fprintf(stderr, "usage: (3 ranks) rdma-busy [SECONDS > 0]\n");
    return 2;
  }
  auto world = Communicator::create_world(info);
  double one = 1, sum = 0;
  world->all_reduce(&one, &sum, 1, DataType::f64, ReduceOp::sum).wait();
  if (info.rank == 2) ::raise(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  // Rank 0 posts a 1 MiB send every 5 ms without waiting (faster than the
  // VM moves them: the transport always has data for rank 1), and looks
  // whether the receive from rank 2 failed; rank 1 receives them.
  std::vector<float> block(1 << 18, 1.0f);
  std::vector<Work> sent;
  try {
    if (info.rank == 1)
      for (;;) world->recv(block.data(), block.size(), DataType::f32, 0).wait();
    float never = 0;
    Work waited = world->recv(&never, 1, DataType::f32, 2);
    while (elapsed() < seconds) {
      sent.push_back(world->send(block.data(), block.size(), DataType::f32, 1));
      waited.test();  // throws once the communicator failed
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::printf("rdma-busy: rank 0 streamed %.0f s and was never told that rank 2 died\n", seconds);
    return 3;
  } catch (const std::exception& e) {
    std::printf("rdma-busy: rank %d failed after %.2f s: %s\n", info.rank, elapsed(), e.what());
    return 1;
  }
}
