// The one-shot broadcast leaves early (comm/algorithms/oneshot.h,
// broadcast_oneshot.cc): its root returns once it has published, the other
// ranks once the root's slot is there, and a rank runs ahead of the slowest
// by at most the slots' depth less one (comm/exchange_slots.cc). On real
// processes over shared memory:
//
// - hundreds of broadcasts back to back, the same root many times in a row
//   (far ahead) and rotating, from 1 byte to a full slot, in and out of
//   place, mixed with one-shot all_reduce and barrier, a ring all_reduce,
//   and the direct all_reduce (which publishes no slot), stay exact in every
//   element on 2, 3, 4 and 8 ranks: a rank that rewrote a slot a peer still
//   reads shows up as wrong bytes or a false mismatch;
// - a rank that calls another collective, another count or another root
//   while the root broadcasts fails in that call naming both calls, buffers
//   untouched; every other rank has the root's data from its own call and
//   fails at its next call that waits for every rank, or, in a run of
//   broadcasts, within the slots' depth, with the mismatch named; nothing
//   hangs;
// - a root killed before it publishes is named by every rank waiting for it.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/transport/shm/memory.h"
#include "tests/comm/failure_util.h"
#include "tests/comm/harness.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;
using namespace braid::test::failures;

namespace {

test::RunOptions shm_options(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto options = test::run_options(std::chrono::seconds(300), test::test_config(timeout));
  options.config.transport = "shm";
  return options;
}

// The byte `i` of round `round`'s message from `root`: differs between
// consecutive rounds at every position, so a slot read while being
// rewritten shows.
std::uint8_t message_byte(int round, int root, std::size_t i) {
  const auto r = static_cast<std::size_t>(round), from = static_cast<std::size_t>(root);
  return static_cast<std::uint8_t>(i * 131 + r * 29 + from * 7 + 1);
}

// One broadcast of `bytes` from `root`, every byte checked on every rank,
// and that it ran one-shot.
void checked_broadcast(Communicator& comm, int round, int root, std::size_t bytes, bool in_place) {
  const int r = comm.rank();
  std::vector<std::uint8_t> send(bytes + 1), recv(bytes + 1, 0xee);
  std::uint8_t* in = in_place ? recv.data() : send.data();
  if (r == root)
    for (std::size_t i = 0; i < bytes; ++i) in[i] = message_byte(round, root, i);
  comm.broadcast(in, recv.data(), bytes, DataType::u8, root).wait();
  const std::string ran(comm.last_algorithm(OpKind::broadcast).name);
  expect(ran == "oneshot", "broadcast of " + std::to_string(bytes) + " bytes ran " + ran);
  for (std::size_t i = 0; i < bytes; ++i)
    if (recv[i] != message_byte(round, root, i))
      expect(false, "round " + std::to_string(round) + ": rank " + std::to_string(r) + " got a wrong byte " +
                        std::to_string(i) + " of " + std::to_string(bytes) + " from root " + std::to_string(root));
  expect(recv[bytes] == 0xee, "a broadcast wrote past its count");
  if (!in_place && r == root)
    for (std::size_t i = 0; i < bytes; ++i) expect(send[i] == message_byte(round, root, i), "the root's input changed");
}

void checked_all_reduce(Communicator& comm, int round, std::size_t count, std::int32_t* buffer) {
  const int n = comm.size(), r = comm.rank();
  std::fill(buffer, buffer + count, r + round);
  comm.all_reduce(buffer, buffer, count, DataType::i32, ReduceOp::sum).wait();
  const std::int32_t want = n * round + n * (n - 1) / 2;
  for (std::size_t i = 0; i < count; ++i)
    if (buffer[i] != want) expect(false, "round " + std::to_string(round) + ": all_reduce gave a wrong element");
}

}  // namespace

TEST_CASE("one-shot broadcasts back to back with rotating roots stay exact among other collectives",
          "[oneshot][broadcast]") {
  const int size = GENERATE(2, 3, 4, 8);
  auto result = test::run_ranks(size, [](Communicator& comm) {
    const int n = comm.size();
    // From one byte to a full slot (64 KiB + 32 bytes): inside the flag's
    // line, just past it, and copies long enough to overlap a fast root.
    const std::size_t sizes[] = {1, 8, 31, 32, 33, 200, 4096, 65'536 + 32, 1000, 65'536};
    constexpr std::size_t kDirectCount = 20'000;  // 80 KB of i32 in registered memory: the direct all_reduce
    auto* registered = static_cast<std::int32_t*>(Communicator::allocate(kDirectCount * sizeof(std::int32_t)));
    std::vector<std::int32_t> small(5), ring(100'000);
    const int rounds = n == 8 ? 300 : 600;
    for (int round = 0; round < rounds; ++round) {
      // Runs of three from rank 0, then rotating roots.
      const int root = round % 7 < 3 ? 0 : round % n;
      checked_broadcast(comm, round, root, sizes[round % 10], round % 4 == 3);
      if (round % 5 == 4) checked_all_reduce(comm, round, small.size(), small.data());
      if (round % 11 == 10) comm.barrier().wait();
      if (round % 37 == 36) checked_all_reduce(comm, round, ring.size(), ring.data());
      if (round % 29 == 28) {
        checked_all_reduce(comm, round, kDirectCount, registered);
        const std::string ran(comm.last_algorithm(OpKind::all_reduce).name);
        expect(ran == "direct", "the registered all_reduce ran " + ran);
      }
    }
    Communicator::deallocate(registered);
  }, shm_options());
  INFO(size << " ranks\n" << result.summary());
  REQUIRE(result.all_ok());
  CHECK(result.leftover_shm == 0);
}

namespace {

// How the last rank's call #2 differs from the root's broadcast: another
// collective, count or root (rank 1, a non-root: the last rank reads its
// slot), or itself as the root (a second root, which reads no slot).
enum class Odd { kind, count, root, self_root };

// Inside a rank, after a barrier (#1): rank 0 broadcasts 4 i32 (#2), every
// other rank takes part except the last, whose call differs as `odd` says;
// then every rank calls `next`: one barrier (#3), or broadcasts from rank 0
// up to the slots' depth and more. Ends the rank with the tagged error,
// noting in it whether #2 completed ("[after #2]") and checking buffers: a
// failed #2 left them untouched, a completed one holds the root's data.
void broadcast_against(Communicator& comm, Odd odd, OpKind next) {
  const int n = comm.size(), r = comm.rank();
  const bool last = r == n - 1;
  std::vector<std::int32_t> send(8, 100 + r), recv(8, -7);
  const std::size_t count = last && odd == Odd::count ? 3 : 4;
  const int root = last && odd == Odd::root ? 1 : last && odd == Odd::self_root ? r : 0;
  bool completed = false;
  try {
    tagged([&] {
      if (last && odd == Odd::kind)
        comm.all_reduce(send.data(), recv.data(), count, DataType::i32, ReduceOp::sum).wait();
      else
        comm.broadcast(send.data(), recv.data(), count, DataType::i32, root).wait();
      completed = true;
      std::int32_t token = 1;
      if (next == OpKind::barrier) comm.barrier().wait();
      else
        for (std::size_t k = 0; k < shm::kSlotDepth + 4; ++k)
          comm.broadcast(&token, &token, 1, DataType::i32, 0).wait();
    });
  } catch (const std::exception& e) {
    const auto is = [&](std::int32_t v, std::size_t from, std::size_t to) {
      return std::all_of(recv.begin() + from, recv.begin() + to, [v](std::int32_t x) { return x == v; });
    };
    expect(std::all_of(send.begin(), send.end(), [r](std::int32_t x) { return x == 100 + r; }),
           "rank " + std::to_string(r) + " wrote its input");
    if (!completed) expect(is(-7, 0, 8), "rank " + std::to_string(r) + " touched its output in a failed call");
    else expect(is(100 + root, 0, count) && is(-7, count, 8), "rank " + std::to_string(r) + " got wrong data in #2");
    throw std::runtime_error(std::string(e.what()) + (completed ? " [after #2]" : ""));
  }
  throw std::runtime_error("rank " + std::to_string(r) + " completed #2 and what followed against a mismatched peer");
}

}  // namespace

TEST_CASE("a rank that mismatches a root's one-shot broadcast fails at once, the others soon after, named",
          "[oneshot][broadcast][failures]") {
  const int size = GENERATE(2, 3, 4);
  const Odd odd = GENERATE(Odd::kind, Odd::count, Odd::root, Odd::self_root);
  const OpKind next = GENERATE(OpKind::barrier, OpKind::broadcast);
  auto result = test::run_ranks(size, [odd, next](Communicator& comm) {
    comm.barrier().wait();  // #1
    broadcast_against(comm, odd, next);
  }, shm_options(std::chrono::seconds(20)));
  INFO(size << " ranks, odd " << int(odd) << ", next " << name(next) << "\n" << result.summary());
  REQUIRE_FALSE(result.timed_out);
  const int last = size - 1;
  // A last rank that names itself the root (on 2 ranks also Odd::root) is
  // a second root: its broadcast completes like rank 0's, and both roots
  // find the other's signature of #2 later (before they publish the
  // barrier, or before their entry of #2 is rewritten). Every other failure
  // after #2 names the rank that failed, with its reason.
  const bool last_fails_at_once = !(odd == Odd::self_root || (odd == Odd::root && size == 2));
  for (int r = 0; r < size; ++r) {
    const Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(o.type == "RemoteError");
    CHECK(contains(o.text, "mismatched collectives"));
    CHECK(contains(o.text, "broadcast #2"));
    if (odd == Odd::kind) CHECK(contains(o.text, "all_reduce #2"));
    CHECK(contains(o.text, "[after #2]") == (r != last || !last_fails_at_once));
    CHECK(o.ms < 5000);  // the timeout is 20 s
  }
  CHECK(result.leftover_shm == 0);
}

TEST_CASE("a one-shot broadcast's root killed before it publishes is named by every other rank",
          "[oneshot][broadcast][failures]") {
  const int size = GENERATE(2, 4, 8);
  auto result = test::run_ranks(size, [](Communicator& comm) {
    std::vector<float> buf(16, 1.0f);
    for (int i = 0; i < 5; ++i) comm.broadcast(buf.data(), buf.data(), 16, DataType::f32, i % comm.size()).wait();
    if (comm.rank() == 1) raise(SIGKILL);
    tagged([&] { comm.broadcast(buf.data(), buf.data(), 16, DataType::f32, 1).wait(); });
    throw std::runtime_error("broadcast #6 completed without its root");
  }, shm_options(std::chrono::seconds(20)));
  INFO(size << " ranks\n" << result.summary());
  check_killed_rank_named(result, 1, "broadcast #6", 5000);
  CHECK(result.leftover_shm == 0);
}
