// rdma-exchange: the ibverbs transport alone, below the communicator, for
// scripts/rdma_targets.sh (2 ranks under braid-launch, one per host): the
// time of an 8-byte exchange (both ranks send, then wait for the other's
// message: what a 2-rank all_reduce does on the wire) and of an 8-byte
// ping-pong round trip (as ibv_rc_pingpong times it), each over ITERS
// iterations after a warm-up; then, in the same process right after, the
// same exchange as a world communicator's 8-byte all_reduce (its transport
// as BRAID_TRANSPORT says), and a 1-rank communicator's all_reduce (the
// layers' own cost, no wire) and a clock read. Set against the transport's
// exchange, the all_reduce's excess is what the layers above it cost. Each
// timed loop also reports this process's voluntary / involuntary context
// switches, which tell a wait that slept from one that polled.
//
//   braid-launch ... -- rdma-exchange [ITERS]
//
// Prints "exchange: X us", "pingpong round trip: Y us", "communicator
// all_reduce: Z us" (and the transport and algorithm it ran), "1-rank
// all_reduce: W us", "clock read: C us" and "exchange's post call: P us"
// (the time inside the transport's posting call during an exchange) on
// every rank.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/wire.h"
#include "runtime/errors.h"
#include "tests/rdma/programs/pair.h"

using namespace braid;
using namespace braid::comm;

namespace {

// One iteration: both send and then wait (exchange), or rank 0 sends and
// waits for the answer while rank 1 answers (ping-pong). With `post_time`,
// the time inside the posting call is added to it.
void iteration(Transport& t, int rank, bool exchange, const WireHeader& h, double* out, double* in,
               Clock::duration* post_time = nullptr) {
  const int peer = 1 - rank;
  auto post = [&] {
    if (!post_time) return t.post_send(peer, h, out);
    const auto start = Clock::now();
    RequestId s = t.post_send(peer, h, out);
    *post_time += Clock::now() - start;
    return s;
  };
  if (exchange) {
    RequestId s = post();
    RequestId r = t.post_recv(peer, h, in, Placement{});
    ibverbs::finish(t, r);
    ibverbs::finish(t, s);
  } else if (rank == 0) {
    ibverbs::finish(t, post());
    ibverbs::finish(t, t.post_recv(peer, h, in, Placement{}));
  } else {
    ibverbs::finish(t, t.post_recv(peer, h, in, Placement{}));
    ibverbs::finish(t, post());
  }
}

// Times `iters` calls of `body` after a warm-up of a tenth of them and
// prints "<what>: X us (context switches V/I)".
template <typename Body>
void time_calls(const std::string& what, int iters, const Body& body) {
  for (int i = 0; i < iters / 10 + 1; ++i) body();
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) body();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
  getrusage(RUSAGE_SELF, &after);
  std::printf("%s: %.2f us (context switches %ld/%ld)\n", what.c_str(), us, after.ru_nvcsw - before.ru_nvcsw,
              after.ru_nivcsw - before.ru_nivcsw);
}

}  // namespace

int main(int argc, char** argv) try {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 5000;
  runtime::RankInfo info = runtime::rank_info_from_env();
  if (info.world_size != 2 || iters < 1) {
    std::fprintf(stderr, "usage: braid-launch (2 ranks) -- rdma-exchange [ITERS >= 1]\n");
    return 2;
  }
  ibverbs::IbOptions options;
  options.spin = std::chrono::microseconds(runtime::config().spin_us);  // as a communicator
  ibverbs::Pair pair(info, "exchange", 9, options);
  auto& transport = pair.transport;
  WireHeader h = ibverbs::double_message(9);
  double out = info.rank + 1.0, in = 0;
  for (const bool exchange : {true, false})
    time_calls(exchange ? "exchange" : "pingpong round trip", iters,
               [&] { iteration(*transport, info.rank, exchange, h, &out, &in); });
  // The posting call alone, in a loop of its own (its two clock reads would
  // lengthen the exchange above): where the verbs provider does the
  // protocol work in the posting process (soft-RoCE runs the whole path,
  // the peer's receive and the acknowledgement included, inside the
  // post's system call), this is the floor of any exchange.
  Clock::duration post_time{};
  for (int i = 0; i < iters; ++i) iteration(*transport, info.rank, true, h, &out, &in, &post_time);
  std::printf("exchange's post call: %.2f us\n", std::chrono::duration<double, std::micro>(post_time).count() / iters);
  if (in != 2.0 - info.rank) {
    std::fprintf(stderr, "rdma-exchange: rank %d received %g, not %g\n", info.rank, in, 2.0 - info.rank);
    return 1;
  }
  transport->shutdown();

  auto comm = Communicator::create_world(info);
  double sum = 0;
  time_calls("communicator all_reduce", iters,
             [&] { comm->all_reduce(&out, &sum, 1, DataType::f64, ReduceOp::sum).wait(); });
  std::printf("communicator all_reduce ran: %s:%s\n", comm->transport_of(1 - info.rank).c_str(),
              comm->last_algorithm(OpKind::all_reduce).name.c_str());
  if (sum != 3.0) {
    std::fprintf(stderr, "rdma-exchange: rank %d's all_reduce gave %g, not 3\n", info.rank, sum);
    return 1;
  }
  auto alone = comm->split(info.rank, 0);
  time_calls("1-rank all_reduce", iters, [&] { alone->all_reduce(&out, &sum, 1, DataType::f64, ReduceOp::sum).wait(); });
  time_calls("clock read", iters, [] { (void)Clock::now(); });
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "rdma-exchange: %s\n", e.what());
  return 1;
}
