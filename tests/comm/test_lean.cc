// The engine's lean path on a communicator without shared slots (issue 15;
// comm/engine_lean.cc): small calls over TCP go from the public call
// straight to select.cc's steady algorithm, in the caller's thread, on real
// processes.
//
// - every kind that has a steady algorithm gives the exact result and runs
//   the algorithm select.cc names for it, mixed with point-to-point calls
//   (which never take the lean path) and large calls (which go past it);
// - a peer killed before a small call is named by every waiting rank.
// Issue order among queued large calls is test_oneshot.cc's case, on shm
// and tcp. The mismatch grid (test_mismatch.cc: every kind and field, small
// calls on tcp) holds the other half: an algorithm whose schedule does not prove
// agreement must still agree first on the lean path.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/comm/failure_util.h"
#include "tests/comm/harness.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;
using namespace braid::test::failures;

namespace {

test::RunOptions tcp_options() {
  return options_with(std::chrono::seconds(20), std::chrono::seconds(120), "tcp");
}

void check_all(const std::vector<std::int64_t>& got, std::int64_t want, const std::string& what) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want) {
      expect(false, what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", not " +
                        std::to_string(want));
      return;
    }
}

// One round of small calls of every kind with exact results, naming the
// algorithm each ran.
void small_round(Communicator& comm, int round, std::size_t count) {
  const int n = comm.size(), r = comm.rank();
  const std::int64_t sum = std::int64_t{n} * round + std::int64_t{n} * (n - 1) / 2;
  std::vector<std::int64_t> mine(count, r + round), out(count * n, -1);

  comm.all_reduce(mine.data(), out.data(), count, DataType::i64, ReduceOp::sum).wait();
  check_all({out.begin(), out.begin() + count}, sum, "all_reduce");
  expect(comm.last_algorithm(OpKind::all_reduce).name == "recursive_doubling", "all_reduce ran " +
         comm.last_algorithm(OpKind::all_reduce).name);

  const int root = round % n;
  std::vector<std::int64_t> cast(count, r == root ? 1000 + round : -1);
  comm.broadcast(cast.data(), cast.data(), count, DataType::i64, root).wait();
  check_all(cast, 1000 + round, "broadcast");
  expect(comm.last_algorithm(OpKind::broadcast).name == "binomial", "broadcast ran " +
         comm.last_algorithm(OpKind::broadcast).name);

  std::vector<std::int64_t> reduced(count, -1);
  comm.reduce(mine.data(), reduced.data(), count, DataType::i64, ReduceOp::sum, root).wait();
  if (r == root) check_all(reduced, sum, "reduce");

  comm.all_gather(mine.data(), out.data(), count, DataType::i64).wait();
  for (int p = 0; p < n; ++p)
    check_all({out.begin() + p * count, out.begin() + (p + 1) * count}, p + round, "all_gather");

  std::vector<std::int64_t> spread(count * n, r + round), part(count, -1);
  comm.reduce_scatter(spread.data(), part.data(), count, DataType::i64, ReduceOp::sum).wait();
  check_all(part, sum, "reduce_scatter");

  comm.barrier().wait();
  expect(comm.last_algorithm(OpKind::barrier).name == "dissemination", "barrier ran " +
         comm.last_algorithm(OpKind::barrier).name);
}

}  // namespace

TEST_CASE("small calls over tcp are exact on the lean path, between point-to-point and large calls", "[lean]") {
  const int size = GENERATE(2, 3, 4);
  auto result = test::run_ranks(size, [](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    for (int round = 0; round < 12; ++round) {
      small_round(comm, round, round % 2 ? 1 : 37);
      // A ring of point-to-point messages (numbered per peer, never lean).
      std::int64_t token = r * 10 + round, got = -1;
      Work sent = comm.send(&token, 1, DataType::i64, (r + 1) % n);
      comm.recv(&got, 1, DataType::i64, (r + n - 1) % n).wait();
      sent.wait();
      expect(got == ((r + n - 1) % n) * 10 + round, "recv got " + std::to_string(got));
      // A large all_reduce: the ring, past the lean path's limit.
      std::vector<std::int64_t> big(50'000, r);
      comm.all_reduce(big.data(), big.data(), big.size(), DataType::i64, ReduceOp::sum).wait();
      check_all(big, std::int64_t{n} * (n - 1) / 2, "large all_reduce");
    }
  }, tcp_options());
  INFO(size << " ranks\n" << result.summary());
  REQUIRE(result.all_ok());
}

TEST_CASE("a peer killed before a small call over tcp is named by every waiting rank", "[lean][failures]") {
  const int size = GENERATE(2, 3);
  auto result = test::run_ranks(size, [](Communicator& comm) {
    comm.barrier().wait();
    if (comm.rank() == comm.size() - 1) raise(SIGKILL);
    std::int64_t x = comm.rank(), y = -1;
    tagged([&] { comm.all_reduce(&x, &y, 1, DataType::i64, ReduceOp::sum).wait(); });
    throw std::runtime_error("the all_reduce completed without the killed rank");
  }, tcp_options());
  INFO(size << " ranks\n" << result.summary());
  check_killed_rank_named(result, size - 1, "all_reduce #2", 5000);
}

// Communicator::set_inline(false): every call returns at once and runs on
// the progress thread, so small async calls on two communicators issued in
// opposite orders on two ranks complete (torch's process groups, as gloo
// allows). Inline, each rank's first call waits in its own thread for the
// peer's, which waits for this rank's second call: both until the timeout.
TEST_CASE("with inline calls off, small calls on two communicators issued in opposite orders complete",
          "[lean]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  const auto result = test::run_ranks(
      2,
      [](Communicator& world) {
        std::unique_ptr<Communicator> other = world.split(0, world.rank());
        world.set_inline(false);
        other->set_inline(false);
        std::int64_t a = world.rank() + 1, b = 10 * (world.rank() + 1);
        Work first, second;
        if (world.rank() == 0) {
          first = world.all_reduce(&a, &a, 1, DataType::i64, ReduceOp::sum);
          second = other->all_reduce(&b, &b, 1, DataType::i64, ReduceOp::sum);
        } else {
          first = other->all_reduce(&b, &b, 1, DataType::i64, ReduceOp::sum);
          second = world.all_reduce(&a, &a, 1, DataType::i64, ReduceOp::sum);
        }
        first.wait();
        second.wait();
        expect(a == 3 && b == 30, "sums " + std::to_string(a) + " and " + std::to_string(b) + ", not 3 and 30");
        // Back on, the next call runs inline again and still agrees.
        world.set_inline(true);
        world.all_reduce(&a, &a, 1, DataType::i64, ReduceOp::sum).wait();
        expect(a == 6, "the sum after set_inline(true) is " + std::to_string(a) + ", not 6");
      },
      options_with(std::chrono::seconds(5), std::chrono::seconds(60), transport));
  INFO(result.summary());
  CHECK(result.all_ok());
}
