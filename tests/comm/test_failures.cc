// Invariant 2 (DESIGN.md): a peer that dies, exits, freezes, sends garbage
// or calls another collective turns into an error on every other rank within
// the configured timeout — never a hang, never wrong data — on the TCP and
// the shared-memory transport. Also: a rank that stops calling is named in
// the timeout with the last call it entered; arguments are checked before any
// byte moves (InvalidUsage); Work handles behave as documented; an aborted
// communicator fails queued and later calls with AbortedError; split
// communicators have the right members; a wrong job token is refused.
//
// Ranks are real processes (tests/comm/harness.h). A rank checks what it can
// itself with expect(); operations that must fail run inside tagged(), which
// leaves the rank's result as "<Type after N ms> what()" so the parent checks
// the exception type, the time to failure and the text with Catch2. A rank
// that hangs is killed at the harness deadline, and every test requires
// !timed_out, so a hang fails the test rather than passing it.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/errors.h"
#include "runtime/store.h"
#include "tests/comm/harness.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

using SteadyClock = std::chrono::steady_clock;

long ms_since(SteadyClock::time_point start) {
  return static_cast<long>(
      std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count());
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string kind_of(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const RemoteError*>(&e)) return "RemoteError";
  if (dynamic_cast<const InvalidUsage*>(&e)) return "InvalidUsage";
  if (dynamic_cast<const AbortedError*>(&e)) return "AbortedError";
  if (dynamic_cast<const SystemError*>(&e)) return "SystemError";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "std::exception";
}

// Inside a rank: runs `body`; if it throws, the rank ends with the message
// "<Type after N ms> what()", N counted from the start of `body`.
void tagged(const std::function<void()>& body) {
  auto start = SteadyClock::now();
  try {
    body();
  } catch (const std::exception& e) {
    throw std::runtime_error("<" + kind_of(e) + " after " + std::to_string(ms_since(start)) + " ms> " +
                             e.what());
  }
}

// In the parent: a rank's result as tagged() wrote it.
struct Outcome {
  bool tagged = false;
  std::string type;  // "RemoteError", ...
  long ms = -1;      // time from the start of the tagged body to the throw
  std::string text;  // the exception's what()
};

Outcome outcome_of(const test::RankResult& r) {
  Outcome o;
  const std::string& m = r.message;
  auto after = m.find(" after ");
  auto close = m.find(" ms> ");
  if (m.rfind("<", 0) != 0 || after == std::string::npos || close == std::string::npos || after > close) {
    o.text = m;
    return o;
  }
  o.tagged = true;
  o.type = m.substr(1, after - 1);
  o.ms = std::stol(m.substr(after + 7, close - after - 7));
  o.text = m.substr(close + 5);
  return o;
}

// `transport`: BRAID_TRANSPORT, "tcp" or "shm" (all ranks share one host).
test::RunOptions options_with(milliseconds timeout, seconds deadline, const std::string& transport = "auto") {
  test::RunOptions options;
  options.deadline = deadline;
  options.config = test::test_config(timeout);
  options.config.transport = transport;
  return options;
}

// ---- 1. dead, exited, frozen or babbling peer ---------------------------------

// Every rank but the victim loops `count`-element f32 all_reduces, checking
// each result; the victim runs `kill_plan` before each of its iterations.
test::RunResult run_until_victim_dies(int size, std::size_t count, milliseconds timeout,
                                      const std::function<void(Communicator&, int iteration)>& kill_plan,
                                      const std::string& transport, std::size_t segment_bytes = 4096,
                                      int nsocks = 1) {
  auto options = options_with(timeout, seconds(45), transport);
  options.config.segment_bytes = segment_bytes;
  options.config.tcp_nsocks = nsocks;
  return test::run_ranks(
      size,
      [&](Communicator& comm) {
        std::vector<float> send(count, 1.0f), recv(count, 0.0f);
        for (int i = 0; i < 400; ++i) {
          kill_plan(comm, i);
          tagged([&] { comm.all_reduce(send.data(), recv.data(), count, DataType::f32, ReduceOp::sum).wait(); });
          expect(recv.front() == float(comm.size()) && recv[count / 2] == float(comm.size()) &&
                     recv.back() == float(comm.size()),
                 "all_reduce #" + std::to_string(i + 1) + " gave a wrong sum: " + std::to_string(recv.back()));
        }
        throw std::runtime_error("400 all_reduces completed although rank 2 should have died");
      },
      options);
}

// `victim_signal`: the signal that must have ended the victim, 0 if it exited.
void check_survivors(const test::RunResult& result, int victim, milliseconds timeout, int victim_signal = SIGKILL) {
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[victim].signal == victim_signal);
  for (int r = 0; r < static_cast<int>(result.ranks.size()); ++r) {
    if (r == victim) continue;
    Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK(o.type == "RemoteError");  // a TimeoutError would mean the death went unnoticed
    CHECK(o.ms >= 0);
    CHECK(o.ms < timeout.count());
    CHECK(contains(o.text, "rank " + std::to_string(r) + ","));  // who reports
    CHECK(contains(o.text, "all_reduce #"));                      // in which call
    CHECK(contains(o.text, "rank 2"));                            // about whom (maybe chained)
  }
}

TEST_CASE("failures: a rank killed between 1 MiB all_reduces fails every other rank fast", "[failures]") {
  const int size = GENERATE(3, 4);
  const std::string transport = GENERATE("tcp", "shm");
  const int nsocks = transport == "tcp" ? GENERATE(1, 3) : 1;
  const milliseconds timeout = seconds(5);
  auto result = run_until_victim_dies(
      size, (1u << 20) / sizeof(float), timeout,
      [](Communicator& comm, int i) {
        if (comm.rank() == 2 && i == 3) raise(SIGKILL);
      },
      transport, 4096, nsocks);
  INFO("size " << size << ", " << transport << ", " << nsocks << " socket(s) per peer");
  check_survivors(result, 2, timeout);
}

TEST_CASE("failures: a rank that leaves between all_reduces fails every other rank fast", "[failures]") {
  // Not a crash: the rank throws, its communicator is destroyed and the
  // process exits, so its peers see orderly closes rather than resets.
  const milliseconds timeout = seconds(5);
  const std::string transport = GENERATE("tcp", "shm");
  auto result = run_until_victim_dies(
      3, (1u << 20) / sizeof(float), timeout,
      [](Communicator& comm, int i) {
        if (comm.rank() == 2 && i == 2) throw std::runtime_error("rank 2 leaves early");
      },
      transport);
  INFO(transport);
  check_survivors(result, 2, timeout, 0);
  CHECK(result.ranks[2].exit_code == 1);
}

TEST_CASE("failures: a rank killed in the middle of a 32 MiB all_reduce fails every other rank fast",
          "[failures]") {
  const int size = GENERATE(3, 4);
  const std::string transport = GENERATE("tcp", "shm");
  const milliseconds timeout = seconds(5);
  std::thread killer;  // only ever started in the forked rank 2, which never returns
  auto result = run_until_victim_dies(
      size, (32u << 20) / sizeof(float), timeout,
      [&](Communicator& comm, int i) {
        // After one complete all_reduce, a thread kills the rank while the
        // second one streams.
        if (comm.rank() == 2 && i == 1)
          killer = std::thread([] {
            std::this_thread::sleep_for(milliseconds(30));
            raise(SIGKILL);
          });
      },
      transport, 64u << 10);
  INFO("size " << size << ", " << transport);
  check_survivors(result, 2, timeout);
  for (int r = 0; r < size; ++r)
    if (r != 2) CHECK(contains(outcome_of(result.ranks[r]).text, "count 8388608"));
  // Segments are unlinked once every rank has mapped them, long before the kill.
  CHECK(result.leftover_shm == 0);
}

TEST_CASE("failures: a rank frozen in the middle of a 32 MiB all_reduce times out its peers", "[failures]") {
  // SIGSTOP keeps rank 2's sockets open and its process alive, so only the
  // timeout can catch it. Whoever times out first aborts and the other
  // survivor fails on that. Rank 0 kills the frozen rank once it has failed,
  // so that the run ends.
  const milliseconds timeout = seconds(2);
  const std::string transport = GENERATE("tcp", "shm");
  auto options = options_with(timeout, seconds(40), transport);
  options.config.segment_bytes = 64u << 10;
  auto result = test::run_ranks(
      3,
      [&](Communicator& comm) {
        std::int64_t pid = getpid();
        std::vector<std::int64_t> pids(3);
        comm.all_gather(&pid, pids.data(), 1, DataType::i64).wait();  // #1
        const std::size_t count = (32u << 20) / sizeof(float);
        std::vector<float> data(count, 1.0f);
        comm.all_reduce(data.data(), data.data(), count, DataType::f32, ReduceOp::sum).wait();  // #2
        if (comm.rank() == 2) {
          // Late enough that its status board has published a recent op.
          std::thread([] {
            std::this_thread::sleep_for(milliseconds(300));
            raise(SIGSTOP);
          }).detach();
        }
        try {
          for (int i = 0; i < 1000; ++i)
            tagged([&] { comm.all_reduce(data.data(), data.data(), count, DataType::f32, ReduceOp::max).wait(); });
        } catch (...) {
          if (comm.rank() == 0) kill(static_cast<pid_t>(pids[2]), SIGKILL);
          throw;
        }
        if (comm.rank() == 0) kill(static_cast<pid_t>(pids[2]), SIGKILL);
        throw std::runtime_error("1000 all_reduces completed although rank 2 should have frozen");
      },
      options);
  INFO(result.summary());
  INFO(transport);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[2].signal == SIGKILL);
  int timeouts = 0;
  for (int r = 0; r < 2; ++r) {
    Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK((o.type == "TimeoutError" || o.type == "RemoteError"));
    // Its own timeout, or the first one's carried in the abort reason.
    CHECK(contains(o.text, "(count 8388608, f32, max) for rank "));
    CHECK(contains(o.text, "; timed out (BRAID_TIMEOUT)"));
    CHECK(o.ms < timeout.count() + 2000);
    if (o.type == "TimeoutError") {
      ++timeouts;
      CHECK(contains(o.text, "rank " + std::to_string(r) + " waits in all_reduce #"));
      CHECK(o.ms >= timeout.count() - 50);  // the failing op took the timeout, no less
    }
  }
  CHECK(timeouts >= 1);
}

// Writes junk into every connected TCP socket of this process (its peers and
// its store connection); returns how many.
int spray_garbage() {
  int sockets = 0;
  std::vector<int> fds;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    try {
      fds.push_back(std::stoi(entry.path().filename().string()));
    } catch (const std::exception&) {
    }
  }
  const std::string junk(4096, 'X');
  for (int fd : fds) {
    int type = 0;
    socklen_t type_len = sizeof type;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) continue;
    if (::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT) > 0) ++sockets;
  }
  return sockets;
}

TEST_CASE("failures: a peer that sends garbage is reported, never reduced", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  const milliseconds timeout = seconds(5);
  const std::size_t count = GENERATE(std::size_t{1000}, std::size_t{100000});  // recursive doubling, ring
  auto options = options_with(timeout, seconds(30), "tcp");  // the junk goes into sockets
  auto result = test::run_ranks(
      2,
      [&](Communicator& comm) {
        comm.barrier().wait();  // #1
        if (comm.rank() == 1) {
          expect(spray_garbage() >= 1, "rank 1 found no TCP socket to write garbage to");
          std::this_thread::sleep_for(milliseconds(1000));
          return;
        }
        std::vector<float> data(count, 1.0f);
        tagged([&] { comm.all_reduce(data.data(), data.data(), count, DataType::f32, ReduceOp::sum).wait(); });
        throw std::runtime_error("an all_reduce with a peer sending garbage completed");
      },
      options);
  INFO(result.summary());
  INFO("count " << count);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[1].exit_code == 0);
  Outcome o = outcome_of(result.ranks[0]);
  CHECK(o.type == "RemoteError");
  CHECK(contains(o.text, "rank 0, all_reduce #2"));
  CHECK(contains(o.text, "rank 0 received bytes from rank 1 that are not a braid message header"));
  CHECK(o.ms < timeout.count());
}

// ---- 2. mismatched collectives ----------------------------------------------

// Every rank runs `call` (which differs between ranks) once a barrier has
// passed, so the mismatched call is #2, then a barrier (#3), inside tagged().
// Every rank must fail with RemoteError, in the call or at the latest in the
// barrier; `call` checks with expect() the data of a call that completes.
test::RunResult run_mismatch(int size, const std::string& transport,
                             const std::function<void(Communicator&)>& call) {
  auto options = options_with(seconds(5), seconds(30), transport);
  return test::run_ranks(
      size,
      [&](Communicator& comm) {
        comm.barrier().wait();
        tagged([&] {
          call(comm);
          comm.barrier().wait();
        });
        throw std::runtime_error("rank " + std::to_string(comm.rank()) +
                                 " completed a mismatched collective and the barrier after it");
      },
      options);
}

void check_mismatch(const test::RunResult& result, const std::vector<std::string>& words) {
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (std::size_t r = 0; r < result.ranks.size(); ++r) {
    Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK(o.type == "RemoteError");
    CHECK(o.ms < 5000);
    CHECK(contains(o.text, "mismatched collectives"));
    for (const auto& word : words) CHECK(contains(o.text, word));
  }
}

TEST_CASE("failures: all_reduce against all_gather fails both ranks naming both calls", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  const std::size_t count = GENERATE(std::size_t{8}, std::size_t{100000});  // recursive doubling, ring
  auto result = run_mismatch(2, transport, [count](Communicator& comm) {
    std::vector<float> send(count, 1.0f), recv(2 * count, -1.0f);
    if (comm.rank() == 0)
      comm.all_reduce(send.data(), recv.data(), count, DataType::f32, ReduceOp::sum).wait();
    else
      comm.all_gather(send.data(), recv.data(), count, DataType::f32).wait();
  });
  INFO("count " << count);
  check_mismatch(result, {"rank 0", "rank 1", "all_reduce #2", "all_gather #2", "count " + std::to_string(count)});
}

TEST_CASE("failures: all_reduce with different counts fails both ranks", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  const std::size_t base = GENERATE(std::size_t{8}, std::size_t{100000});
  auto result = run_mismatch(2, transport, [base](Communicator& comm) {
    std::size_t count = base + static_cast<std::size_t>(comm.rank());
    std::vector<float> send(count, 1.0f), recv(count, -1.0f);
    comm.all_reduce(send.data(), recv.data(), count, DataType::f32, ReduceOp::sum).wait();
  });
  INFO("count " << base);
  check_mismatch(result, {"rank 0", "rank 1", "all_reduce #2", "count " + std::to_string(base),
                          "count " + std::to_string(base + 1)});
}

TEST_CASE("failures: all_reduce with different dtypes fails both ranks", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  auto result = run_mismatch(2, transport, [](Communicator& comm) {
    std::vector<std::int32_t> send(8, 1), recv(8, -1);
    DataType dtype = comm.rank() == 0 ? DataType::f32 : DataType::i32;
    comm.all_reduce(send.data(), recv.data(), 8, dtype, ReduceOp::sum).wait();
  });
  check_mismatch(result, {"rank 0", "rank 1", "all_reduce #2", "f32", "i32"});
}

TEST_CASE("failures: all_reduce with different reduce ops fails both ranks", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  auto result = run_mismatch(3, transport, [](Communicator& comm) {
    std::vector<float> send(8, 1.0f), recv(8, -1.0f);
    ReduceOp op = comm.rank() == 1 ? ReduceOp::max : ReduceOp::sum;
    comm.all_reduce(send.data(), recv.data(), 8, DataType::f32, op).wait();
  });
  // Rank 2 only talks to rank 0 in recursive doubling on 3 ranks; it learns
  // of the mismatch from rank 0's abort, so only the call and op are common.
  check_mismatch(result, {"all_reduce #2", "max", "sum"});
}

TEST_CASE("failures: broadcast with different roots never completes with wrong data", "[failures]") {
  // Rank 1 calls broadcast(root 1), the others broadcast(root 0). A rank that
  // believes it is the root only sends, and in a binomial tree rank 2 gets
  // root 0's data from rank 0 itself, so a rank may finish the broadcast
  // itself — but only with the data of the root it named; the mismatch must
  // surface at the latest in the barrier that follows, on every rank.
  const std::string transport = GENERATE("tcp", "shm");
  const int size = GENERATE(2, 3);
  const std::size_t count = GENERATE(std::size_t{1000}, std::size_t{100000});  // binomial, pipelined
  INFO(transport << ", size " << size << ", count " << count);
  auto result = run_mismatch(size, transport, [count](Communicator& comm) {
    const int root = comm.rank() == 1 ? 1 : 0;
    std::vector<float> buf(count, float(comm.rank() + 1));
    comm.broadcast(buf.data(), buf.data(), buf.size(), DataType::f32, root).wait();
    bool right = std::all_of(buf.begin(), buf.end(), [&](float v) { return v == float(root + 1); });
    expect(right, "rank " + std::to_string(comm.rank()) + " completed broadcast(root " + std::to_string(root) +
                      ") with wrong data " + std::to_string(buf[0]));
  });
  check_mismatch(result, {"broadcast #2", "root"});
}

// ---- 3. timeout attribution ---------------------------------------------------

// Ranks 0 and 1 do three barriers, then all_reduce #4 (or barrier #4); rank 2
// does the three barriers and then sleeps past the timeout without calling
// anything. `late` (0, 1 or -1 for none) enters #4 700 ms after the other.
test::RunResult run_with_stopped_rank(const std::string& transport, bool use_barrier, int late,
                                      milliseconds timeout) {
  auto options = options_with(timeout, seconds(30), transport);
  return test::run_ranks(
      3,
      [&](Communicator& comm) {
        for (int i = 0; i < 3; ++i) comm.barrier().wait();
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(timeout + milliseconds(1500));
          return;
        }
        if (comm.rank() == late) std::this_thread::sleep_for(milliseconds(700));
        std::vector<float> data(256, 1.0f);
        tagged([&] {
          if (use_barrier)
            comm.barrier().wait();
          else
            comm.all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum).wait();
        });
        throw std::runtime_error("the call completed although rank 2 never entered it");
      },
      options);
}

TEST_CASE("failures: a rank that stops calling is named in the timeout with its last call", "[failures]") {
  // In the dissemination barrier ranks 0 and 1 both wait on rank 2 directly.
  // In a 3-rank (recursive doubling) all_reduce only rank 0 does, and rank 1
  // waits on rank 0; rank 1 enters late, so rank 0 times out first and rank 1
  // learns about rank 2 from rank 0's abort reason.
  const milliseconds timeout = seconds(2);
  const std::string transport = GENERATE("tcp", "shm");
  const bool use_barrier = GENERATE(false, true);
  auto result = run_with_stopped_rank(transport, use_barrier, use_barrier ? -1 : 1, timeout);
  const std::string op = use_barrier ? "barrier #4" : "all_reduce #4";
  INFO(result.summary());
  INFO(transport << ", " << op);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[2].exit_code == 0);
  for (int r = 0; r < 2; ++r) {
    Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK(contains(o.text, "waits in " + op));
    CHECK(contains(o.text, "for rank 2, which last entered barrier #3"));
    CHECK(contains(o.text, "BRAID_TIMEOUT"));
    bool direct = use_barrier || r == 0;
    if (direct) {
      CHECK(o.type == "TimeoutError");
      CHECK(contains(o.text, "rank " + std::to_string(r) + " waits in " + op));
      // It fails at the timeout, not much before and not much after.
      CHECK(o.ms >= timeout.count() - 50);
      CHECK(o.ms < timeout.count() + 2000);
    } else {
      CHECK(o.type == "RemoteError");  // rank 0 failed first and closed its connections
      CHECK(contains(o.text, "rank 0 waits in all_reduce #4"));
      CHECK(o.ms < timeout.count());
    }
  }
}

// When rank 1 enters all_reduce #4 first, it waits on rank 0 (which waits on
// rank 2) and may time out first; its message must still name rank 2, the
// rank that never called all_reduce ("behind this call: rank 2 ...").
TEST_CASE("failures: the rank that never entered is named whichever survivor times out first",
          "[failures]") {
  const milliseconds timeout = seconds(2);
  auto result = run_with_stopped_rank("tcp", false, 0, timeout);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (int r = 0; r < 2; ++r) {
    Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK(contains(o.text, "waits in all_reduce #4"));
    CHECK(contains(o.text, "rank 2"));
    CHECK(contains(o.text, "barrier #3"));
  }
}

// ---- 4. bad arguments ----------------------------------------------------------

// The call must throw InvalidUsage at once, whose message names every word.
void expect_invalid(const std::string& what, const std::function<void()>& call,
                    const std::vector<std::string>& words) {
  try {
    call();
  } catch (const InvalidUsage& e) {
    for (const auto& word : words)
      expect(contains(e.what(), word), what + ": InvalidUsage does not mention '" + word + "': " + e.what());
    return;
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": threw " + kind_of(e) + " instead of InvalidUsage: " + e.what());
  }
  throw std::runtime_error(what + ": did not throw InvalidUsage");
}

void bad_calls(Communicator& comm) {
  const int n = comm.size(), me = comm.rank(), other = (me + 1) % n;
  const std::string rank = "rank " + std::to_string(me);
  std::vector<float> buf(64, 1.0f), out(64 * static_cast<std::size_t>(n), 0.0f);
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  expect_invalid("null send buffer", [&] { comm.all_reduce(nullptr, out.data(), 8, DataType::f32, ReduceOp::sum); },
                 {rank, "all_reduce", "send buffer is null"});
  expect_invalid("null receive buffer",
                 [&] { comm.all_gather(buf.data(), nullptr, 8, DataType::f32); },
                 {rank, "all_gather", "receive buffer is null"});
  expect_invalid("null send buffer on the broadcast root",
                 [&] { comm.broadcast(nullptr, out.data(), 8, DataType::f32, me); },
                 {"broadcast", "send buffer is null"});
  expect_invalid("null receive buffer on the reduce root",
                 [&] { comm.reduce(buf.data(), nullptr, 8, DataType::f32, ReduceOp::sum, me); },
                 {"reduce", "receive buffer is null"});
  expect_invalid("root == size", [&] { comm.broadcast(buf.data(), buf.data(), 8, DataType::f32, n); },
                 {rank, "broadcast", "root " + std::to_string(n), "out of range"});
  expect_invalid("negative root", [&] { comm.reduce(buf.data(), out.data(), 8, DataType::f32, ReduceOp::sum, -1); },
                 {"reduce", "root -1", "out of range"});
  expect_invalid("send to self", [&] { comm.send(buf.data(), 8, DataType::f32, me); }, {rank, "send", "itself"});
  expect_invalid("recv from self", [&] { comm.recv(buf.data(), 8, DataType::f32, me); }, {"recv", "itself"});
  expect_invalid("peer out of range", [&] { comm.send(buf.data(), 8, DataType::f32, n + 5); },
                 {"send", "peer " + std::to_string(n + 5), "out of range"});
  expect_invalid("negative peer", [&] { comm.recv(buf.data(), 8, DataType::f32, -3); }, {"recv", "peer -3"});
  expect_invalid("invalid DataType",
                 [&] { comm.all_reduce(buf.data(), buf.data(), 8, static_cast<DataType>(99), ReduceOp::sum); },
                 {rank, "DataType", "99"});
  expect_invalid("invalid DataType on a rooted call",
                 [&] { comm.broadcast(buf.data(), buf.data(), 8, static_cast<DataType>(200), 0); },
                 {"DataType", "200"});
  expect_invalid("invalid ReduceOp",
                 [&] { comm.all_reduce(buf.data(), buf.data(), 8, DataType::f32, static_cast<ReduceOp>(99)); },
                 {rank, "ReduceOp", "99"});
  expect_invalid("invalid ReduceOp on reduce_scatter",
                 [&] { comm.reduce_scatter(out.data(), buf.data(), 8, DataType::f32, static_cast<ReduceOp>(7)); },
                 {"reduce_scatter", "ReduceOp", "7"});
  expect_invalid("count * 8 overflows",
                 [&] { comm.all_reduce(buf.data(), buf.data(), kMax / 4, DataType::f32, ReduceOp::sum); },
                 {rank, "count", "overflow"});
  expect_invalid("count * size * 8 overflows",
                 [&] { comm.all_gather(buf.data(), out.data(), kMax / 8 / static_cast<std::size_t>(n) + 1, DataType::f64); },
                 {"all_gather", "overflow"});
  expect_invalid("count * size overflows",
                 [&] { comm.all_to_all(buf.data(), out.data(), kMax / 2 + 1, DataType::u8); }, {"overflow"});
  expect_invalid("count near SIZE_MAX", [&] { comm.send(buf.data(), kMax, DataType::u8, other); }, {"overflow"});
  expect_invalid("wait() on an empty Work", [] { Work().wait(); }, {"empty Work"});
  expect_invalid("test() on an empty Work", [] { Work().test(); }, {"empty Work"});
}

TEST_CASE("failures: bad arguments throw InvalidUsage at once and the communicator still works",
          "[failures]") {
  auto options = options_with(seconds(5), seconds(30));
  auto result = test::run_ranks(
      2,
      [](Communicator& comm) {
        auto check_all_reduce = [&](std::size_t count) {
          std::vector<std::int32_t> send(count), recv(count, -1);
          for (std::size_t j = 0; j < count; ++j) send[j] = static_cast<std::int32_t>(j % 100) + comm.rank();
          comm.all_reduce(send.data(), recv.data(), count, DataType::i32, ReduceOp::sum).wait();
          for (std::size_t j = 0; j < count; ++j)
            expect(recv[j] == 2 * static_cast<std::int32_t>(j % 100) + 1,
                   "all_reduce after bad calls gave a wrong result at " + std::to_string(j));
        };
        // Only rank 0 makes bad calls first, so a bad call that consumed a
        // sequence number or sent anything would break the next collective.
        if (comm.rank() == 0) bad_calls(comm);
        check_all_reduce(1000);
        if (comm.rank() == 1) bad_calls(comm);
        check_all_reduce(100000);
        // Valid edge cases: count 0 with null buffers; a non-root needs no send buffer.
        comm.all_reduce(nullptr, nullptr, 0, DataType::f32, ReduceOp::sum).wait();
        std::vector<float> b(16, float(comm.rank() + 5));
        comm.broadcast(comm.rank() == 1 ? b.data() : nullptr, b.data(), b.size(), DataType::f32, 1).wait();
        expect(b[0] == 6.0f && b[15] == 6.0f, "broadcast from root 1 gave " + std::to_string(b[0]));
        check_all_reduce(7);
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.all_ok());
}

// ---- 5. the Work API ---------------------------------------------------------

TEST_CASE("failures: wait(timeout) on a late receive throws TimeoutError and a later wait succeeds",
          "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  auto options = options_with(seconds(10), seconds(30), transport);
  auto result = test::run_ranks(
      2,
      [](Communicator& comm) {
        const std::size_t count = 100000;  // 400 KB: runs on the progress thread, not inline
        std::vector<float> data(count);
        if (comm.rank() == 0) {
          std::iota(data.begin(), data.end(), 0.0f);
          std::this_thread::sleep_for(milliseconds(1500));
          comm.send(data.data(), count, DataType::f32, 1).wait();
          comm.barrier().wait();
          return;
        }
        auto start = SteadyClock::now();
        Work w = comm.recv(data.data(), count, DataType::f32, 0);
        expect(ms_since(start) < 500, "recv() blocked the caller for " + std::to_string(ms_since(start)) + " ms");
        expect(!w.test(), "test() is true before the sender sent");
        bool timed_out = false;
        try {
          w.wait(milliseconds(200));
        } catch (const TimeoutError& e) {
          timed_out = true;
          expect(contains(e.what(), "200 ms"), std::string("wait(200 ms) message: ") + e.what());
        }
        expect(timed_out, "wait(200 ms) returned although the sender sleeps 1.5 s");
        expect(ms_since(start) >= 190, "wait(200 ms) gave up after " + std::to_string(ms_since(start)) + " ms");
        expect(!w.test(), "test() is true after wait(timeout) timed out");
        int polls = 0;
        while (!w.test()) {
          expect(ms_since(start) < 8000, "test() still false after 8 s");
          std::this_thread::sleep_for(milliseconds(10));
          ++polls;
        }
        expect(polls > 0, "test() never returned false");
        w.wait();  // completed: returns at once
        expect(w.test(), "test() false after wait()");
        for (std::size_t j = 0; j < count; ++j)
          expect(data[j] == float(j), "received element " + std::to_string(j) + " is " + std::to_string(data[j]));
        comm.barrier().wait();
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.all_ok());
}

TEST_CASE("failures: 16 all_reduces in flight complete in order with exact results", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  auto options = options_with(seconds(10), seconds(40), transport);
  auto result = test::run_ranks(
      3,
      [](Communicator& comm) {
        const std::size_t sizes[16] = {1,      3,     17,   1000,  4099,    16384, 65537, 100003,
                                       7,      250000, 33,  8192,  1u << 18, 5,    77777, 0};
        const int n = comm.size(), r = comm.rank();
        std::vector<std::vector<float>> fsend(16), frecv(16);
        std::vector<std::vector<std::int64_t>> isend(16), irecv(16);
        std::vector<Work> works;
        auto value = [](int rank, int i, std::size_t j) { return (rank + 1) * static_cast<int>((i * 7 + j) % 13 + 1); };
        for (int i = 0; i < 16; ++i) {
          const std::size_t count = sizes[i];
          const bool in_place = i % 3 == 0;
          if (i % 2 == 0) {
            fsend[i].resize(count);
            frecv[i].assign(count, -1.0f);
            for (std::size_t j = 0; j < count; ++j) fsend[i][j] = float(value(r, i, j));
            float* out = in_place ? fsend[i].data() : frecv[i].data();
            works.push_back(comm.all_reduce(fsend[i].data(), out, count, DataType::f32,
                                            i % 4 == 2 ? ReduceOp::max : ReduceOp::sum));
          } else {
            isend[i].resize(count);
            irecv[i].assign(count, -1);
            for (std::size_t j = 0; j < count; ++j) isend[i][j] = value(r, i, j);
            std::int64_t* out = in_place ? isend[i].data() : irecv[i].data();
            works.push_back(comm.all_reduce(isend[i].data(), out, count, DataType::i64, ReduceOp::sum));
          }
        }
        const int rank_sum = n * (n + 1) / 2;
        for (int i = 0; i < 16; ++i) {
          works[i].wait();
          const bool in_place = i % 3 == 0;
          for (std::size_t j = 0; j < sizes[i]; ++j) {
            const int base = static_cast<int>((i * 7 + j) % 13 + 1);
            if (i % 2 == 0) {
              float got = in_place ? fsend[i][j] : frecv[i][j];
              float want = i % 4 == 2 ? float(n * base) : float(rank_sum * base);
              expect(got == want, "all_reduce " + std::to_string(i) + " element " + std::to_string(j) + ": " +
                                      std::to_string(got) + " != " + std::to_string(want));
            } else {
              std::int64_t got = in_place ? isend[i][j] : irecv[i][j];
              expect(got == rank_sum * base, "all_reduce " + std::to_string(i) + " element " + std::to_string(j) +
                                                 ": " + std::to_string(got));
            }
          }
        }
        for (auto& w : works) expect(w.test(), "test() false after wait()");
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.all_ok());
}

TEST_CASE("failures: after a failure queued and later calls fail with AbortedError naming it", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  auto options = options_with(seconds(5), seconds(30), transport);
  auto result = test::run_ranks(
      2,
      [](Communicator& comm) {
        const std::size_t big = 200000, small = 1000;
        std::vector<float> a(big, 1.0f), b(2 * small, 1.0f), c(big, 1.0f);
        // Issued together: a good large all_reduce, the mismatch, then two more.
        Work good = comm.all_reduce(a.data(), a.data(), big, DataType::f32, ReduceOp::sum);
        Work bad = comm.rank() == 0 ? comm.all_reduce(b.data(), b.data(), small, DataType::f32, ReduceOp::sum)
                                    : comm.all_gather(b.data(), b.data(), small, DataType::f32);
        Work queued1 = comm.barrier();
        Work queued2 = comm.all_reduce(c.data(), c.data(), big, DataType::f32, ReduceOp::sum);
        good.wait();
        expect(a[0] == 2.0f && a[big - 1] == 2.0f, "the all_reduce before the mismatch gave a wrong sum");
        std::string first;
        try {
          bad.wait();
        } catch (const RemoteError& e) {
          first = e.what();
        }
        expect(!first.empty(), "the mismatched call did not fail with RemoteError");
        for (Work* w : {&queued1, &queued2}) {
          try {
            w->wait();
            throw std::runtime_error("a call queued after the failure completed");
          } catch (const AbortedError& e) {
            expect(contains(e.what(), first), std::string("AbortedError does not carry the first error: ") + e.what());
          }
        }
        expect(c[0] == 1.0f, "an aborted all_reduce touched its buffer");
        // A call made after the failure: reported to the parent.
        tagged([&] { comm.all_reduce(a.data(), a.data(), 4, DataType::f32, ReduceOp::sum).wait(); });
        throw std::runtime_error("a call after the failure completed");
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (int r = 0; r < 2; ++r) {
    Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(o.type == "AbortedError");
    CHECK(contains(o.text, "rank " + std::to_string(r) + ", all_reduce #5"));
    CHECK(contains(o.text, "aborted by an earlier error"));
    CHECK(contains(o.text, "all_reduce #2"));
    CHECK(contains(o.text, "all_gather #2"));
  }
}

// ---- 6. split communicators --------------------------------------------------

std::vector<std::int32_t> gather_parent_ranks(Communicator& sub, int parent_rank) {
  std::int32_t mine = parent_rank;
  std::vector<std::int32_t> all(static_cast<std::size_t>(sub.size()), -1);
  sub.all_gather(&mine, all.data(), 1, DataType::i32).wait();
  return all;
}

std::string list(const std::vector<std::int32_t>& v) {
  std::string text = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) text += ' ';
    text += std::to_string(v[i]);
  }
  text += ']';
  return text;
}

TEST_CASE("failures: split by color and key, color -1, and a split of a split", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  auto options = options_with(seconds(10), seconds(45), transport);
  auto result = test::run_ranks(
      6,
      [](Communicator& comm) {
        const int me = comm.rank();
        // Colors by parity, reversed order by key = -rank.
        auto sub = comm.split(me % 2, -me);
        expect(sub != nullptr, "split with color >= 0 gave nullptr");
        std::vector<std::int32_t> members = me % 2 == 0 ? std::vector<std::int32_t>{4, 2, 0}
                                                        : std::vector<std::int32_t>{5, 3, 1};
        expect(sub->size() == 3, "sub size " + std::to_string(sub->size()));
        int want_rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
        expect(sub->rank() == want_rank, "rank " + std::to_string(me) + " has sub rank " +
                                             std::to_string(sub->rank()) + ", want " + std::to_string(want_rank));
        auto got = gather_parent_ranks(*sub, me);
        expect(got == members, "sub all_gather of parent ranks " + list(got) + ", want " + list(members));
        std::int64_t sum = me, bsum = 0;
        sub->all_reduce(&sum, &sum, 1, DataType::i64, ReduceOp::sum).wait();
        expect(sum == (me % 2 == 0 ? 6 : 9), "sub all_reduce of parent ranks " + std::to_string(sum));
        // Broadcast from sub rank 0 = parent rank 4 or 5, and the world still works.
        std::int32_t from_root = sub->rank() == 0 ? me : -1;
        sub->broadcast(&from_root, &from_root, 1, DataType::i32, 0).wait();
        expect(from_root == members[0], "sub broadcast gave " + std::to_string(from_root));
        bsum = me;
        comm.all_reduce(&bsum, &bsum, 1, DataType::i64, ReduceOp::sum).wait();
        expect(bsum == 15, "world all_reduce after the split gave " + std::to_string(bsum));

        // Color -1 takes part but gets nothing; the others form one group of 5.
        auto rest = comm.split(me == 3 ? -1 : 7, me);
        if (me == 3) {
          expect(rest == nullptr, "color -1 gave a communicator");
        } else {
          expect(rest != nullptr && rest->size() == 5, "the color-7 group does not have 5 ranks");
          auto all = gather_parent_ranks(*rest, me);
          expect(all == std::vector<std::int32_t>{0, 1, 2, 4, 5}, "color-7 members " + list(all));
        }

        // A split of the split: sub ranks {0, 1} and {2}.
        auto subsub = sub->split(sub->rank() / 2, sub->rank());
        expect(subsub != nullptr, "split of a split gave nullptr");
        std::vector<std::int32_t> want = sub->rank() < 2
                                             ? std::vector<std::int32_t>{members[0], members[1]}
                                             : std::vector<std::int32_t>{members[2]};
        auto inner = gather_parent_ranks(*subsub, me);
        expect(inner == want, "split-of-split members " + list(inner) + ", want " + list(want));
        // All three levels in turn, then once more in the other order.
        comm.barrier().wait();
        subsub->barrier().wait();
        sub->barrier().wait();
        if (rest) rest->barrier().wait();
        sub->barrier().wait();
        comm.barrier().wait();
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.all_ok());
}

// ---- 7. wrong job token, silent store ----------------------------------------

// Runs `body` in a forked child and returns what it returned, or nullopt when
// it did not finish within `deadline` (the child is then killed).
std::optional<std::string> in_child(const std::function<std::string()>& body, seconds deadline) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);  // the child must not flush the parent's buffered output again
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    close(pipe_fds[0]);
    std::string report;
    try {
      report = body();
    } catch (const std::exception& e) {
      report = "<" + kind_of(e) + " after 0 ms> " + e.what();
    }
    std::size_t done = 0;
    while (done < report.size()) {
      ssize_t n = write(pipe_fds[1], report.data() + done, report.size() - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string report;
  auto until = SteadyClock::now() + deadline;
  bool eof = false;
  while (!eof && SteadyClock::now() < until) {
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char chunk[4096];
    ssize_t n = read(pipe_fds[0], chunk, sizeof chunk);
    if (n <= 0)
      eof = true;
    else
      report.append(chunk, static_cast<std::size_t>(n));
  }
  close(pipe_fds[0]);
  if (!eof) kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  if (!eof) return std::nullopt;
  return report;
}

runtime::RankInfo rank1_of_2(std::uint16_t store_port, const std::string& token) {
  runtime::RankInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.local_rank = 1;
  info.local_world_size = 2;
  info.store_host = "127.0.0.1";
  info.store_port = store_port;
  info.store_served_by_rank0 = false;
  info.job_token = token;
  info.launcher = "test";
  return info;
}

TEST_CASE("failures: a rank with the wrong job token is refused", "[failures]") {
  runtime::StoreServer server("127.0.0.1", 0, "the-right-token");
  auto report = in_child(
      [&] {
        auto comm = Communicator::create_world(rank1_of_2(server.port(), "a-wrong-token"),
                                               test::test_config(seconds(5)));
        return std::string("created a communicator with the wrong token");
      },
      seconds(20));
  REQUIRE(report.has_value());  // no hang
  test::RankResult as_rank;
  as_rank.message = *report;
  Outcome o = outcome_of(as_rank);
  INFO(*report);
  CHECK(o.type == "RemoteError");
  CHECK(contains(o.text, "token"));
  CHECK(contains(o.text, "refused"));
}

// A store that accepts and never answers must fail create_world after the
// configured timeout, not the environment's default of minutes.
TEST_CASE("failures: a store that never answers fails create_world within the configured timeout",
          "[failures]") {
  // A listening socket that nobody accepts on: connect() completes in the
  // backlog, the handshake is written, and no answer ever comes.
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(listener, 16) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::uint16_t port = ntohs(addr.sin_port);
  const milliseconds timeout = seconds(1);
  auto start = SteadyClock::now();
  auto report = in_child(
      [&] {
        auto comm = Communicator::create_world(rank1_of_2(port, "token"), test::test_config(timeout));
        return std::string("created a communicator without a store");
      },
      seconds(6));
  long took = ms_since(start);
  close(listener);
  INFO("after " << took << " ms: " << (report ? *report : std::string("no answer: killed at the deadline")));
  REQUIRE(report.has_value());
  test::RankResult as_rank;
  as_rank.message = *report;
  Outcome o = outcome_of(as_rank);
  CHECK(o.type == "TimeoutError");
  CHECK(contains(o.text, "store"));
}

}  // namespace
