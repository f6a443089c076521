// The direct collectives (comm/algorithms/<kind>_direct.cc) on registered
// host memory, where this project's CI can run them: the same schedules
// serve CUDA device memory mapped through CUDA IPC (tests/comm/
// test_direct_cuda.cc runs them there when a GPU is present). BRAID_ALGO
// direct (config.algo) forces every kind onto them; an all_reduce of
// kDirectAllReduceMinBytes and more takes them by itself. Inputs are small
// integers (tools/bench/verify.h), so results are exact in every dtype and
// op; the traffic counters show that only references and the closing
// barrier crossed the transport. Plus the host Reducer's aliasing rules.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/algorithms/direct.h"
#include "comm/algorithms/reducer.h"
#include "runtime/errors.h"
#include "tests/comm/cases.h"
#include "tests/comm/harness.h"
#include "tools/bench/verify.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;
using namespace braid::test::cases;

namespace {

// Registered memory (Communicator::allocate), freed on scope exit.
struct Registered {
  explicit Registered(std::size_t bytes) : data(static_cast<std::byte*>(Communicator::allocate(bytes))) {}
  ~Registered() { Communicator::deallocate(data); }
  Registered(const Registered&) = delete;
  Registered& operator=(const Registered&) = delete;
  std::byte* data;
};

void issue(Communicator& comm, const Case& c, const std::byte* in, std::byte* out) {
  switch (c.kind) {
    case OpKind::all_reduce: comm.all_reduce(in, out, c.count, c.dtype, c.op).wait(); break;
    case OpKind::reduce_scatter: comm.reduce_scatter(in, out, c.count, c.dtype, c.op).wait(); break;
    case OpKind::all_gather: comm.all_gather(in, out, c.count, c.dtype).wait(); break;
    case OpKind::broadcast: comm.broadcast(in, out, c.count, c.dtype, c.root).wait(); break;
    case OpKind::reduce: comm.reduce(in, out, c.count, c.dtype, c.op, c.root).wait(); break;
    case OpKind::all_to_all: comm.all_to_all(in, out, c.count, c.dtype).wait(); break;
    default: break;
  }
}

const std::byte* expected(const verify::ExpectedTable& table, const Case& c, int r, std::size_t i) {
  switch (c.kind) {
    case OpKind::all_reduce:
    case OpKind::reduce: return table.reduction(i);
    case OpKind::reduce_scatter: return table.reduction(r * c.count + i);
    case OpKind::all_gather: return table.input(int(i / c.count), i % c.count);
    case OpKind::broadcast: return table.input(c.root, i);
    default: return table.input(int(i / c.count), r * c.count + i % c.count);  // all_to_all
  }
}

// Runs one case on registered buffers (reused across cases: registering
// and mapping costs more than a case), checks the output exactly, and that
// the direct collective ran it (an in-place all_to_all from a registered
// copy of its input: communicator.cc) with next to nothing through the
// transport, by one worker (rank 0 doing every rank's share) or by all as
// `one_worker`.
void run_case(Communicator& comm, const Case& c, Registered& send, Registered& recv, bool one_worker) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t es = dtype_bytes(c.dtype), count = c.count;
  const std::size_t big = per_rank(c.kind) ? count * n : count;
  std::memset(recv.data, 0, big * es);
  std::byte* in = send.data;
  std::byte* out = recv.data;
  if (c.in_place) {
    in = c.kind == OpKind::all_gather ? recv.data + r * count * es : recv.data;
    out = c.kind == OpKind::reduce_scatter ? recv.data + r * count * es : recv.data;
  }
  const std::size_t fill = c.kind == OpKind::all_gather ? count : big;
  verify::fill_input(in, fill, 0, r, n, c.dtype, c.op);
  const auto before = comm.traffic();
  issue(comm, c, in, out);
  const auto sent = comm.traffic().bytes_sent - before.bytes_sent;
  const std::string algorithm = comm.last_algorithm(c.kind).name;
  if (count > 0) {
    expect(algorithm == "direct", describe(c, n) + " ran " + algorithm + ", not direct");
    expect(sent < 512u * static_cast<unsigned>(n), describe(c, n) + " sent " + std::to_string(sent) +
                                                        " bytes through the transport: not direct");
    const bool said_one = comm.last_algorithm(c.kind).reason.find("one worker") != std::string::npos;
    expect(said_one == one_worker, describe(c, n) + (one_worker ? " ran with all workers, not one"
                                                                : " ran with one worker, not all"));
  }
  if (c.kind == OpKind::reduce && r != c.root) return;
  verify::ExpectedTable table(n, c.dtype, c.op);
  const std::size_t out_elems = c.kind == OpKind::reduce_scatter ? count : big;
  for (std::size_t i = 0; i < out_elems; ++i)
    if (std::memcmp(out + i * es, expected(table, c, r, i), es) != 0)
      expect(false, "wrong element " + std::to_string(i) + " in " + describe(c, n));
}

constexpr std::size_t kMaxCount = 20011;

std::vector<Case> grid(int size) {
  std::vector<Case> cases;
  const std::size_t counts[] = {0, 1, 1009, static_cast<std::size_t>(size) * 37 + 1, kMaxCount};
  for (DataType dtype : kDtypes)
    for (std::size_t count : counts)
      for (bool in_place : {false, true}) {
        const int root = static_cast<int>(count % size);
        for (OpKind kind : {OpKind::all_reduce, OpKind::reduce_scatter, OpKind::reduce})
          for (ReduceOp op : kOps) cases.push_back({kind, dtype, op, count, in_place, root});
        for (OpKind kind : {OpKind::all_gather, OpKind::broadcast, OpKind::all_to_all})
          cases.push_back({kind, dtype, ReduceOp::sum, count, in_place, root});
      }
  return cases;
}

}  // namespace

TEST_CASE("direct collectives on registered host buffers: every kind x dtype x op x count x placement x workers",
          "[collectives][registered][direct]") {
  const int size = GENERATE(2, 3, 5);
  // auto: each rank its own share (host memory is on no GPU); one
  // (BRAID_DIRECT_WORKERS, direct.h): rank 0 every rank's, the others wait.
  const std::string workers = GENERATE("auto", "one");
  runtime::Config config = test::test_config();
  config.algo = "direct";
  config.direct_workers = workers;
  auto result = test::run_ranks(size, [one = workers == "one"](Communicator& comm) {
    const std::size_t bytes = kMaxCount * static_cast<std::size_t>(comm.size()) * 8;
    Registered send(bytes), recv(bytes);
    for (const Case& c : grid(comm.size())) run_case(comm, c, send, recv, one);
  }, test::run_options(std::chrono::seconds(240), config));
  INFO(size << " ranks, BRAID_DIRECT_WORKERS=" << workers << ": " << result.summary());
  CHECK(result.all_ok());
  CHECK(result.leftover_shm == 0);
}

// Mappings of the registered memory in this process (its own and its
// peers'), as /proc/self/maps lists them.
int region_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("braid-region") != std::string::npos;
  return n;
}

// A peer's registered memory stayed mapped here after the peer freed it, so
// its pages lived on until the communicator ended: allocating and freeing a
// region a cycle grew shared memory by a region per cycle and peer. Freed
// regions' mappings now go before a new region is mapped.
TEST_CASE("direct collectives let go of the registered memory a peer has freed", "[collectives][registered][direct]") {
  runtime::Config config = test::test_config();
  config.algo = "direct";
  auto result = test::run_ranks(3, [](Communicator& comm) {
    const std::size_t count = 1 << 16;
    std::vector<int> spare;  // so that each cycle's regions get new fd numbers, as in a real program
    for (int cycle = 0; cycle < 5; ++cycle) {
      {
        Registered send(count * 4), recv(count * 4);
        std::fill_n(reinterpret_cast<float*>(send.data), count, 1.0f);
        comm.all_reduce(send.data, recv.data, count, DataType::f32, ReduceOp::sum).wait();
        expect(reinterpret_cast<float*>(recv.data)[count - 1] == 3.0f, "a wrong sum");
        comm.barrier().wait();  // every rank is done with this cycle's regions
      }
      spare.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
    const int mapped = region_mappings();
    for (int fd : spare) ::close(fd);
    // Every region is freed: at most the last cycle's two of each peer stay
    // mapped here, until the next new region or a second passes.
    expect(mapped <= 2 * 2, std::to_string(mapped) + " mappings of registered memory after five cycles of two "
                            "regions freed on every rank");
  }, test::run_options(std::chrono::seconds(120), config));
  INFO(result.summary());
  CHECK(result.all_ok());
}

// The look for freed regions took any failure to open a peer's memfd for
// "freed": with no descriptor left (EMFILE) it unmapped the live regions of
// a peer, and the next call on them failed blaming the peer.
TEST_CASE("direct collectives keep live peer regions mapped when descriptors run out",
          "[collectives][registered][direct]") {
  runtime::Config config = test::test_config();
  config.algo = "direct";
  auto result = test::run_ranks(2, [](Communicator& comm) {
    const std::size_t count = 1 << 16;
    Registered send(count * 4), recv(count * 4);
    std::fill_n(reinterpret_cast<float*>(send.data), count, 1.0f);
    comm.all_reduce(send.data, recv.data, count, DataType::f32, ReduceOp::sum).wait();
    rlimit old{};
    getrlimit(RLIMIT_NOFILE, &old);
    const int lowest_free = ::dup(0);  // no descriptor can be opened past this one
    ::close(lowest_free);
    rlimit none = old;
    none.rlim_cur = static_cast<rlim_t>(lowest_free);
    setrlimit(RLIMIT_NOFILE, &none);
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // past the second between looks
    std::string failed;
    try {
      comm.all_reduce(send.data, recv.data, count, DataType::f32, ReduceOp::sum).wait();
    } catch (const std::exception& e) {
      failed = e.what();
    }
    setrlimit(RLIMIT_NOFILE, &old);
    expect(failed.empty(), "the call on live regions failed: " + failed);
    expect(reinterpret_cast<float*>(recv.data)[count - 1] == 2.0f, "a wrong sum");
  }, test::run_options(std::chrono::seconds(60), config));
  INFO(result.summary());
  CHECK(result.all_ok());
}

// The ranks agree on the workers in every call, whatever each was told: one
// rank that asks for all, or one left automatic on host memory (which is on
// no GPU), keeps every rank its own share; a wrong mix would compute shares
// twice or never.
TEST_CASE("direct collectives: ranks told different workers agree on one answer",
          "[collectives][registered][direct]") {
  const char* odd = GENERATE("all", "auto");
  runtime::Config config = test::test_config();
  config.algo = "direct";
  config.direct_workers = "one";
  auto options = test::run_options(std::chrono::seconds(120), config);
  options.configure = [odd](int rank, runtime::Config& c) {
    if (rank == 1) c.direct_workers = odd;
  };
  auto result = test::run_ranks(3, [](Communicator& comm) {
    const std::size_t bytes = kMaxCount * static_cast<std::size_t>(comm.size()) * 8;
    Registered send(bytes), recv(bytes);
    for (const Case& c : grid(comm.size()))
      if (c.dtype == DataType::f32) run_case(comm, c, send, recv, false);
  }, options);
  INFO("rank 1 told " << odd << ": " << result.summary());
  CHECK(result.all_ok());
}

// reduce_scatter into the start of its own send buffer (not NCCL's in-place
// form, the rank's slice, but one the algorithms always served), on every
// algorithm: validate() must keep accepting it, and the result must be
// exact.
TEST_CASE("reduce_scatter into the start of its send buffer is exact on every algorithm",
          "[collectives][registered][direct]") {
  const int size = GENERATE(2, 3);
  const std::string algo = GENERATE("auto", "direct");
  runtime::Config config = test::test_config();
  config.algo = algo;
  auto result = test::run_ranks(size, [](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    for (std::size_t count : {std::size_t{1}, std::size_t{1009}, kMaxCount}) {
      for (bool registered : {false, true}) {
        const std::size_t bytes = count * static_cast<std::size_t>(n) * sizeof(std::int32_t);
        std::vector<std::int32_t> heap(count * static_cast<std::size_t>(n));
        Registered shared(bytes);
        auto* buf = registered ? reinterpret_cast<std::int32_t*>(shared.data) : heap.data();
        for (std::size_t i = 0; i < count * static_cast<std::size_t>(n); ++i)
          buf[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(r)) % 11);
        comm.reduce_scatter(buf, buf, count, DataType::i32, ReduceOp::sum).wait();
        for (std::size_t i = 0; i < count; ++i) {
          std::int32_t want = 0;
          for (int p = 0; p < n; ++p)
            want += static_cast<std::int32_t>(((static_cast<std::size_t>(r) * count + i) * 7 + static_cast<std::size_t>(p)) % 11);
          if (buf[i] != want)
            expect(false, "element " + std::to_string(i) + " of " + std::to_string(count) + (registered ? " (registered)" : "") +
                               ": " + std::to_string(buf[i]) + " != " + std::to_string(want));
        }
      }
    }
  }, test::run_options(std::chrono::seconds(60), config));
  INFO(size << " ranks, BRAID_ALGO=" << algo << ": " << result.summary());
  CHECK(result.all_ok());
}

// Whether a call is in place is each rank's own choice: an in-place
// all_to_all on one rank only fell back to pairwise there while the others
// ran direct, and every rank failed with a mismatch.
TEST_CASE("direct all_to_all in place on some ranks only: every rank runs direct, exactly",
          "[collectives][registered][direct]") {
  const int size = GENERATE(2, 3);
  runtime::Config config = test::test_config();
  config.algo = "direct";
  auto result = test::run_ranks(size, [](Communicator& comm) {
    const std::size_t bytes = kMaxCount * static_cast<std::size_t>(comm.size()) * 8;
    Registered send(bytes), recv(bytes);
    for (std::size_t count : {std::size_t{1}, std::size_t{1009}, kMaxCount})
      for (int in_place_rank = 0; in_place_rank < comm.size(); ++in_place_rank) {
        const Case c{OpKind::all_to_all, DataType::f32, ReduceOp::sum, count, comm.rank() == in_place_rank, 0};
        run_case(comm, c, send, recv, false);
      }
  }, test::run_options(std::chrono::seconds(60), config));
  INFO(size << " ranks: " << result.summary());
  CHECK(result.all_ok());
  CHECK(result.leftover_shm == 0);
}

// The same kinds of buffers on every rank, one registered and the other
// not: a non-root judged registration by the one buffer it uses (a
// broadcast's receive buffer, a reduce's send buffer), the root by both, so
// that under BRAID_ALGO=direct the root ran one algorithm and the others
// direct, and the call failed as mismatched (found by a review helper's
// fuzzer). Every rank now judges every buffer it was given.
TEST_CASE("direct broadcast and reduce with one buffer registered on every rank agree and are exact",
          "[collectives][registered][direct]") {
  const int size = GENERATE(2, 3);
  runtime::Config config = test::test_config(std::chrono::seconds(20));
  config.algo = "direct";
  auto result = test::run_ranks(size, [](Communicator& comm) {
    const std::size_t count = 1009;
    for (OpKind kind : {OpKind::broadcast, OpKind::reduce})
      for (bool send_registered : {false, true}) {
        std::vector<std::int32_t> heap(count);
        Registered mine(count * 4);
        auto* send = send_registered ? reinterpret_cast<std::int32_t*>(mine.data) : heap.data();
        std::vector<std::int32_t> heap_out(count, -1);
        Registered mine_out(count * 4);
        auto* recv = send_registered ? heap_out.data() : reinterpret_cast<std::int32_t*>(mine_out.data);
        std::fill(recv, recv + count, -1);
        for (std::size_t i = 0; i < count; ++i) send[i] = static_cast<std::int32_t>(i) * 10 + comm.rank();
        const int root = comm.size() - 1;
        if (kind == OpKind::broadcast) comm.broadcast(send, recv, count, DataType::i32, root).wait();
        else comm.reduce(send, recv, count, DataType::i32, ReduceOp::sum, root).wait();
        if (kind == OpKind::reduce && comm.rank() != root) continue;
        const int n = comm.size();
        for (std::size_t i = 0; i < count; ++i) {
          const std::int32_t want = kind == OpKind::broadcast ? static_cast<std::int32_t>(i) * 10 + root
                                                              : static_cast<std::int32_t>(i) * 10 * n + n * (n - 1) / 2;
          if (recv[i] != want)
            expect(false, std::string(kind == OpKind::broadcast ? "broadcast" : "reduce") + " element " +
                              std::to_string(i) + ": " + std::to_string(recv[i]) + ", not " + std::to_string(want));
        }
      }
  }, test::run_options(std::chrono::seconds(60), config));
  INFO(size << " ranks: " << result.summary());
  CHECK(result.all_ok());
  CHECK(result.leftover_shm == 0);
}

TEST_CASE("direct broadcast with an unregistered buffer on one rank: every rank fails naming both calls",
          "[collectives][registered][direct]") {
  runtime::Config config = test::test_config(std::chrono::seconds(20));
  config.algo = "direct";
  auto result = test::run_ranks(3, [](Communicator& comm) {
    const std::size_t count = 4096;
    std::vector<std::int32_t> heap(count, 1);
    Registered mine(count * 4);
    void* buffer = comm.rank() == 2 ? static_cast<void*>(heap.data()) : mine.data;
    comm.broadcast(buffer, buffer, count, DataType::i32, 0).wait();
    expect(false, "a direct broadcast with one unregistered buffer completed");
  }, test::run_options(std::chrono::seconds(60), config));
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (const auto& rank : result.ranks) CHECK(rank.exit_code == 1);
  CHECK_THAT(result.summary(), Catch::Contains("broadcast"));
}

// Stream order (direct.h, gate `event`): only where every rank's swap
// carries the event after its input; one that waited on the host (none)
// makes every worker finish on the host, so that its caller may read the
// result as soon as the call returns.
TEST_CASE("stream_ordered: only where every rank's swap names its ready event", "[direct]") {
  auto swap = [](std::uint8_t ready) {
    DirectSwap s;
    s.ready.bytes[63] = ready;
    return s;
  };
  auto ordered = [](std::initializer_list<DirectSwap> swapped) {
    return comm::stream_ordered({swapped.begin(), swapped.size()});
  };
  CHECK(ordered({swap(1), swap(2)}));
  CHECK(ordered({swap(1)}));
  CHECK_FALSE(ordered({swap(1), swap(0)}));
  CHECK_FALSE(ordered({swap(0), swap(0), swap(0)}));
  CHECK_FALSE(DeviceEventRef{}.set());
}

// Stream order by flags (direct.h, gate `flag`): only where every rank's
// swap carries its flags, and then with one call number, or the streams
// would wait for calls that never come: that is refused, naming both.
TEST_CASE("flag_ordered: only where every rank's swap carries its flags, all of one call", "[direct]") {
  auto swap = [](std::uint64_t call, std::uint8_t block) {
    DirectSwap s;
    s.flags.call = call;
    s.flags.block[0] = block;
    return s;
  };
  auto ordered = [](std::initializer_list<DirectSwap> swapped) {
    return comm::flag_ordered({swapped.begin(), swapped.size()});
  };
  CHECK(ordered({swap(5, 1), swap(5, 2)}));
  CHECK(ordered({swap(1, 1)}));
  CHECK_FALSE(ordered({swap(5, 1), swap(0, 2)}));  // a rank whose call is not flag-ordered
  CHECK_FALSE(ordered({swap(0, 1), swap(0, 2), swap(0, 3)}));
  CHECK_FALSE(DeviceFlagsRef{}.set());
  try {
    ordered({swap(5, 1), swap(5, 2), swap(6, 3)});
    FAIL("calls out of step were taken as one");
  } catch (const RemoteError& e) {
    CHECK(std::string(e.what()).find("rank 0 makes its call 5, rank 2 its call 6") != std::string::npos);
  }
}

// The rule itself (direct.h): every rank applies it to every rank's vote.
TEST_CASE("one_direct_worker: one on a shared GPU or where every rank asks, never where one asks for all",
          "[direct]") {
  auto vote = [](DirectWorkers workers, std::uint8_t gpu) {
    DirectSwap v;
    v.vote.workers = workers;
    if (gpu) std::fill(std::begin(v.vote.device), std::end(v.vote.device), gpu);
    return v;
  };
  auto one_direct_worker = [](std::initializer_list<DirectSwap> swapped) {
    return comm::one_direct_worker({swapped.begin(), swapped.size()});
  };
  const auto a = DirectWorkers::automatic, all = DirectWorkers::all, one = DirectWorkers::one;
  CHECK(one_direct_worker({vote(a, 7), vote(a, 7), vote(a, 7)}));        // one GPU
  CHECK_FALSE(one_direct_worker({vote(a, 7), vote(a, 7), vote(a, 8)}));  // two GPUs
  CHECK_FALSE(one_direct_worker({vote(a, 0), vote(a, 0)}));              // host memory
  CHECK(one_direct_worker({vote(one, 0), vote(one, 0)}));                // asked for, on the host too
  CHECK(one_direct_worker({vote(one, 7), vote(a, 7)}));
  CHECK_FALSE(one_direct_worker({vote(one, 0), vote(a, 0)}));
  CHECK_FALSE(one_direct_worker({vote(one, 7), vote(a, 8)}));
  CHECK_FALSE(one_direct_worker({vote(a, 7), vote(all, 7)}));            // all wins
  CHECK_FALSE(one_direct_worker({vote(one, 7), vote(all, 7), vote(one, 7)}));
  DirectSwap partly;  // one byte of the UUID differs
  partly.vote.device[15] = 1;
  CHECK_FALSE(one_direct_worker({vote(a, 0), partly}));
}

// Whether BRAID_CUDA_GATE=auto turns to the host gate (comm/device.h): each
// rank asks whether another rank's buffers are on its own GPU, whatever the
// workers' votes.
TEST_CASE("peer_on_this_gpu: another rank on this rank's GPU, never for host memory", "[direct]") {
  auto on = [](std::uint8_t gpu) {
    DirectSwap v;
    if (gpu) std::fill(std::begin(v.vote.device), std::end(v.vote.device), gpu);
    return v;
  };
  auto shared = [](std::initializer_list<DirectSwap> swapped, int me) {
    return comm::peer_on_this_gpu({swapped.begin(), swapped.size()}, me);
  };
  CHECK(shared({on(7), on(7)}, 0));
  CHECK(shared({on(7), on(7)}, 1));
  CHECK_FALSE(shared({on(7), on(8)}, 0));                    // a GPU each
  CHECK(shared({on(7), on(8), on(7), on(8)}, 3));            // 4 ranks on 2 GPUs
  CHECK_FALSE(shared({on(7), on(8), on(9)}, 1));
  CHECK_FALSE(shared({on(0), on(0)}, 0));                    // host memory
  CHECK_FALSE(shared({on(7)}, 0));                           // alone
  DirectSwap partly = on(7);                                 // one byte of the UUID differs
  partly.vote.device[15] = 8;
  CHECK_FALSE(shared({on(7), partly}, 0));
  DirectSwap workers_all = on(7);                            // the workers' vote does not matter
  workers_all.vote.workers = DirectWorkers::all;
  CHECK(shared({workers_all, on(7)}, 1));
}

// The host Reducer (comm/algorithms/reducer.h): a destination may be any
// one of the sources, at any position, and the result is still the
// reduction of the inputs as they were; one source is a copy; avg divides.
TEST_CASE("host reduce_multi: destinations may be sources, over several blocks", "[direct]") {
  const std::size_t count = 20000;  // 80 KB of i32: three 32 KiB blocks
  const int n = 4;
  for (int aliased = 0; aliased < n; ++aliased) {
    std::vector<std::vector<std::int32_t>> in(n, std::vector<std::int32_t>(count));
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < count; ++i) in[p][i] = static_cast<std::int32_t>(i % 1000) + 1000 * p;
    std::vector<std::int32_t> other(count, -1);
    std::vector<const void*> srcs;
    for (int p = 0; p < n; ++p) srcs.push_back(in[p].data());
    std::vector<void*> dsts{in[aliased].data(), other.data()};
    host_reducer().reduce_multi(dsts, srcs, count, DataType::i32, ReduceOp::avg, {.divisor = n});
    for (std::size_t i = 0; i < count; ++i) {
      const std::int32_t want = static_cast<std::int32_t>(i % 1000) + 1500;  // (4 x i + 6000) / 4
      INFO("source " << aliased << " is a destination, element " << i);
      REQUIRE(in[aliased][i] == want);
      REQUIRE(other[i] == want);
    }
  }
  std::vector<std::int32_t> from(count), to(count);
  std::iota(from.begin(), from.end(), 7);
  const void* one_source = from.data();
  void* destination = to.data();
  host_reducer().reduce_multi({&destination, 1}, {&one_source, 1}, count, DataType::i32, ReduceOp::sum, {});
  CHECK(to == from);
}
