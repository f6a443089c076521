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
#include <spdlog/spdlog.h>

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
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "comm/transport/shm/transport.h"
#include "runtime/errors.h"
#include "runtime/shm_names.h"
#include "runtime/store.h"
#include "tests/comm/failure_util.h"
#include "tests/comm/harness.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;
using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace braid::test::failures;

namespace {

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

// Rank 1 is killed inside a 1 MiB all_reduce while ranks 0 and 2 wait for
// rank 3, which comes 4 s late, past the 2 s timeout. Nobody waits on rank 1
// directly, so its death shows only at the timeout; the timeout said rank 1
// was "stopped (SIGSTOP, a debugger), frozen ...", though each survivor's
// transport knew its process was gone (helper-132's F2). Now the silent
// rank is named for what the transport knows.
TEST_CASE("failures: a rank killed while its peers wait for a late one is named as gone at the timeout",
          "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  INFO(transport);
  const milliseconds timeout = seconds(2);
  auto options = options_with(timeout, seconds(60), transport);
  auto result = test::run_ranks(
      4,
      [](Communicator& comm) {
        comm.barrier().wait();
        std::vector<float> data((1u << 20) / sizeof(float), 1.0f);
        if (comm.rank() == 3) std::this_thread::sleep_for(seconds(4));
        Work work = comm.all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum);
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(milliseconds(300));
          raise(SIGKILL);
        }
        work.wait();
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[1].signal == SIGKILL);
  const std::string gone = transport == "shm" ? "rank 1 (inside all_reduce #2 but its heartbeat stood still: its "
                                                "process (pid "
                                              : "rank 1 (inside all_reduce #2 but its heartbeat stood still: its TCP "
                                                "connections to this rank closed";
  for (int r : {0, 2}) {
    const std::string& text = result.ranks[r].message;
    INFO("rank " << r << ": " << text);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK(contains(text, "rank 1"));
    CHECK_FALSE(contains(text, "SIGSTOP"));
    // Rank 2 receives from rank 1 in the ring, and may see its death at
    // once; rank 0 waits for rank 3 until the timeout.
    if (r == 0) CHECK(contains(text, gone));
  }
}

// Runs connect_shm in a child process as `rank` of ranks 0 .. local - 1 of
// one host (the set-up a communicator makes), and writes its error, or
// "ok", to `result`.
pid_t start_shm_rank(int rank, int local, std::uint16_t port, const std::string& token,
                     const std::filesystem::path& result) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  std::string what = "ok";
  try {
    runtime::Store store("127.0.0.1", port, token, seconds(10));
    shm::ShmOptions o;
    o.rank = rank;
    o.size = local;
    o.comm_id = 7;
    o.job_token = token;
    o.timeout = seconds(20);
    o.ring_bytes = 64u << 10;
    for (int r = 0; r < local; ++r) o.local_ranks.push_back(r);
    auto transport = shm::connect_shm(store, "setup", o);
  } catch (const std::exception& e) {
    what = e.what();
  }
  std::ofstream(result) << what;
  _exit(what == "ok" ? 0 : 1);
}

// Ranks 0 to 2 of 4 setting up shared memory in child processes (rank 3
// never comes, so they wait), each writing its error to a file; killed and
// reaped, with their segments, at the end.
class ShmSetUp {
 public:
  explicit ShmSetUp(const std::string& name, std::initializer_list<int> now = {0, 1, 2})
      : token_(name + "-" + std::to_string(::getpid())), server_("127.0.0.1", 0, token_), pids_(3, -1) {
    char dir_template[] = "/tmp/braid-shm-setup-XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    dir_ = dir_template;
    for (int rank : now) start(rank);
  }
  void start(int rank) {
    pids_[static_cast<std::size_t>(rank)] =
        start_shm_rank(rank, 4, server_.port(), token_, dir_ / ("rank" + std::to_string(rank)));
  }
  ~ShmSetUp() {
    for (pid_t pid : pids_)
      if (pid > 0) ::kill(pid, SIGKILL);
    for (pid_t pid : pids_)
      if (pid > 0) ::waitpid(pid, nullptr, 0);
    runtime::remove_job_segments(token_);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  pid_t pid(int rank) const { return pids_[static_cast<std::size_t>(rank)]; }
  std::uint16_t port() const { return server_.port(); }
  const std::string& token() const { return token_; }
  // Waits up to 15 s until every rank of `ranks` has mapped `owner`'s
  // segment (its /proc/PID/maps shows it).
  bool mapped(std::initializer_list<int> ranks, int owner) const {
    const std::string segment = runtime::shm_run_prefix(token_, "").substr(1) + "00000007-" +
                                std::to_string(owner);
    auto maps_it = [&](int rank) { return read("/proc/" + std::to_string(pid(rank)) + "/maps").find(segment) !=
                                          std::string::npos; };
    const auto give_up = std::chrono::steady_clock::now() + seconds(15);
    while (!std::all_of(ranks.begin(), ranks.end(), maps_it) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(milliseconds(10));
    return std::all_of(ranks.begin(), ranks.end(), maps_it);
  }
  // The rank's error, once it has exited (up to `until`).
  std::string error_of(int rank, std::chrono::steady_clock::time_point until) const {
    int status = 0;
    while (::waitpid(pid(rank), &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(milliseconds(10));
    return read(dir_ / ("rank" + std::to_string(rank)));
  }

 private:
  static std::string read(const std::filesystem::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string token_;
  runtime::StoreServer server_;
  std::filesystem::path dir_;
  std::vector<pid_t> pids_;
};

// A rank killed while the local ranks set up shared memory (after its peers
// mapped its segment, before the group was ready) wrote no failure into the
// store: its peers waited for the group's ready flag until BRAID_TIMEOUT
// and then named only that key. They now watch the pidfds of the peers they
// mapped, and name it. Once ranks 0 and 1 have mapped rank 2's segment,
// rank 2 is killed.
// Rank 2 cannot listen for TCP peers (an address not of this machine)
// once its shared memory with rank 1 is set up. Rank 1 (shared memory to
// rank 2, TCP to rank 0 only) has as a rule finished its set-up by then,
// met rank 2's closed segment in its first call, and said only that rank 2
// closed its communicator: the cause was published for set-up's waits
// alone (helper-133's F2). Every rank must give the cause.
TEST_CASE("failures: a rank whose set-up fails after a peer's has finished is explained to that peer",
          "[failures]") {
  auto options = options_with(seconds(20), seconds(60));
  options.host_of = [](int rank) { return rank == 0 ? "hostA" : "hostB"; };
  options.configure = [](int rank, runtime::Config& config) {
    if (rank == 2) config.bind_addr = "10.255.255.1";  // bind() fails: no packet is sent
  };
  auto result = test::run_ranks(
      3,
      [](Communicator& comm) {
        std::vector<float> data(1024, 1.0f);
        comm.all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum).wait();
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK(contains(result.ranks[r].message, "rank 2 cannot listen for TCP peers on 10.255.255.1"));
  }
  CHECK(result.elapsed < seconds(15));  // not the 20 s of the timeout
}

TEST_CASE("failures: a rank killed during shared-memory set-up is named by its peers at once", "[failures]") {
  ShmSetUp ranks("shm-setup-kill");
  REQUIRE(ranks.mapped({0, 1}, 2));
  REQUIRE(::kill(ranks.pid(2), SIGKILL) == 0);
  const auto killed = std::chrono::steady_clock::now();
  for (int rank : {0, 1}) {
    const std::string message = ranks.error_of(rank, killed + seconds(15));
    INFO("rank " << rank << ": " << message);
    CHECK(message.find("rank " + std::to_string(rank) + " was setting up shared memory with its local peer rank 2 "
                       "(pid " + std::to_string(ranks.pid(2)) + "), which exited or was killed") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - killed < seconds(10));  // not the 20 s of the timeout
}

// Killed after publishing its segment, before a peer mapped it: that peer
// could not watch it (no process to open a pidfd on) and waited for the
// group until BRAID_TIMEOUT (20 s here). Rank 0 waits for rank 1, which
// starts only once rank 2 is gone.
TEST_CASE("failures: a rank killed before its peers mapped its shared-memory segment is named at once",
          "[failures]") {
  ShmSetUp ranks("shm-setup-unmapped", {0, 2});
  runtime::Store store("127.0.0.1", ranks.port(), ranks.token(), seconds(10));
  REQUIRE(store.get_string("setup/shm/2", seconds(15)).rfind(runtime::shm_job_prefix(ranks.token()), 0) == 0);
  REQUIRE(::kill(ranks.pid(2), SIGKILL) == 0);
  REQUIRE(::waitpid(ranks.pid(2), nullptr, 0) == ranks.pid(2));
  ranks.start(1);
  const auto started = std::chrono::steady_clock::now();
  // Each names it, or passes on the other's report of it (whichever saw it
  // first: the one that did took its own segment away with it).
  const std::string named = "with its local peer rank 2 (pid " + std::to_string(ranks.pid(2)) +
                            "), which exited or was killed before this rank had mapped its segment";
  for (int rank : {0, 1}) {
    const std::string message = ranks.error_of(rank, started + seconds(30));
    INFO("rank " << rank << ": " << message);
    CHECK(message.find(named) != std::string::npos);
    // Passed on, it names rank 2 as the rank at fault, not the reporter.
    CHECK((message.find("because rank") == std::string::npos ||
           message.find("because rank 2 failed") != std::string::npos));
  }
  CHECK(std::chrono::steady_clock::now() - started < seconds(10));  // not the 20 s of the timeout
}

// As rank 0 does when it names rank 2's death first: it publishes its
// failure and exits. Rank 1, looking at its peers in order, named rank 0
// (8 of 20 runs of the test above under load); rank 0 said why it ended,
// rank 2 did not, and rank 2 is the one to name.
TEST_CASE("failures: a peer that ended saying why is not named for another's death in shared-memory set-up",
          "[failures]") {
  ShmSetUp ranks("shm-setup-said");
  REQUIRE(ranks.mapped({1}, 0));
  REQUIRE(ranks.mapped({1}, 2));
  runtime::Store("127.0.0.1", ranks.port(), ranks.token(), seconds(10))
      .set("setup/shm/0", std::string("!0!rank 0 saw rank 2 end"));
  REQUIRE(::kill(ranks.pid(2), SIGKILL) == 0);
  REQUIRE(::kill(ranks.pid(0), SIGKILL) == 0);
  const std::string message = ranks.error_of(1, std::chrono::steady_clock::now() + seconds(15));
  INFO(message);
  CHECK(message.find("rank 1 was setting up shared memory with its local peer rank 2 (pid " +
                     std::to_string(ranks.pid(2)) + "), which exited or was killed") != std::string::npos);
}

// The errors of a split communicator number its ranks within it: in a
// trainer's mesh "rank 1" of a tp group and of a dp group were different
// processes, and no message said which. Each now ends with the world ranks.
TEST_CASE("failures: an error on a split communicator says which world ranks its ranks are", "[failures]") {
  auto result = test::run_ranks(4, [](Communicator& comm) {
    auto half = comm.split(comm.rank() % 2, comm.rank());  // world ranks 0, 2 and 1, 3
    if (comm.rank() == 3) {
      std::this_thread::sleep_for(seconds(4));  // past rank 1's timeout
      return;
    }
    float x = 1.0f;
    half->all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum).wait();
  }, test::run_options(seconds(60), test::test_config(seconds(2))));
  INFO(result.summary());
  CHECK(result.ranks[0].ok());
  CHECK(result.ranks[2].ok());
  CHECK(result.ranks[1].exit_code == 1);
  CHECK(contains(result.ranks[1].message, "; on communicator braid/"));
  CHECK(contains(result.ranks[1].message, "/color1, whose ranks 0, 1 are world ranks 1, 3"));
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

// A rank that waits on a peer of another host (TCP) while its send to a
// peer of its own host (shared memory) is pending only polls the shared
// memory, and a local peer that closed was looked for only while a rank
// waited on it: rank 1's leaving went unnamed until rank 2, 8 s later.
TEST_CASE("failures: a local peer that leaves is named while the rank waits on a remote one", "[failures]") {
  auto options = options_with(seconds(60), seconds(40));
  options.host_of = [](int rank) { return std::string(rank < 2 ? "alpha" : "beta"); };
  auto result = test::run_ranks(
      3,
      [](Communicator& comm) {
        if (comm.rank() == 0) {
          std::vector<float> big(std::size_t{16} << 20, 1.0f), small(4);
          tagged([&] {
            Work from2 = comm.recv(small.data(), small.size(), DataType::f32, 2);
            Work to1 = comm.send(big.data(), big.size(), DataType::f32, 1);  // more than the ring holds
            from2.wait();
          });
          throw std::runtime_error("rank 0's receive from rank 2 completed");
        }
        // Rank 1 leaves without receiving; rank 2 stays silent, then leaves.
        std::this_thread::sleep_for(comm.rank() == 1 ? milliseconds(500) : milliseconds(8000));
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  const Outcome o = outcome_of(result.ranks[0]);
  CHECK(o.type == "RemoteError");
  CHECK(contains(o.text, "but rank 1 "));
  CHECK(o.ms < 5000);
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
  // so that the run ends. The timeout bounds the healthy 32 MiB calls
  // before the freeze too: 2 s was at times too little for them on two
  // loaded cores (3 ranks).
  const milliseconds timeout = seconds(5);
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

TEST_CASE("abuse: a rank frozen inside a ring all_reduce is named by every survivor, not their neighbour",
          "[failures][abuse]") {
  // Ring order 0 -> 1 -> 2 -> 3 -> 0 with rank 2 stopped: rank 3 waits for
  // rank 2, but rank 0 waits for rank 3 and rank 1 for rank 0. Each must
  // name rank 2 as the rank holding the call up (its own timeout, or the
  // first one's carried in the abort reason), and never a live neighbour.
  const milliseconds timeout = seconds(2);
  const std::string transport = GENERATE("tcp", "shm");
  auto options = options_with(timeout, seconds(40), transport);
  options.config.segment_bytes = 64u << 10;
  options.config.algo = "ring";
  auto result = test::run_ranks(
      4,
      [&](Communicator& comm) {
        std::int64_t pid = getpid();
        std::vector<std::int64_t> pids(4);
        comm.all_gather(&pid, pids.data(), 1, DataType::i64).wait();
        const std::size_t count = (8u << 20) / sizeof(float);
        std::vector<float> data(count, 1.0f);
        if (comm.rank() == 2)
          std::thread([] {
            std::this_thread::sleep_for(milliseconds(400));
            raise(SIGSTOP);
          }).detach();
        auto stop_frozen = [&] {
          if (comm.rank() == 0) kill(static_cast<pid_t>(pids[2]), SIGKILL);
        };
        try {
          for (int i = 0; i < 100000; ++i)
            tagged([&] { comm.all_reduce(data.data(), data.data(), count, DataType::f32, ReduceOp::max).wait(); });
        } catch (...) {
          stop_frozen();
          throw;
        }
        stop_frozen();
        throw std::runtime_error("every all_reduce completed although rank 2 should have frozen");
      },
      options);
  INFO(result.summary());
  INFO(transport);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[2].signal == SIGKILL);
  for (int r : {0, 1, 3}) {
    Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(result.ranks[r].exit_code == 1);
    CHECK((o.type == "TimeoutError" || o.type == "RemoteError"));
    CHECK(contains(o.text, "holding this call up: rank 2 ("));
    for (int live : {0, 1, 3}) CHECK_FALSE(contains(o.text, "holding this call up: rank " + std::to_string(live)));
    CHECK(o.ms < timeout.count() + 3000);
  }
}

// Every rank all_reduces `count` floats (max) until one fails; rank 2 stops
// itself (SIGSTOP) after `delay`, and rank 0 kills it once it has failed.
void all_reduce_until_rank_2_freezes(Communicator& comm, std::size_t count, milliseconds delay) {
  std::int64_t pid = getpid();
  std::vector<std::int64_t> pids(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&pid, pids.data(), 1, DataType::i64).wait();
  std::vector<float> data(count, 1.0f);
  if (comm.rank() == 2)
    std::thread([delay] {
      std::this_thread::sleep_for(delay);
      raise(SIGSTOP);
    }).detach();
  try {
    for (long i = 0; i < 100000000; ++i)
      tagged([&] { comm.all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::max).wait(); });
  } catch (...) {
    if (comm.rank() == 0) kill(static_cast<pid_t>(pids[2]), SIGKILL);
    throw;
  }
  throw std::runtime_error("every all_reduce completed although rank 2 should have frozen");
}

// A rank's report of where it is may be up to 100 ms older than its stop,
// and a rank making small calls makes thousands in that time: the holder
// named "inside all_reduce #N" had gone on to later calls. The message now
// gives the range the stop lies in, ending at the waiter's own call.
TEST_CASE("abuse: a rank frozen among many small calls is placed in a range ending at the waiter's call",
          "[failures][abuse]") {
  const milliseconds timeout = seconds(2);
  auto options = options_with(timeout, seconds(40), "shm");
  int named_inside = 0;
  for (int attempt = 0; attempt < 3 && named_inside == 0; ++attempt) {
    auto result = test::run_ranks(
        3,
        [](Communicator& comm) { all_reduce_until_rank_2_freezes(comm, 16, milliseconds(700)); },
        options);
    INFO(result.summary());
    REQUIRE_FALSE(result.timed_out);
    for (int r : {0, 1}) {
      const Outcome o = outcome_of(result.ranks[r]);
      INFO("rank " << r << ": " << o.text);
      const std::regex waits("rank " + std::to_string(r) + " waits in all_reduce #([0-9]+)");
      // Inside a call, or between calls (its heartbeat beats there too).
      const std::regex holder("holding this call up: rank 2 \\((inside|after) all_reduce #([0-9]+)(.*)"
                              "(?: but|, and) its heartbeat stood still");
      std::smatch w, h;
      if (o.type != "TimeoutError" || !std::regex_search(o.text, w, waits) || !std::regex_search(o.text, h, holder))
        continue;  // the other survivor's abort
      ++named_inside;
      const auto call = std::stoull(w[1]), reported = std::stoull(h[2]);
      CHECK(reported <= call);
      if (reported < call) CHECK(contains(h[3], " (its last report) or a later call up to #" + std::to_string(call)));
    }
  }
  CHECK(named_inside > 0);
}

// A rank stopped between two calls published nothing more: its report
// named the call it was in up to 100 ms earlier, hundreds of calls back
// among small ones, as the call it "last entered", and its silence went
// unseen (the heartbeat beat only inside calls; a review helper's case).
TEST_CASE("abuse: a rank stopped between calls is named as stopped, by its silent heartbeat", "[failures][abuse]") {
  const milliseconds timeout = seconds(2);
  auto options = options_with(timeout, seconds(40), "shm");
  auto result = test::run_ranks(
      2,
      [](Communicator& comm) {
        std::int64_t pid = getpid();
        std::vector<std::int64_t> pids(2);
        comm.all_gather(&pid, pids.data(), 1, DataType::i64).wait();
        std::vector<float> data(16, 1.0f);
        const auto start = SteadyClock::now();
        try {
          for (;;) {
            tagged([&] { comm.all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum).wait(); });
            if (comm.rank() == 1 && SteadyClock::now() - start > milliseconds(700)) {
              // Long enough between calls that its report says so.
              std::this_thread::sleep_for(milliseconds(250));
              raise(SIGSTOP);
            }
          }
        } catch (...) {
          kill(static_cast<pid_t>(pids[1]), SIGKILL);
          throw;
        }
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[1].signal == SIGKILL);
  const Outcome o = outcome_of(result.ranks[0]);
  INFO(o.text);
  CHECK(o.type == "TimeoutError");
  CHECK(contains(o.text, "holding this call up: rank 1 (after all_reduce #"));
  CHECK(contains(o.text, ", and its heartbeat stood still for the 600 ms watched"));
}

// Across hosts a timeout names the hosts of the ranks it names, as NCCL
// names a peer's address: which machine to look at.
TEST_CASE("abuse: across hosts a timeout places the waited-for and the holding rank on their hosts",
          "[failures][abuse]") {
  const milliseconds timeout = seconds(2);
  auto options = options_with(timeout, seconds(40), "auto");
  options.host_of = [](int rank) { return std::string(rank < 2 ? "alpha" : "beta"); };
  auto result = test::run_ranks(
      4,
      [](Communicator& comm) { all_reduce_until_rank_2_freezes(comm, 1u << 16, milliseconds(300)); },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  int placed = 0;
  for (int r : {0, 1, 3}) {
    const Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << o.text);
    CHECK(result.ranks[r].exit_code == 1);
    if (o.type != "TimeoutError") continue;  // the others fail on the first one's abort
    CHECK(contains(o.text, "which runs on "));
    CHECK(contains(o.text, "holding this call up: rank 2 (on beta, "));
    ++placed;
  }
  CHECK(placed > 0);
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

// The same over shared memory, which carried no farewell: rank 1 failed on
// rank 0's death, and rank 2, waiting for rank 1, named only rank 1 ("closed
// its communicator"), never rank 0, the store that carried the reason gone
// with rank 0 (a review helper's case). Receives in a chain, so that rank 2
// hears of rank 0 through rank 1 alone.
TEST_CASE("failures: over shared memory, where rank 0 served the store, a rank hears why its peer failed",
          "[failures]") {
  auto options = options_with(seconds(10), seconds(45), "shm");
  options.store_by_rank0 = true;
  auto result = test::run_ranks(
      3,
      [&](Communicator& comm) {
        std::vector<float> data(1000, 0.0f);
        comm.barrier().wait();
        if (comm.rank() == 0) {
          std::this_thread::sleep_for(milliseconds(300));
          raise(SIGKILL);
        }
        tagged([&] { comm.recv(data.data(), data.size(), DataType::f32, comm.rank() - 1).wait(); });
        throw std::runtime_error("the receive completed although no rank sent");
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[0].signal == SIGKILL);
  const Outcome one = outcome_of(result.ranks[1]), two = outcome_of(result.ranks[2]);
  CHECK((contains(one.text, "rank 0") && contains(one.text, "exited or was killed")));
  CHECK(two.type == "RemoteError");
  CHECK((contains(two.text, "rank 1 stopped its communicator and told rank 2 why") &&
         contains(two.text, "rank 0") && contains(two.text, "exited or was killed")));
  CHECK(two.ms < 5000);
}

// Without a launcher rank 0's communicator serves the store that carries a
// failed rank's reason to the others, so when rank 0 fails first the reason
// must travel on the TCP connections themselves (a farewell frame): a rank
// that only hears of it from a neighbour's closed socket named that
// neighbour, alive, as the one that "exited, crashed or aborted".
TEST_CASE("failures: over TCP, where rank 0 served the store, every rank names rank 0's failure", "[failures]") {
  const std::string what = GENERATE("killed", "mismatch");
  const int nsocks = GENERATE(1, 3);
  INFO("rank 0 " << what << ", " << nsocks << " socket(s) per peer");
  auto options = options_with(seconds(10), seconds(45), "tcp");
  options.store_by_rank0 = true;
  options.config.tcp_nsocks = nsocks;
  const std::size_t count = 1u << 16;  // the ring: ranks 2 and 3 hear from rank 0 only through rank 1
  auto result = test::run_ranks(
      4,
      [&](Communicator& comm) {
        std::vector<float> send(count, 1.0f), recv(count, 0.0f);
        for (int i = 0; i < 5; ++i) {
          if (comm.rank() == 0 && i == 3 && what == "killed") raise(SIGKILL);
          const ReduceOp op = comm.rank() == 0 && i == 3 ? ReduceOp::max : ReduceOp::sum;
          tagged([&] { comm.all_reduce(send.data(), recv.data(), count, DataType::f32, op).wait(); });
        }
        throw std::runtime_error("the all_reduces completed although rank 0 failed in the fourth");
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  for (int r = what == "killed" ? 1 : 0; r < 4; ++r) {
    const Outcome o = outcome_of(result.ranks[r]);
    INFO("rank " << r << ": " << result.ranks[r].message);
    CHECK(o.type == "RemoteError");
    CHECK(o.ms < 5000);
    CHECK(contains(o.text, "all_reduce #4"));
    if (what == "killed") {
      CHECK(contains(o.text, "from rank 0 ("));
      CHECK((contains(o.text, "rank 0 exited, crashed or aborted") ||
             contains(o.text, "rank 0 closed its communicator, or exited, crashed or aborted")));
    } else {
      CHECK(contains(o.text, "mismatched collectives"));
    }
    // Nobody alive is blamed as dead.
    for (int alive = 1; alive < 4; ++alive) {
      CHECK_FALSE(contains(o.text, "rank " + std::to_string(alive) + " exited, crashed or aborted"));
      CHECK_FALSE(contains(o.text, "rank " + std::to_string(alive) + " closed its communicator"));
    }
  }
}

// A rank that only destroyed its communicator (its process running on)
// closes its sockets in order: its peers were told it "exited, crashed or
// aborted" (found by a review helper).
TEST_CASE("failures: over TCP, a peer that closed its communicator is not called crashed", "[failures]") {
  auto options = options_with(seconds(10), seconds(40), "tcp");
  options.own_world = [](std::unique_ptr<Communicator> world, const runtime::RankInfo&, const runtime::Config&) {
    if (world->rank() == 2) {
      world.reset();
      std::this_thread::sleep_for(seconds(3));  // alive while the others find out
      return;
    }
    std::vector<float> data(1000, 1.0f);
    try {
      world->all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum).wait();
    } catch (const RemoteError& e) {
      expect(contains(e.what(), "rank 2 closed its communicator"), std::string("the error: ") + e.what());
      return;
    }
    throw std::runtime_error("the all_reduce completed without rank 2");
  };
  auto result = test::run_ranks(3, {}, options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.all_ok());
}

TEST_CASE("failures: broadcast with different roots never completes with wrong data", "[failures]") {
  // Rank 1 calls broadcast(root 1), the others broadcast(root 0). A rank that
  // believes it is the root would only send; the signature agreement before
  // the broadcast fails every rank in the broadcast itself (#2), none of
  // them with data.
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

// What destroying `comm` logs at error level, through a file in place of
// stderr (the harness's ranks log nothing otherwise).
std::string logged_as_destroyed(std::unique_ptr<Communicator> comm) {
  char path[] = "/tmp/braid-end-log-XXXXXX";
  const int file = ::mkstemp(path);
  expect(file >= 0, "mkstemp");
  ::unlink(path);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(file, STDERR_FILENO);
  spdlog::set_level(spdlog::level::err);
  comm.reset();
  spdlog::default_logger()->flush();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::string log(65536, '\0');
  const ssize_t got = ::pread(file, log.data(), log.size(), 0);
  ::close(file);
  log.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
  return log;
}

// The one-shot broadcast's roots leave early, and a rank that names itself
// the root reads nobody's slot: two such roots each kept their own data,
// and where the broadcast was the job's last call (weights sent out before
// exit) nothing ever said so (a review helper's case). The communicator's
// end now checks what no later call did, and logs the mismatch.
TEST_CASE("failures: two ranks that each root a job's last small broadcast are told as they end", "[failures]") {
  const bool mismatched = GENERATE(false, true);
  auto options = options_with(seconds(10), seconds(60), "shm");
  options.own_world = [mismatched](std::unique_ptr<Communicator> world, const runtime::RankInfo&,
                                   const runtime::Config&) {
    std::vector<float> data(37, float(world->rank() + 1));
    world->broadcast(data.data(), data.data(), data.size(), DataType::f32, 0).wait();  // #1: alike
    const int root = mismatched ? world->rank() : 1;
    world->broadcast(data.data(), data.data(), data.size(), DataType::f32, root).wait();  // #2
    const std::string log = logged_as_destroyed(std::move(world));
    const bool said = contains(log, "mismatched collectives") && contains(log, "broadcast #2") &&
                      contains(log, "destroyed the communicator");
    expect(said == mismatched, (mismatched ? "no mismatch logged at the end: " : "a mismatch logged: ") + log);
  };
  auto result = test::run_ranks(2, {}, options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.all_ok());
}

// A call whose Work was dropped without a wait (a job's last all_reduce,
// issued and forgotten) failed without a word anywhere: its error went
// only to the Work, and the program ended 0. The communicator's end now
// says a failure that no wait() or test() threw; one that was thrown is
// not said again.
TEST_CASE("failures: an error no wait saw is logged as the communicator ends", "[failures]") {
  const std::string transport = GENERATE("tcp", "shm");
  const bool waited = GENERATE(false, true);
  INFO(transport << (waited ? ", the failed call waited" : ", its Work dropped"));
  auto options = options_with(seconds(10), seconds(60), transport);
  options.own_world = [waited](std::unique_ptr<Communicator> world, const runtime::RankInfo&, const runtime::Config&) {
    world->barrier().wait();  // #1
    if (world->rank() == 1) {
      world->abort("rank 1 leaves");  // rank 0's all_reduce #2 fails by name
      return;
    }
    std::vector<float> data(1000, 1.0f);
    Work work = world->all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum);
    if (waited) {
      bool threw = false;
      try {
        work.wait();
      } catch (const Error&) {
        threw = true;
      }
      expect(threw, "all_reduce #2 did not fail");
    }
    work = Work();
    const std::string log = logged_as_destroyed(std::move(world));
    const bool said = contains(log, "all_reduce #2") && contains(log, "rank 1 leaves") &&
                      contains(log, "no wait() or test() of this communicator's calls threw it");
    expect(said == !waited, (waited ? "said again at the end: " : "not said at the end: ") + log);
  };
  auto result = test::run_ranks(2, {}, options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.all_ok());
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
  // In a 3-rank (recursive doubling) all_reduce over TCP only rank 0 does,
  // and rank 1 waits on rank 0; rank 1 enters late, so rank 0 times out first
  // and rank 1 learns about rank 2 from rank 0's abort reason. Over shm the
  // small all_reduce is one-shot through the shared slots, where every rank
  // waits on rank 2's slot directly.
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
    bool direct = use_barrier || r == 0 || transport == "shm";
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
// rank that never called all_reduce ("holding this call up: rank 2 ...").
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

}  // namespace
