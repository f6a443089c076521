// Each collective is checked the same way: fill the inputs from the value
// model, fill what the call must overwrite with a sentinel, run the call,
// then compare every element it had to write with the model's expectation
// and every element it had to leave alone (an out-of-place call's input, a
// non-root's receive buffer of a reduce) with what was there before. Every
// buffer has 64 guard bytes on each side, checked after the call: a write
// past either end showed nowhere (a review helper's case).
#include "tools/check/grid.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>

#include "runtime/errors.h"
#include "tools/check/values.h"

namespace braid::check {
namespace {

constexpr std::size_t kExamples = 3;
constexpr const char* kKindNames[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                      "reduce",     "all_to_all",     "send_recv",  "barrier"};

// A host buffer from the heap or, registered, from Communicator::allocate,
// between two guards of kGuard bytes (64: the buffer keeps the alignment
// of what it comes from).
constexpr std::size_t kGuard = 64;
constexpr std::byte kGuardByte{0x5A};

class Buffer {
 public:
  Buffer(std::size_t bytes, bool registered) : bytes_(bytes), registered_(registered) {
    const std::size_t size = bytes + 2 * kGuard;
    base_ = static_cast<std::byte*>(registered ? comm::Communicator::allocate(size) : ::operator new(size));
    std::fill(base_, base_ + kGuard, kGuardByte);
    std::fill(base_ + kGuard + bytes, base_ + size, kGuardByte);
  }
  ~Buffer() { registered_ ? comm::Communicator::deallocate(base_) : ::operator delete(base_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::byte* data() { return base_ + kGuard; }

  // Guard bytes no longer as they were: before the buffer, after it.
  std::pair<std::size_t, std::size_t> damaged_guards() const {
    auto damaged = [](const std::byte* p) {
      return static_cast<std::size_t>(std::count_if(p, p + kGuard, [](std::byte b) { return b != kGuardByte; }));
    };
    return {damaged(base_), damaged(base_ + kGuard + bytes_)};
  }

 private:
  std::byte* base_;
  std::size_t bytes_;
  bool registered_;
};

// Counts each damaged guard of `buffer` as one wrong element.
void expect_guards(Outcome& out, const char* what, const Buffer& buffer) {
  const auto [before, after] = buffer.damaged_guards();
  for (const auto& [bytes, where] : {std::pair{before, "before its start"}, std::pair{after, "past its end"}}) {
    if (bytes == 0) continue;
    if (out.wrong++ < kExamples)
      out.examples.push_back(std::string(what) + ": " + std::to_string(bytes) + " of the " + std::to_string(kGuard) +
                             " bytes " + where + " were written");
  }
}

// Compares buffer[first, first + count) with want(index), index counted from
// the buffer's start.
template <class Want>
void expect(Outcome& out, const char* what, const void* buffer, std::size_t first, std::size_t count, DataType dtype,
            Want want) {
  for (std::size_t index = first; index < first + count; ++index) {
    const std::int64_t wanted = want(index);
    const auto got = load(buffer, index, dtype);
    if (got && *got == wanted) continue;
    if (out.wrong++ < kExamples)
      out.examples.push_back(std::string(what) + "[" + std::to_string(index) + "]: expected " +
                             show_value(wanted, dtype) + ", got " + show(buffer, index, dtype));
  }
}

// Rank `rank`'s input, element `index` counted from the buffer's start.
auto inputs_of(int rank, int ranks, DataType dtype) {
  return [=](std::size_t index) { return input_value(rank, index, ranks, dtype); };
}

void fill_inputs(void* buffer, std::size_t count, int rank, int ranks, DataType dtype) {
  for (std::size_t i = 0; i < count; ++i) store(buffer, i, dtype, input_value(rank, i, ranks, dtype));
}

// Elements [0, count) of a buffer filled with the sentinel, which the call
// had to leave alone.
void expect_sentinel(Outcome& out, const char* what, const void* buffer, std::size_t count, DataType dtype) {
  for (std::size_t index = 0; index < count; ++index) {
    if (is_sentinel(buffer, index, dtype)) continue;
    if (out.wrong++ < kExamples)
      out.examples.push_back(std::string(what) + "[" + std::to_string(index) + "]: written (" +
                             show(buffer, index, dtype) + ")");
  }
}

}  // namespace

std::string name(Kind kind) { return kKindNames[static_cast<int>(kind)]; }

bool parse_kind(const std::string& text, Kind& kind) {
  for (int k = 0; k <= static_cast<int>(Kind::barrier); ++k)
    if (text == kKindNames[k]) {
      kind = static_cast<Kind>(k);
      return true;
    }
  return false;
}

bool reduces(Kind kind) { return kind == Kind::all_reduce || kind == Kind::reduce_scatter || kind == Kind::reduce; }

std::string describe(const Case& c) {
  if (c.kind == Kind::barrier) return "barrier";
  std::string text = name(c.kind) + " " + std::string(braid::name(c.dtype));
  if (reduces(c.kind)) text += " " + std::string(braid::name(c.op));
  text += " count " + std::to_string(c.count);
  if (c.kind == Kind::broadcast || c.kind == Kind::reduce) text += " root " + std::to_string(c.root);
  if (c.kind != Kind::send_recv) text += c.in_place ? " in place" : " out of place";
  return text;
}

std::vector<Case> make_grid(const GridSpec& spec, int ranks) {
  std::vector<Case> grid;
  int turn = 0;  // roots take turns, so both hosts' ranks are roots
  auto add = [&](Case c) {
    c.root = turn++ % ranks;
    grid.push_back(c);
  };
  for (Kind kind : spec.kinds) {
    if (kind == Kind::barrier) {
      for (int round = 0; round < 3; ++round) add({Kind::barrier});
      continue;
    }
    if (kind == Kind::send_recv && ranks < 2) continue;
    const std::vector<ReduceOp> ops = reduces(kind) ? spec.ops : std::vector<ReduceOp>{ReduceOp::sum};
    for (DataType dtype : spec.dtypes)
      for (ReduceOp op : ops)
        for (std::size_t count : spec.counts)
          for (bool in_place : {false, true})
            if (!in_place || kind != Kind::send_recv) add({kind, dtype, op, count, in_place});
  }
  if (spec.large_count == 0) return grid;
  for (std::size_t k = 0; k < spec.kinds.size(); ++k) {
    const Kind kind = spec.kinds[k];
    if (kind == Kind::barrier || (kind == Kind::send_recv && ranks < 2)) continue;
    const bool per_rank = kind == Kind::reduce_scatter || kind == Kind::all_gather || kind == Kind::all_to_all;
    const std::size_t count = per_rank ? spec.large_count / ranks : spec.large_count;
    const DataType dtype = spec.dtypes[k % spec.dtypes.size()];
    const ReduceOp op = spec.ops[k % spec.ops.size()];
    for (bool in_place : {false, true})
      if (!in_place || kind != Kind::send_recv) add({kind, dtype, op, count, in_place});
  }
  return grid;
}

Checker::Checker(comm::Communicator& comm, bool registered, std::string barrier_dir)
    : comm_(comm), rank_(comm.rank()), ranks_(comm.size()), registered_(registered),
      barrier_dir_(std::move(barrier_dir)) {
  if (barrier_dir_.empty()) return;
  // Rank 0's draw names this run's marks, so marks an earlier run left in the
  // same folder cannot stand in for a rank that has not arrived.
  std::int64_t run = 0;
  if (rank_ == 0) {
    std::random_device device;
    run = static_cast<std::int64_t>((std::uint64_t{device()} << 32) ^ device());
  }
  comm_.broadcast(&run, &run, 1, DataType::i64, 0).wait();
  char name[32];
  std::snprintf(name, sizeof name, "barrier.%016llx", static_cast<unsigned long long>(run));
  mark_prefix_ = name;
}

Outcome Checker::run(const Case& c) {
  switch (c.kind) {
    case Kind::all_reduce: return all_reduce(c);
    case Kind::reduce_scatter: return reduce_scatter(c);
    case Kind::all_gather: return all_gather(c);
    case Kind::broadcast: return broadcast(c);
    case Kind::reduce: return reduce(c);
    case Kind::all_to_all: return all_to_all(c);
    case Kind::send_recv: return send_recv(c);
    case Kind::barrier: return barrier();
  }
  throw std::logic_error("braid-check: unknown case kind");
}

Outcome Checker::all_reduce(const Case& c) {
  const std::size_t bytes = c.count * dtype_bytes(c.dtype);
  Buffer send(bytes, registered_), recv(bytes, registered_);
  fill_inputs(send.data(), c.count, rank_, ranks_, c.dtype);
  std::byte* out = c.in_place ? send.data() : recv.data();
  if (!c.in_place) fill_sentinel(recv.data(), c.count, c.dtype);
  comm_.all_reduce(send.data(), out, c.count, c.dtype, c.op).wait();
  Outcome o;
  expect(o, "recv", out, 0, c.count, c.dtype,
         [&](std::size_t i) { return reduced_value(i, ranks_, c.dtype, c.op); });
  if (!c.in_place) expect(o, "send (input)", send.data(), 0, c.count, c.dtype, inputs_of(rank_, ranks_, c.dtype));
  expect_guards(o, "send", send);
  expect_guards(o, "recv", recv);
  return o;
}

Outcome Checker::reduce_scatter(const Case& c) {
  const std::size_t es = dtype_bytes(c.dtype), total = c.count * ranks_, mine = rank_ * c.count;
  Buffer send(total * es, registered_), recv(c.count * es, registered_);
  fill_inputs(send.data(), total, rank_, ranks_, c.dtype);
  if (!c.in_place) fill_sentinel(recv.data(), c.count, c.dtype);
  std::byte* out = c.in_place ? send.data() + mine * es : recv.data();
  comm_.reduce_scatter(send.data(), out, c.count, c.dtype, c.op).wait();
  Outcome o;
  if (c.in_place)  // this rank's chunk of the send buffer holds the result
    expect(o, "send/recv", send.data(), mine, c.count, c.dtype,
           [&](std::size_t j) { return reduced_value(j, ranks_, c.dtype, c.op); });
  else {
    expect(o, "recv", recv.data(), 0, c.count, c.dtype,
           [&](std::size_t i) { return reduced_value(mine + i, ranks_, c.dtype, c.op); });
    expect(o, "send (input)", send.data(), 0, total, c.dtype, inputs_of(rank_, ranks_, c.dtype));
  }
  expect_guards(o, "send", send);
  expect_guards(o, "recv", recv);
  return o;
}

Outcome Checker::all_gather(const Case& c) {
  const std::size_t es = dtype_bytes(c.dtype), total = c.count * ranks_, mine = rank_ * c.count;
  Buffer send(c.count * es, registered_), recv(total * es, registered_);
  fill_sentinel(recv.data(), total, c.dtype);
  std::byte* in = c.in_place ? recv.data() + mine * es : send.data();
  fill_inputs(in, c.count, rank_, ranks_, c.dtype);
  comm_.all_gather(in, recv.data(), c.count, c.dtype).wait();
  Outcome o;
  expect(o, "recv", recv.data(), 0, total, c.dtype, [&](std::size_t j) {
    return input_value(static_cast<int>(j / c.count), j % c.count, ranks_, c.dtype);
  });
  if (!c.in_place) expect(o, "send (input)", send.data(), 0, c.count, c.dtype, inputs_of(rank_, ranks_, c.dtype));
  expect_guards(o, "send", send);
  expect_guards(o, "recv", recv);
  return o;
}

Outcome Checker::broadcast(const Case& c) {
  const std::size_t bytes = c.count * dtype_bytes(c.dtype);
  Buffer send(bytes, registered_), recv(bytes, registered_);
  // Every rank fills its own input: a non-root that kept it shows as wrong.
  fill_inputs(send.data(), c.count, rank_, ranks_, c.dtype);
  if (!c.in_place) fill_sentinel(recv.data(), c.count, c.dtype);
  std::byte* out = c.in_place ? send.data() : recv.data();
  comm_.broadcast(send.data(), out, c.count, c.dtype, c.root).wait();
  Outcome o;
  expect(o, "recv", out, 0, c.count, c.dtype, inputs_of(c.root, ranks_, c.dtype));
  if (!c.in_place) expect(o, "send (input)", send.data(), 0, c.count, c.dtype, inputs_of(rank_, ranks_, c.dtype));
  expect_guards(o, "send", send);
  expect_guards(o, "recv", recv);
  return o;
}

Outcome Checker::reduce(const Case& c) {
  const std::size_t bytes = c.count * dtype_bytes(c.dtype);
  Buffer send(bytes, registered_), recv(bytes, registered_);
  fill_inputs(send.data(), c.count, rank_, ranks_, c.dtype);
  if (!c.in_place) fill_sentinel(recv.data(), c.count, c.dtype);
  std::byte* out = c.in_place ? send.data() : recv.data();
  comm_.reduce(send.data(), out, c.count, c.dtype, c.op, c.root).wait();
  Outcome o;
  if (rank_ == c.root)  // only the root's receive buffer is defined
    expect(o, "recv", out, 0, c.count, c.dtype,
           [&](std::size_t i) { return reduced_value(i, ranks_, c.dtype, c.op); });
  else if (!c.in_place)  // and a non-root's is not the library's to write (NCCL's callers pass any)
    expect_sentinel(o, "recv (not the root's: unused)", recv.data(), c.count, c.dtype);
  if (!c.in_place) expect(o, "send (input)", send.data(), 0, c.count, c.dtype, inputs_of(rank_, ranks_, c.dtype));
  expect_guards(o, "send", send);
  expect_guards(o, "recv", recv);
  return o;
}

Outcome Checker::all_to_all(const Case& c) {
  const std::size_t es = dtype_bytes(c.dtype), total = c.count * ranks_, mine = rank_ * c.count;
  Buffer send(total * es, registered_), recv(total * es, registered_);
  fill_inputs(send.data(), total, rank_, ranks_, c.dtype);
  if (!c.in_place) fill_sentinel(recv.data(), total, c.dtype);
  std::byte* out = c.in_place ? send.data() : recv.data();
  comm_.all_to_all(send.data(), out, c.count, c.dtype).wait();
  Outcome o;
  // Block p of the result is block `rank` of peer p's input.
  expect(o, "recv", out, 0, total, c.dtype, [&](std::size_t j) {
    return input_value(static_cast<int>(j / c.count), mine + j % c.count, ranks_, c.dtype);
  });
  if (!c.in_place) expect(o, "send (input)", send.data(), 0, total, c.dtype, inputs_of(rank_, ranks_, c.dtype));
  expect_guards(o, "send", send);
  expect_guards(o, "recv", recv);
  return o;
}

// One message at a time around the ring, rank s to rank s + 1, so every
// rank sends once and receives once and both hosts' links carry one.
Outcome Checker::send_recv(const Case& c) {
  const std::size_t bytes = c.count * dtype_bytes(c.dtype);
  Outcome o;
  for (int src = 0; src < ranks_; ++src) {
    const int dst = (src + 1) % ranks_;
    if (rank_ == src) {
      Buffer send(bytes, registered_);
      fill_inputs(send.data(), c.count, rank_, ranks_, c.dtype);
      comm_.send(send.data(), c.count, c.dtype, dst).wait();
      expect(o, "send (input)", send.data(), 0, c.count, c.dtype, inputs_of(rank_, ranks_, c.dtype));
      expect_guards(o, "send", send);
    } else if (rank_ == dst) {
      Buffer recv(bytes, registered_);
      fill_sentinel(recv.data(), c.count, c.dtype);
      comm_.recv(recv.data(), c.count, c.dtype, src).wait();
      expect(o, "recv", recv.data(), 0, c.count, c.dtype, inputs_of(src, ranks_, c.dtype));
      expect_guards(o, "recv", recv);
    }
  }
  // Then a ring shift, every rank at once: each posts its receive before
  // its send and waits for both afterwards (the engine runs them together).
  const int next = (rank_ + 1) % ranks_, prev = (rank_ + ranks_ - 1) % ranks_;
  Buffer send(bytes, registered_), recv(bytes, registered_);
  fill_inputs(send.data(), c.count, rank_, ranks_, c.dtype);
  fill_sentinel(recv.data(), c.count, c.dtype);
  comm::Work received = comm_.recv(recv.data(), c.count, c.dtype, prev);
  comm_.send(send.data(), c.count, c.dtype, next).wait();
  received.wait();
  expect(o, "recv (ring shift)", recv.data(), 0, c.count, c.dtype, inputs_of(prev, ranks_, c.dtype));
  expect_guards(o, "send (ring shift)", send);
  expect_guards(o, "recv (ring shift)", recv);
  return o;
}

// Each rank leaves a mark in the shared folder before the barrier, one rank
// (a different one each round) only after 200 ms; after the barrier every
// rank must see every mark. A barrier that let a rank through early fails
// this, whatever the timing.
Outcome Checker::barrier() {
  namespace fs = std::filesystem;
  const int round = barrier_round_++;
  if (!barrier_dir_.empty()) {
    if (round % ranks_ == rank_) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::ofstream out(mark(round, rank_));
    out.put('\n');
    out.close();
    if (!out) throw InvalidUsage("--barrier-dir: cannot write " + mark(round, rank_).string());
    // Every rank has passed the checks of round - 2 once round - 1's barrier
    // let this rank through, so that mark is no longer read.
    std::error_code ignored;
    if (round >= 2) fs::remove(mark(round - 2, rank_), ignored);
  }
  comm_.barrier().wait();
  Outcome o;
  if (barrier_dir_.empty()) {
    o.checked = false;  // it ran and returned: the order it promises is seen only through --barrier-dir
    return o;
  }
  for (int r = 0; r < ranks_; ++r)
    if (!fs::exists(mark(round, r)) && o.wrong++ < kExamples)
      o.examples.push_back("rank " + std::to_string(r) + " had not reached barrier round " + std::to_string(round) +
                           " when rank " + std::to_string(rank_) + "'s barrier returned");
  return o;
}

std::filesystem::path Checker::mark(int round, int rank) const {
  return std::filesystem::path(barrier_dir_) /
         (mark_prefix_ + "." + std::to_string(round) + "." + std::to_string(rank));
}

void Checker::tidy() {
  if (barrier_dir_.empty() || barrier_round_ == 0) return;
  comm_.barrier().wait();  // every rank is past its last check
  std::error_code ignored;
  for (int r = std::max(0, barrier_round_ - 2); r < barrier_round_; ++r)
    std::filesystem::remove(mark(r, rank_), ignored);
}

}  // namespace braid::check
