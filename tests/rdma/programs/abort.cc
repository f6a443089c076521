// rdma-abort: Communicator::abort over the ibverbs transport, from another
// thread, while the running call sleeps in the transport (ppoll on the
// completion channel; abort wakes it through interrupt()). Two ranks, one
// per host. After one all_reduce, rank 0 starts a 4 Mi-element all_reduce
// that rank 1 joins only SECONDS later; a watchdog thread of rank 0 aborts
// the communicator 1 s in. Rank 0's call must fail with AbortedError,
// "cut short", naming the reason, within 2 s of the abort (TCG is slow);
// rank 1's call must fail naming rank 0's abort and its reason.
//
//   braid-launch ... -- rdma-abort [SECONDS]
//
// Prints "rdma-abort: rank N: ok: ..." and exits 0, or "rdma-abort: rank N:
// FAILED: ..." and exits 1 (tests/rdma/guest/ibverbs_failures.sh).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "runtime/errors.h"
#include "runtime/rank_info.h"

using namespace braid;
using namespace braid::comm;

namespace {

constexpr const char* kReason = "the test's watchdog gave up";

long ms_since(std::chrono::steady_clock::time_point start) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
}

int verdict(int rank, bool ok, const std::string& what) {
  std::printf("rdma-abort: rank %d: %s: %s\n", rank, ok ? "ok" : "FAILED", what.c_str());
  return ok ? 0 : 1;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

int main(int argc, char** argv) {
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 4;
  runtime::RankInfo info = runtime::rank_info_from_env();
  if (info.world_size != 2 || seconds < 2) {
    std::fprintf(stderr, "usage: braid-launch (2 ranks) -- rdma-abort [SECONDS >= 2]\n");
    return 2;
  }
  auto world = Communicator::create_world(info);
  double one = 1, sum = 0;
  world->all_reduce(&one, &sum, 1, DataType::f64, ReduceOp::sum).wait();
  std::vector<float> data(std::size_t{1} << 22, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  if (info.rank == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    try {
      world->all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum).wait();
      return verdict(1, false, "the all_reduce completed although rank 0 aborted");
    } catch (const std::exception& e) {
      const std::string text = e.what();
      return verdict(1, contains(text, "rank 0 aborted the communicator (Communicator::abort): ") &&
                            contains(text, kReason),
                     "failed " + std::to_string(ms_since(start)) + " ms in: " + text);
    }
  }
  long aborted_at = -1;
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    aborted_at = ms_since(start);
    world->abort(kReason);
  });
  std::string text = "the all_reduce completed although rank 1 had not joined it";
  bool ok = false;
  long failed_at = -1;
  try {
    world->all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum).wait();
  } catch (const AbortedError& e) {
    failed_at = ms_since(start);
    text = e.what();
    ok = contains(text, "cut short: rank 0 aborted the communicator (Communicator::abort): ") &&
         contains(text, kReason);
  } catch (const std::exception& e) {
    text = std::string("not an AbortedError: ") + e.what();
  }
  watchdog.join();
  if (ok && failed_at - aborted_at > 2000) {
    ok = false;
    text = "cut short only " + std::to_string(failed_at - aborted_at) + " ms after the abort: " + text;
  }
  return verdict(0, ok, "aborted at " + std::to_string(aborted_at) + " ms, the running all_reduce failed at " +
                            std::to_string(failed_at) + " ms: " + text);
}
