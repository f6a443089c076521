// The one-shot collectives through the shared slots (issue 18; comm/
// algorithms/oneshot.h) on real processes over shared memory:
//
// - every dtype x op x count x placement gives the exact result on 2..8
//   ranks, and the call really ran "oneshot" (Communicator::last_algorithm);
// - the slots are reused every other call, interleaved with collectives
//   that agree through them and run elsewhere (ring, pairwise) and with
//   point-to-point calls, and stay right;
// - a mismatched call (another count, or a small call against a large one
//   that only agrees through the slots) fails every rank inside that call
//   with both calls named and no user buffer touched; a broadcast, which
//   leaves early (test_oneshot_broadcast.cc), fails the ranks whose call
//   matched its root's at the barrier after it instead;
// - a rank that dies while its peers wait for its slot is named, fast, and
//   one that never comes is a timeout naming it, not a hang;
// - ranks asleep waiting for a slot are woken by its publish, not by their
//   next look at the flag.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/comm/failure_util.h"
#include "tests/comm/cases.h"
#include "tests/comm/harness.h"
#include "tools/bench/verify.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;
using namespace braid::test::cases;
using namespace braid::test::failures;

namespace {

// Runs `c` and checks every output element exactly, and that select.cc ran
// it with `algorithm`.
void run_case(Communicator& comm, const Case& c, const std::string& algorithm = "oneshot") {
  const int n = comm.size(), r = comm.rank();
  const std::size_t es = dtype_bytes(c.dtype), count = c.count;
  const std::size_t out_count = c.kind == OpKind::all_gather ? count * n : count;
  std::vector<std::byte> send(std::max<std::size_t>(1, count) * es), recv(std::max<std::size_t>(1, out_count) * es);
  std::byte* in = c.in_place ? recv.data() + (c.kind == OpKind::all_gather ? r * count * es : 0) : send.data();
  verify::fill_input(in, count, 0, r, n, c.dtype, c.op);
  switch (c.kind) {
    case OpKind::all_reduce: comm.all_reduce(in, recv.data(), count, c.dtype, c.op).wait(); break;
    case OpKind::reduce: comm.reduce(in, recv.data(), count, c.dtype, c.op, c.root).wait(); break;
    case OpKind::broadcast: comm.broadcast(in, recv.data(), count, c.dtype, c.root).wait(); break;
    case OpKind::all_gather: comm.all_gather(in, recv.data(), count, c.dtype).wait(); break;
    default: comm.barrier().wait(); break;
  }
  const std::string ran(comm.last_algorithm(c.kind).name);
  expect(ran == algorithm, describe(c, n) + " ran " + ran + ", not " + algorithm);
  if (c.kind == OpKind::barrier || (c.kind == OpKind::reduce && r != c.root)) return;
  verify::ExpectedTable table(n, c.dtype, c.op);
  for (std::size_t i = 0; i < out_count; ++i) {
    const std::byte* expected = c.kind == OpKind::broadcast    ? table.input(c.root, i)
                                : c.kind == OpKind::all_gather ? table.input(int(i / count), i % count)
                                                               : table.reduction(i);
    if (std::memcmp(recv.data() + i * es, expected, es) != 0)
      expect(false, "wrong element " + std::to_string(i) + " in " + describe(c, n));
  }
}

test::RunOptions shm_options(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto options = test::run_options(std::chrono::seconds(240), test::test_config(timeout));
  options.config.transport = "shm";
  return options;
}

}  // namespace

TEST_CASE("one-shot collectives are exact for every dtype, op, count and placement on 2 to 8 ranks",
          "[oneshot]") {
  const int size = GENERATE(2, 3, 4, 5, 8);
  auto result = test::run_ranks(size, [](Communicator& comm) {
    const int n = comm.size();
    // Counts up to 1 KiB of i64: 8 elements share the flag's cache line.
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{37}, std::size_t{128}})
      for (DataType dtype : kDtypes)
        for (bool in_place : {false, true}) {
          const int root = static_cast<int>(count % n);
          for (ReduceOp op : kOps) {
            run_case(comm, {OpKind::all_reduce, dtype, op, count, in_place, root});
            run_case(comm, {OpKind::reduce, dtype, op, count, in_place, root});
          }
          run_case(comm, {OpKind::broadcast, dtype, ReduceOp::sum, count, in_place, root});
          run_case(comm, {OpKind::all_gather, dtype, ReduceOp::sum, count, in_place, root});
        }
    run_case(comm, {OpKind::barrier, DataType::f32, ReduceOp::sum, 0, false, -1});
    // A slot holds 64 KiB + 32 bytes of payload: the largest call that fits
    // runs one-shot, one byte more does not (select.cc).
    constexpr std::size_t kSlotPayload = (64u << 10) + 32;
    run_case(comm, {OpKind::all_reduce, DataType::u8, ReduceOp::max, kSlotPayload, true, 0});
    run_case(comm, {OpKind::all_gather, DataType::i8, ReduceOp::sum, kSlotPayload, false, 0});
    const std::string above = n == 2 ? "ring" : "recursive_doubling";
    run_case(comm, {OpKind::all_reduce, DataType::u8, ReduceOp::max, kSlotPayload + 1, true, 0}, above);
  }, shm_options());
  INFO(size << " ranks\n" << result.summary());
  REQUIRE(result.all_ok());
  CHECK(result.leftover_shm == 0);
}

TEST_CASE("one-shot slots stay right when reused between ring, pairwise and point-to-point calls", "[oneshot]") {
  const int size = GENERATE(2, 3, 4);
  auto result = test::run_ranks(size, [](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    for (int round = 0; round < 40; ++round) {
      // Odd and even sequence numbers alternate through every pattern below.
      run_case(comm, {OpKind::all_reduce, DataType::i32, ReduceOp::sum, std::size_t(1 + round), round % 2 == 0, 0});
      if (round % 3 == 0)  // past the one-shot limit: the ring, agreeing through the slots
        run_case(comm, {OpKind::all_reduce, DataType::f32, ReduceOp::max, 100'000, false, 0}, "ring");
      if (round % 4 == 1) {
        std::vector<std::int32_t> a(5 * n, r), b(5 * n, -1);
        comm.all_to_all(a.data(), b.data(), 5, DataType::i32).wait();
        for (int p = 0; p < n; ++p) expect(b[5 * p] == p, "all_to_all gave a wrong block");
      }
      if (round % 5 == 2 && n >= 2) {  // no sequence number: the slots must not notice
        std::int64_t token = round, got = -1;
        if (r == 0) comm.send(&token, 1, DataType::i64, 1).wait();
        if (r == 1) comm.recv(&got, 1, DataType::i64, 0).wait();
        if (r == 1) expect(got == round, "send/recv between one-shot calls lost its value");
      }
      run_case(comm, {OpKind::broadcast, DataType::u8, ReduceOp::sum, std::size_t(round), false, round % n});
    }
  }, shm_options());
  INFO(size << " ranks\n" << result.summary());
  REQUIRE(result.all_ok());
}

namespace {

// Inside a rank: `count` elements of all_reduce (f32 sum), expected to fail
// with both buffers untouched; `registered`: in memory from
// Communicator::allocate (a large call then runs the direct algorithm).
void mismatched_all_reduce(Communicator& comm, std::size_t count, bool registered = false) {
  const std::size_t bytes = (count + 1) * sizeof(float);
  std::vector<float> heap(registered ? 0 : 2 * (count + 1));
  auto* send = registered ? static_cast<float*>(Communicator::allocate(2 * bytes)) : heap.data();
  float* recv = send + count + 1;
  std::fill(send, send + count + 1, 2.0f);
  std::fill(recv, recv + count + 1, -7.0f);
  auto untouched = [&] {
    for (std::size_t i = 0; i <= count; ++i)
      if (send[i] != 2.0f || recv[i] != -7.0f) return false;
    return true;
  };
  try {
    tagged([&] { comm.all_reduce(send, recv, count, DataType::f32, ReduceOp::sum).wait(); });
  } catch (...) {
    expect(untouched(), "rank " + std::to_string(comm.rank()) + " touched a buffer");
    throw;
  }
  throw std::runtime_error("rank " + std::to_string(comm.rank()) + " completed a mismatched call");
}

void check_every_rank_named_the_mismatch(const test::RunResult& result) {
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (std::size_t r = 0; r < result.ranks.size(); ++r) {
    const Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(o.type == "RemoteError");
    CHECK(contains(o.text, "mismatched collectives"));
    CHECK(contains(o.text, "all_reduce #2"));
    CHECK(o.ms < 5000);  // the timeout is 20 s
  }
}

}  // namespace

TEST_CASE("a mismatched one-shot call fails every rank in that call, buffers untouched", "[oneshot][failures]") {
  const int size = GENERATE(2, 3, 4);
  // The last rank's count: another small one (both one-shot), or one past
  // every one-shot limit (it agrees through the slots, then would run the
  // ring), or that in registered memory (the direct algorithm, which agrees
  // by its own messages: the one-shot ranks find its first one in their ring).
  const std::size_t odd_count = GENERATE(std::size_t{9}, std::size_t{100'000});
  const bool registered = odd_count > 9 && GENERATE(false, true);
  auto result = test::run_ranks(size, [odd_count, registered](Communicator& comm) {
    comm.barrier().wait();  // #1
    const bool odd = comm.rank() == comm.size() - 1;
    mismatched_all_reduce(comm, odd ? odd_count : 8, odd && registered);
  }, shm_options(std::chrono::seconds(20)));
  INFO(size << " ranks, the last one with count " << odd_count << (registered ? " in registered memory" : ""));
  check_every_rank_named_the_mismatch(result);
}

// A send where its peer calls a collective (torch's alltoall_base given
// split sizes on one rank and none on the other): the collective waited
// for the peer's slot, the peer's receive for a message, until
// BRAID_TIMEOUT, and the message then blamed a heartbeat. The unreceived
// send in the waiting rank's ring is the mismatch, named at once.
TEST_CASE("a send where its peer calls a collective fails both ranks at once, naming the send",
          "[oneshot][failures]") {
  const std::size_t count = GENERATE(std::size_t{8}, std::size_t{100'000});
  const OpKind kind = GENERATE(OpKind::all_to_all, OpKind::all_reduce, OpKind::barrier);
  auto result = test::run_ranks(2, [count, kind](Communicator& comm) {
    std::vector<float> in(2 * count, 1.0f), out(2 * count);
    comm.barrier().wait();
    if (comm.rank() == 1) {
      comm.send(in.data(), count, DataType::f32, 0);
      comm.recv(out.data(), count, DataType::f32, 0).wait();
    } else if (kind == OpKind::all_to_all) {
      comm.all_to_all(in.data(), out.data(), count, DataType::f32).wait();
    } else if (kind == OpKind::all_reduce) {
      comm.all_reduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum).wait();
    } else {
      comm.barrier().wait();
    }
    throw std::runtime_error("the mismatched calls completed");
  }, shm_options(std::chrono::seconds(20)));
  INFO(count << " elements, rank 0 in " << name(kind) << "\n" << result.summary());
  REQUIRE_FALSE(result.timed_out);
  // Rank 0 finds the send in its ring; rank 1, waiting in its receive,
  // may find first that rank 0 entered the collective instead (either is
  // the mismatch, and the other rank is told it).
  const std::string send_named = "but rank 1 has not entered it and sent rank 0 a message (a send of " +
                                 std::to_string(count) + " f32) that no receive took";
  const std::string collective_named = "waits in recv #1 (count " + std::to_string(count) +
                                       ", f32, peer 0) for a message from rank 0, but rank 0 has entered " +
                                       std::string(name(kind)) + " #2";
  for (const auto& r : result.ranks) {
    CHECK(r.exit_code == 1);
    CHECK((contains(r.message, send_named) || contains(r.message, collective_named)));
  }
  CHECK(result.elapsed < std::chrono::seconds(5));  // not the 20 s of BRAID_TIMEOUT
  CHECK(result.leftover_shm == 0);
}

TEST_CASE("a rank killed before it publishes its slot is named by every waiting rank", "[oneshot][failures]") {
  const int size = GENERATE(2, 4);
  // Small blocking calls on an idle communicator: the lean path (engine_lean.cc).
  const OpKind kind = GENERATE(OpKind::all_reduce, OpKind::broadcast, OpKind::barrier);
  const auto timeout = std::chrono::seconds(20);
  auto result = test::run_ranks(size, [kind](Communicator& comm) {
    std::vector<float> buf(16, 1.0f);
    for (int i = 0; i < 5; ++i) comm.all_reduce(buf.data(), buf.data(), 16, DataType::f32, ReduceOp::sum).wait();
    if (comm.rank() == 1) raise(SIGKILL);
    tagged([&] {
      if (kind == OpKind::all_reduce) comm.all_reduce(buf.data(), buf.data(), 16, DataType::f32, ReduceOp::sum).wait();
      if (kind == OpKind::barrier) comm.barrier().wait();
      if (kind != OpKind::broadcast) return;
      // Rank 0's broadcast and those reading only its slot complete without
      // rank 1 (they leave early); the next call waits for rank 1's slot of
      // this one first.
      std::fill(buf.begin(), buf.end(), comm.rank() == 0 ? 42.0f : -1.0f);
      comm.broadcast(buf.data(), buf.data(), 16, DataType::f32, 0).wait();
      for (float v : buf) expect(v == 42.0f, "the broadcast without rank 1 gave wrong data");
      comm.barrier().wait();
    });
    throw std::runtime_error(std::string(name(kind)) + " completed without rank 1");
  }, shm_options(timeout));
  INFO(size << " ranks, " << name(kind) << "\n" << result.summary());
  check_killed_rank_named(result, 1, kind == OpKind::broadcast ? "barrier #7" : std::string(name(kind)) + " #6", 5000);
  CHECK(result.leftover_shm == 0);
}

TEST_CASE("a rank that never calls is a timeout naming it, not a hang", "[oneshot][failures]") {
  const auto timeout = std::chrono::milliseconds(1500);
  auto result = test::run_ranks(3, [timeout](Communicator& comm) {
    std::int32_t v = 1;
    comm.all_reduce(&v, &v, 1, DataType::i32, ReduceOp::sum).wait();
    if (comm.rank() == 2) {  // stays alive and silent past its peers' timeout, then leaves
      std::this_thread::sleep_for(timeout * 3);
      return;
    }
    tagged([&] { comm.all_reduce(&v, &v, 1, DataType::i32, ReduceOp::sum).wait(); });
  }, shm_options(timeout));
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (int r = 0; r < 2; ++r) {
    const Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(o.type == "TimeoutError");
    CHECK(contains(o.text, "all_reduce #2"));
    CHECK(contains(o.text, "rank 2"));
    CHECK(o.ms >= timeout.count() - 100);
  }
}

namespace {

// How the last rank's call differs from the others' in
// mismatched_small_call: each is a field of the signature the slots carry.
enum class Odd { op, dtype, count, root, kind };

// Inside a rank, after a barrier (#1): one small blocking call (#2) on an
// idle communicator, so the lean path runs it, the last rank's differing
// as `odd` says; expected to fail with both buffers untouched, except where
// a broadcast's call matched its root's (or was a root's): then it
// completes with the root's data, and the barrier after it (#3) fails.
void mismatched_small_call(Communicator& comm, Odd odd) {
  const bool last = comm.rank() == comm.size() - 1;
  std::vector<std::int32_t> send(8, 2), recv(8, -7);
  const int root = last && odd == Odd::root ? 1 : 0;
  const ReduceOp op = last && odd == Odd::op ? ReduceOp::max : ReduceOp::sum;
  const DataType dtype = last && odd == Odd::dtype ? DataType::f32 : DataType::i32;  // both 4 bytes
  const std::size_t count = last && odd == Odd::count ? 3 : 4;
  const bool broadcast = odd == Odd::root || (odd == Odd::kind && last);
  bool completed = false;
  try {
    tagged([&] {
      if (!broadcast) comm.all_reduce(send.data(), recv.data(), count, dtype, op).wait();
      if (!broadcast) return;
      comm.broadcast(send.data(), recv.data(), count, dtype, root).wait();
      completed = true;
      comm.barrier().wait();
    });
  } catch (...) {
    const bool input = std::all_of(send.begin(), send.end(), [](std::int32_t v) { return v == 2; });
    bool output = true;
    for (std::size_t i = 0; i < recv.size(); ++i) output = output && recv[i] == (completed && i < count ? 2 : -7);
    expect(input && output,
           "rank " + std::to_string(comm.rank()) + (completed ? " got wrong data" : " touched a buffer"));
    throw;
  }
  throw std::runtime_error("rank " + std::to_string(comm.rank()) + " completed a mismatched call");
}

}  // namespace

TEST_CASE("a small call on the lean path that mismatches a peer's fails every rank naming it", "[oneshot][failures]") {
  const int size = GENERATE(2, 3);
  const Odd odd = GENERATE(Odd::op, Odd::dtype, Odd::count, Odd::root, Odd::kind);
  auto result = test::run_ranks(size, [odd](Communicator& comm) {
    comm.barrier().wait();  // #1
    mismatched_small_call(comm, odd);
  }, shm_options(std::chrono::seconds(20)));
  INFO(size << " ranks, odd field " << int(odd) << "\n" << result.summary());
  REQUIRE_FALSE(result.timed_out);
  // Odd::root: on 2 ranks both are roots and fail at #3; on 3 the last one
  // fails at #2 on rank 1's slot, ranks 0 and 1 at #3. Either way the
  // mismatch of #2 is named.
  const std::string call = odd == Odd::root ? "broadcast #2" : "all_reduce #2";
  for (std::size_t r = 0; r < result.ranks.size(); ++r) {
    const Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(o.type == "RemoteError");
    CHECK(contains(o.text, "mismatched collectives"));
    CHECK(contains(o.text, call));
    CHECK(o.ms < 5000);  // the timeout is 20 s
  }
  CHECK(result.leftover_shm == 0);
}

// Small calls issued while larger ones are still queued or running on the
// progress thread must not overtake them (the lean path stays out while the
// engine is busy and comes back once it is idle): every rank issues the
// same mix without waiting, and every result is checked at the end. Over
// shm the small ones run one-shot, over tcp recursive doubling
// (engine_lean.cc takes both).
TEST_CASE("small calls keep their issue order among queued large ones", "[oneshot][lean]") {
  const std::string transport = GENERATE("shm", "tcp");
  const int size = GENERATE(2, 3);
  auto options = shm_options();
  options.config.transport = transport;
  auto result = test::run_ranks(size, [](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    constexpr std::size_t kLarge = 300'000, kSmall = 5;  // past the slots (ring) / one-shot
    std::vector<std::vector<std::int32_t>> bufs;
    std::vector<std::int32_t> want;
    std::vector<Work> works;
    for (int round = 0; round < 30; ++round) {
      const bool large = round % 3 == 0 || round % 7 == 1;
      bufs.emplace_back(large ? kLarge : kSmall, r + round);
      want.push_back(n * round + n * (n - 1) / 2);
      works.push_back(comm.all_reduce(bufs.back().data(), bufs.back().data(), bufs.back().size(), DataType::i32,
                                      ReduceOp::sum));
    }
    for (std::size_t i = 0; i < works.size(); ++i) {
      works[i].wait();
      expect(works[i].test(), "a waited-for Work is not complete");
      for (std::int32_t v : bufs[i])
        if (v != want[i]) expect(false, "call " + std::to_string(i) + " gave " + std::to_string(v));
    }
  }, options);
  INFO(transport << ", " << size << " ranks\n" << result.summary());
  REQUIRE(result.all_ok());
}

TEST_CASE("ranks asleep waiting for a slot are woken when it is published", "[oneshot][lean]") {
  // Rank 0 comes 60-160 ms late to every call, so its peers pass their spin
  // and yields and sleep on their futex. Its publish must wake them (the
  // doorbell of shm/slots.h) at once, not leave them to their next look at
  // the flag, up to a 50 ms sleep slice later: each peer measures from just
  // before rank 0's call to its own return, and the median must stay far
  // below a slice. The delays are 10-35 ms past a multiple of the slice, so
  // that a lost wake-up costs 15-40 ms rather than falling in step with the
  // slices (measured: 0.07-0.1 ms woken, about 25 ms without the wake-up).
  static constexpr int kDelaysMs[] = {60, 75, 110, 125, 160, 85, 135};
  auto result = test::run_ranks(3, [](Communicator& comm) {
    const auto now_ns = [] {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    std::vector<double> woken_ms;
    for (const int delay_ms : kDelaysMs)
      for (OpKind kind : {OpKind::all_reduce, OpKind::broadcast}) {
        std::int64_t sent_at = 0;
        std::int32_t v = comm.rank();
        if (comm.rank() == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          sent_at = now_ns();
        }
        if (kind == OpKind::all_reduce) comm.all_reduce(&v, &v, 1, DataType::i32, ReduceOp::sum).wait();
        else comm.broadcast(&v, &v, 1, DataType::i32, 0).wait();
        const std::int64_t back = now_ns();
        expect(v == (kind == OpKind::all_reduce ? 3 : 0), std::string(name(kind)) + " gave " + std::to_string(v));
        expect(std::string(comm.last_algorithm(kind).name) == "oneshot", std::string(name(kind)) + " not one-shot");
        comm.broadcast(&sent_at, &sent_at, 1, DataType::i64, 0).wait();
        if (comm.rank() != 0) woken_ms.push_back(static_cast<double>(back - sent_at) / 1e6);
      }
    if (comm.rank() == 0) return;
    std::sort(woken_ms.begin(), woken_ms.end());
    const double median = woken_ms[woken_ms.size() / 2];
    expect(median < 10.0, "rank " + std::to_string(comm.rank()) + " returned a median " + std::to_string(median) +
                              " ms after rank 0 published (slowest " + std::to_string(woken_ms.back()) + " ms)");
  }, shm_options());
  INFO(result.summary());
  REQUIRE(result.all_ok());
}
