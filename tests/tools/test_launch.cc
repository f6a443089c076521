// End-to-end tests of braid-launch: the real binary, shell scripts as ranks.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "launch_harness.h"
#include "runtime/errors.h"
#include "runtime/rank_info.h"
#include "runtime/shm_names.h"
#include "runtime/store.h"
#include "tools/launcher/process.h"

using namespace braid::test;

namespace {

// Every rank records its pid, then runs the rest of the script.
std::string recording(const std::string& script) {
  return "echo $$ > \"$0/pid_$BRAID_RANK\"; " + script;
}

std::map<std::string, std::string> rank_env(const JobDir& dir, int rank) {
  return parse_env(read_file(dir.path() / ("env_" + std::to_string(rank))));
}

std::uint16_t port_of(const std::string& host_port) {
  return static_cast<std::uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1)));
}

// Sets variables in this process for the scope of one check, then restores them.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value)
        setenv(name.c_str(), value->c_str(), 1);
      else
        unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

void check_no_rank_survives(const JobDir& dir, int expected_ranks) {
  auto pids = dir.recorded_pids();
  CHECK(static_cast<int>(pids.size()) == expected_ranks);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank << " pid " << pid);
    CHECK_FALSE(process_exists(pid));
  }
}

// A FIFO in the job directory that the test holds open (read-write, so that
// the launcher's open does not wait for a reader, and its writes never see
// EPIPE) and reads only when it chooses: a reader of braid-launch's stdout
// that stalls.
class StalledReader {
 public:
  explicit StalledReader(const JobDir& dir) : path_(dir.path() / "stdout") {
    REQUIRE(mkfifo(path_.c_str(), 0600) == 0);
    fd_.reset(::open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
    REQUIRE(fd_.valid());
  }
  const std::filesystem::path& path() const { return path_; }
  // Reads until `bytes` have come or the limit has passed.
  std::string read(std::size_t bytes, std::chrono::milliseconds limit) {
    std::string text;
    auto deadline = std::chrono::steady_clock::now() + limit;
    char buffer[65536];
    while (text.size() < bytes && std::chrono::steady_clock::now() < deadline) {
      pollfd ready{fd_.get(), POLLIN, 0};
      if (::poll(&ready, 1, 100) <= 0) continue;
      ssize_t n = ::read(fd_.get(), buffer, sizeof buffer);
      if (n > 0) text.append(buffer, static_cast<std::size_t>(n));
    }
    return text;
  }

 private:
  std::filesystem::path path_;
  braid::launcher::UniqueFd fd_;
};

// braid-launch with its stdout (and with stderr_too its stderr) on the
// reader's FIFO; the shell execs it, so the job's pid is the launcher's.
std::unique_ptr<LaunchedJob> launch_into(const StalledReader& reader, const JobDir& dir,
                                         const std::vector<std::string>& args, bool stderr_too) {
  const char* launcher = std::getenv("BRAID_LAUNCH");
  REQUIRE(launcher);
  std::vector<std::string> argv{"/bin/sh", "-c", stderr_too ? "exec \"$@\" > \"$0\" 2>&1" : "exec \"$@\" > \"$0\"",
                                reader.path().string(), launcher};
  argv.insert(argv.end(), args.begin(), args.end());
  return LaunchedJob::program(dir, "launcher", argv);
}

// Sends the launcher (a child of the test) SIGTSTP, as Ctrl-Z does, and
// says whether it stopped within 10 s.
bool stops_on_ctrl_z(pid_t launcher) {
  REQUIRE(::kill(launcher, SIGTSTP) == 0);
  int status = 0;
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (::waitpid(launcher, &status, WUNTRACED | WNOHANG) == 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(20ms);
  return WIFSTOPPED(status);
}

}  // namespace

TEST_CASE("each rank gets the braid and torchrun environment", "[launch]") {
  JobDir dir;
  auto result = run_launch(dir, shell_job(3, "env > \"$0/env_$BRAID_RANK\"", dir),
                           {{"OMP_NUM_THREADS", std::nullopt}, {"BRAID_JOB_TOKEN", std::nullopt},
                            {"BRAID_RUN_ID", std::nullopt}});
  INFO(result.out << result.err);
  REQUIRE(result.status == 0);
  std::string token = rank_env(dir, 0).at("BRAID_JOB_TOKEN");
  CHECK(token.size() == 32);
  std::string run_id = rank_env(dir, 0).at("BRAID_RUN_ID");
  CHECK(run_id.size() == 16);
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    auto env = rank_env(dir, rank);
    std::string r = std::to_string(rank);
    CHECK(env.at("BRAID_RANK") == r);
    CHECK(env.at("RANK") == r);
    CHECK(env.at("BRAID_LOCAL_RANK") == r);
    CHECK(env.at("LOCAL_RANK") == r);
    CHECK(env.at("BRAID_WORLD_SIZE") == "3");
    CHECK(env.at("BRAID_LINE_PREFIX") == "[rank " + r + "] ");
    CHECK(env.at("WORLD_SIZE") == "3");
    CHECK(env.at("BRAID_LOCAL_WORLD_SIZE") == "3");
    CHECK(env.at("LOCAL_WORLD_SIZE") == "3");
    CHECK(env.at("BRAID_NODE_RANK") == "0");
    CHECK(env.at("GROUP_RANK") == "0");
    // The rest of what torchrun sets for a job of one role.
    CHECK(env.at("ROLE_NAME") == "default");
    CHECK(env.at("ROLE_RANK") == r);
    CHECK(env.at("ROLE_WORLD_SIZE") == "3");
    CHECK(env.at("GROUP_WORLD_SIZE") == "1");
    CHECK(env.at("TORCHELASTIC_RUN_ID") == run_id);
    CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "0");
    CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(env.at("BRAID_STORE_ADDR").rfind("127.0.0.1:", 0) == 0);
    CHECK(port_of(env.at("BRAID_STORE_ADDR")) != 0);
    CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
    // MASTER_PORT is left to torch.distributed's own store (issue 16).
    CHECK(env.at("MASTER_PORT") != std::to_string(port_of(env.at("BRAID_STORE_ADDR"))));
    CHECK(env.at("BRAID_JOB_TOKEN") == token);
    CHECK(env.at("BRAID_RUN_ID") == run_id);
    CHECK(env.at("OMP_NUM_THREADS") == "1");
    CHECK(env.at("OPENBLAS_NUM_THREADS") == "1");
  }

  SECTION("the runtime reads it as launched by braid-launch") {
    auto env = rank_env(dir, 2);
    ScopedEnv scoped({{"BRAID_RANK", env.at("BRAID_RANK")},
                      {"BRAID_WORLD_SIZE", env.at("BRAID_WORLD_SIZE")},
                      {"BRAID_LOCAL_RANK", env.at("BRAID_LOCAL_RANK")},
                      {"BRAID_LOCAL_WORLD_SIZE", env.at("BRAID_LOCAL_WORLD_SIZE")},
                      {"BRAID_NODE_RANK", env.at("BRAID_NODE_RANK")},
                      {"BRAID_STORE_ADDR", env.at("BRAID_STORE_ADDR")},
                      {"BRAID_JOB_TOKEN", env.at("BRAID_JOB_TOKEN")},
                      {"BRAID_RUN_ID", env.at("BRAID_RUN_ID")}});
    auto info = braid::runtime::rank_info_from_env();
    CHECK(info.launcher == "braid-launch");
    CHECK(info.run_id == run_id);
    CHECK(info.rank == 2);
    CHECK(info.world_size == 3);
    CHECK(info.store_port == port_of(env.at("BRAID_STORE_ADDR")));
    CHECK(info.job_token == token);
    CHECK_FALSE(info.store_served_by_rank0);
  }

  SECTION("a second launch gets another token and keeps OMP_NUM_THREADS") {
    JobDir second;
    auto again = run_launch(second, shell_job(1, "env > \"$0/env_$BRAID_RANK\"", second),
                            {{"OMP_NUM_THREADS", "4"}, {"BRAID_RUN_ID", std::nullopt}});
    REQUIRE(again.status == 0);
    auto env = rank_env(second, 0);
    CHECK(env.at("BRAID_JOB_TOKEN") != token);
    CHECK(env.at("BRAID_RUN_ID") != run_id);
    CHECK(env.at("OMP_NUM_THREADS") == "4");
  }
}

// Every rank connects to the store at --master-addr: a mistyped address of
// another machine, or node 0's loopback one, left every node waiting until
// BRAID_TIMEOUT. Both are said (another machine's address may forward to
// node 0, as a Kubernetes service does, so it is not refused). 192.0.2.1 is
// TEST-NET-1: only bound, never sent to (the program connects nowhere).
TEST_CASE("node 0 warns of a --master-addr that is not its own and of a loopback one", "[launch]") {
  JobDir dir;
  auto foreign = run_launch(dir, shell_job(1, "true", dir, {"--nnodes", "2", "--node-rank", "0", "--master-addr",
                                                            "192.0.2.1", "--master-port", "29519"}),
                            {{"BRAID_JOB_TOKEN", "shared-secret"}});
  // Its status depends on this machine's routes (a node without one to the
  // address stops, saying to set BRAID_BIND_ADDR); the warning comes first.
  CHECK_THAT(foreign.err, Catch::Contains("--master-addr 192.0.2.1 is not an address of this machine"));
  auto loopback = run_launch(dir, shell_job(1, "true", dir, {"--nnodes", "2", "--node-rank", "0", "--master-port", "29519"}),
                             {{"BRAID_JOB_TOKEN", "shared-secret"}});
  CHECK(loopback.status == 0);
  CHECK_THAT(loopback.err, Catch::Contains("which only this machine reaches"));
  // A name that resolves to loopback too.
  auto named = run_launch(dir, shell_job(1, "true", dir, {"--nnodes", "2", "--node-rank", "0", "--master-addr",
                                                          "localhost", "--master-port", "29519"}),
                          {{"BRAID_JOB_TOKEN", "shared-secret"}});
  CHECK(named.status == 0);
  CHECK_THAT(named.err, Catch::Contains("which only this machine reaches"));
}

// torchrun's c10d rendezvous numbers the nodes itself: the same command on
// every node. Without --node-rank every launcher here took node 0, and
// their ranks met as duplicates.
TEST_CASE("nodes started without --node-rank are numbered as they join, node 0 at --master-addr", "[launch]") {
  JobDir dir;
  const char* bench = std::getenv("BRAID_BENCH");
  REQUIRE(bench != nullptr);
  const std::string script = recording("echo \"$GROUP_RANK $LOCAL_RANK\" > \"$0/node_of_$RANK\"; exec " +
                                       std::string(bench) + " -b 8 -e 8 -n 1 -w 0");
  const std::vector<std::string> same{"--nnodes", "3", "--master-port", std::to_string(29600 + ::getpid() % 200)};
  std::vector<std::unique_ptr<LaunchedJob>> nodes;
  for (int n = 0; n < 3; ++n)
    nodes.push_back(std::make_unique<LaunchedJob>(dir, shell_job(2, script, dir, same),
                                                  EnvChanges{{"BRAID_JOB_TOKEN", "join-order-secret"}}));
  for (auto& node : nodes) CHECK(node->wait(60s) == 0);
  std::set<std::string> seen;
  for (int rank = 0; rank < 6; ++rank) {
    const std::string text = read_file(dir.path() / ("node_of_" + std::to_string(rank)));
    CHECK(text == std::to_string(rank / 2) + " " + std::to_string(rank % 2) + "\n");
    seen.insert(text);
  }
  CHECK(seen.size() == 6);
  // Without a shared token no node can know it is node 0 before it binds.
  auto tokenless = run_launch(dir, shell_job(1, "true", dir, same), {{"BRAID_JOB_TOKEN", std::nullopt}});
  CHECK(tokenless.status == 2);
  CHECK_THAT(tokenless.err, Catch::Contains("needs the same BRAID_JOB_TOKEN") && Catch::Contains("--node-rank"));
}

// A second node 0 of one job served a store of its own on the next port;
// each half of the job then waited out BRAID_TIMEOUT for the other.
TEST_CASE("a second node 0 of a job is refused at once", "[launch]") {
  const EnvChanges env{{"BRAID_JOB_TOKEN", "two-node-zeros"}, {"BRAID_TIMEOUT", "20"}};
  const std::vector<std::string> zero{"--nnodes", "2", "--node-rank", "0", "--master-port", "29539"};
  const std::vector<std::string> joining{"--nnodes", "2", "--master-port", "29539"};  // becomes node 0: first
  for (const auto& first_how : {zero, joining}) {
    JobDir dir, other;
    LaunchedJob first(dir, shell_job(1, recording("sleep 30"), dir, first_how), env);
    wait_for_file(dir.path() / "pid_0");
    auto second = run_launch(other, shell_job(1, "true", other, zero), env);
    INFO(second.err);
    CHECK(second.status == 2);
    CHECK_THAT(second.err, Catch::Contains("another node 0 of this job already serves the store"));
    ::kill(first.pid(), SIGTERM);
    first.wait(20s);
  }
}

TEST_CASE("a non-zero node numbers its ranks globally and shares the token", "[launch]") {
  std::vector<std::string> node1{"--nnodes", "2", "--node-rank", "1", "--master-addr",
                                 "127.0.0.1", "--master-port", "29517"};
  JobDir dir;
  auto result = run_launch(dir, shell_job(2, "env > \"$0/env_$BRAID_LOCAL_RANK\"", dir, node1),
                           {{"BRAID_JOB_TOKEN", "shared-secret"}});
  REQUIRE(result.status == 0);
  for (int local = 0; local < 2; ++local) {
    auto env = rank_env(dir, local);
    CHECK(env.at("BRAID_RANK") == std::to_string(2 + local));
    CHECK(env.at("BRAID_WORLD_SIZE") == "4");
    CHECK(env.at("BRAID_LOCAL_RANK") == std::to_string(local));
    CHECK(env.at("BRAID_NODE_RANK") == "1");
    CHECK(env.at("GROUP_RANK") == "1");
    CHECK(env.at("GROUP_WORLD_SIZE") == "2");
    CHECK(env.at("ROLE_RANK") == std::to_string(2 + local));
    CHECK(env.at("ROLE_WORLD_SIZE") == "4");
    CHECK(env.at("BRAID_STORE_ADDR") == "127.0.0.1:29517");
    CHECK(env.at("BRAID_JOB_TOKEN") == "shared-secret");
  }
}

// Nodes started with different --nproc-per-node disagree on the world
// size: node 1's ranks (2 and 3 of 4) waited for rank 1 until BRAID_TIMEOUT,
// naming a store key. They now fail at once, saying what differs. Node 0's
// rank, which meets no foreign world size (it waits for a rank 1 that never
// comes), waited out BRAID_TIMEOUT too; it now fails with node 1's reason.
TEST_CASE("nodes started with different --nproc-per-node are told so at once", "[launch]") {
  const char* bench = std::getenv("BRAID_BENCH");
  REQUIRE(bench != nullptr);
  const EnvChanges env{{"BRAID_JOB_TOKEN", "nproc-mismatch"}, {"BRAID_TIMEOUT", "8"}};
  const std::vector<std::string> program{"--", bench, "-b", "8", "-e", "8", "-n", "1", "-w", "0"};
  auto node = [&](const char* nproc, const char* node_rank) {
    std::vector<std::string> args{"-n", nproc, "--nnodes", "2", "--node-rank", node_rank, "--master-addr",
                                  "127.0.0.1", "--master-port", "29533"};
    args.insert(args.end(), program.begin(), program.end());
    return args;
  };
  JobDir dir0, dir1;
  LaunchedJob node0(dir0, node("1", "0"), env);  // rank 0 of 2
  const auto started = std::chrono::steady_clock::now();
  auto node1 = run_launch(dir1, node("2", "1"), env);  // ranks 2 and 3 of 4
  const auto took = std::chrono::steady_clock::now() - started;
  INFO(node1.out << node1.err);
  CHECK(node1.status != 0);
  CHECK_THAT(node1.err, Catch::Contains("rank 0 of this job was started in a world of 2 ranks, this one in a world "
                                        "of 4") &&
                            Catch::Contains("the same --nproc-per-node") &&
                            !Catch::Contains("--node-rank"));  // node ranks were fine: not the remedy
  CHECK(took < std::chrono::seconds(6));  // not the 8 s of BRAID_TIMEOUT
  CHECK(node0.wait(std::chrono::seconds(30)) != 0);
  const auto node0_took = std::chrono::steady_clock::now() - started;
  INFO(node0.out() << node0.err());
  CHECK_THAT(node0.err(), Catch::Contains("cannot create communicator braid/world because rank ") &&  // 2 or 3
                              Catch::Contains("started in a world of 2 ranks, this one in a world of 4"));
  CHECK(node0_took < std::chrono::seconds(6));
}

namespace {

// A port on loopback held by a program that is not a store: it listens
// and never answers (the kernel completes each connection into its
// backlog), as an HTTP server waits for the client to speak first.
struct SilentListener {
  braid::launcher::UniqueFd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  int port = 0;
  SilentListener() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t addr_bytes = sizeof addr;
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd.get(), 16) == 0);
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &addr_bytes) == 0);
    port = ntohs(addr.sin_port);
  }
};

// braid-launch's arguments for node `node_rank` of `nnodes`, one rank each,
// with the store at 127.0.0.1:`port`, running `program`.
std::vector<std::string> one_rank_node(int nnodes, const char* node_rank, int port,
                                       const std::vector<std::string>& program) {
  std::vector<std::string> args{"-n", "1", "--nnodes", std::to_string(nnodes), "--node-rank", node_rank,
                                "--master-addr", "127.0.0.1", "--master-port", std::to_string(port), "--"};
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

}  // namespace

// A rank that fails before it joins (a bad flag, an address it cannot
// bind) left the other nodes' ranks waiting for it until BRAID_TIMEOUT; its
// launcher now says so through the store and they fail at once with that.
// Three nodes: node 0's store must outlive its own ranks long enough for
// node 2's to read it too (they lost it, and blamed node 0, half the time).
TEST_CASE("a rank of one node that fails before joining fails the other nodes at once", "[launch]") {
  const char* bench = std::getenv("BRAID_BENCH");
  REQUIRE(bench != nullptr);
  const EnvChanges env{{"BRAID_JOB_TOKEN", "early-exit"}, {"BRAID_TIMEOUT", "20"}};
  auto node = [](const char* node_rank, const std::vector<std::string>& program) {
    return one_rank_node(3, node_rank, 29535, program);
  };
  const std::vector<std::string> joins{bench, "-b", "8", "-e", "8", "-n", "1", "-w", "0"};
  JobDir dir0, dir1, dir2;
  const auto started = std::chrono::steady_clock::now();
  LaunchedJob node0(dir0, node("0", joins), env);
  LaunchedJob node2(dir2, node("2", joins), env);
  auto node1 = run_launch(dir1, node("1", {"sh", "-c", "sleep 0.5; exit 3"}), env);
  CHECK(node1.status == 3);
  CHECK(node0.wait(std::chrono::seconds(60)) != 0);
  CHECK(node2.wait(std::chrono::seconds(60)) != 0);
  const auto took = std::chrono::steady_clock::now() - started;
  for (const LaunchedJob* job : {&node0, &node2}) {
    INFO(job->out() << job->err());
    CHECK_THAT(job->err(), Catch::Contains("cannot create communicator braid/world: braid-launch reports rank 1") &&
                               Catch::Contains("exited with status 3") && Catch::Contains("on node 1"));
  }
  CHECK(took < std::chrono::seconds(12));  // not the 20 s of BRAID_TIMEOUT
}

// A rank that returns before it creates its communicator (exit 0: not a
// failure the launcher stops the job for) left its peers waiting for it in
// set-up until BRAID_TIMEOUT. Its launcher now says so through the store,
// on one node and across nodes, and they fail at once naming it.
TEST_CASE("a rank that exits 0 before joining fails its peers' set-up at once, naming it", "[launch]") {
  const char* bench = std::getenv("BRAID_BENCH");
  REQUIRE(bench != nullptr);
  const EnvChanges env{{"BRAID_JOB_TOKEN", "clean-exit"}, {"BRAID_TIMEOUT", "30"}};
  const auto started = std::chrono::steady_clock::now();
  SECTION("one node") {
    JobDir dir;
    auto job = run_launch(dir, {"-n", "3", "--", "sh", "-c",
                                "[ \"$RANK\" = 2 ] && exit 0; exec \"$0\" -b 8 -e 8 -n 1 -w 0", bench}, env);
    INFO(job.out << job.err);
    CHECK(job.status == 1);
    CHECK_THAT(job.err, Catch::Contains("cannot create communicator braid/world: rank 2 will not join it: "
                                        "braid-launch reports rank 2 (pid ") &&
                            Catch::Contains(") exited with status 0 while the job ran on"));
  }
  SECTION("a world of some of the ranks, numbered its own way, is not told") {
    // Launcher ranks 0 and 2 form a world of two, numbered 0 and 1; launcher
    // rank 1 returned. Its key named world rank 1, the late launcher rank 2,
    // as gone (found by a review helper).
    JobDir dir;
    auto job = run_launch(dir, {"-n", "3", "--", "sh", "-c",
                                "[ \"$RANK\" = 1 ] && exit 0; [ \"$RANK\" = 2 ] && sleep 1; r=$((RANK / 2)); "
                                "BRAID_RANK=$r RANK=$r BRAID_LOCAL_RANK=$r LOCAL_RANK=$r BRAID_WORLD_SIZE=2 WORLD_SIZE=2 "
                                "BRAID_LOCAL_WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 exec \"$0\" -b 8 -e 8 -n 1 -w 0",
                                bench},
                          env);
    INFO(job.out << job.err);
    CHECK(job.status == 0);
    CHECK_THAT(job.out, Catch::Contains("Out of bounds values : 0 OK"));
  }
  SECTION("another node") {
    auto node = [](const char* node_rank, const std::vector<std::string>& program) {
      return one_rank_node(3, node_rank, 29551, program);
    };
    const std::vector<std::string> joins{bench, "-b", "8", "-e", "8", "-n", "1", "-w", "0"};
    JobDir dir0, dir1, dir2;
    LaunchedJob node0(dir0, node("0", joins), env);
    LaunchedJob node2(dir2, node("2", joins), env);
    auto node1 = run_launch(dir1, node("1", {"true"}), env);
    CHECK(node1.status == 0);
    for (LaunchedJob* job : {&node0, &node2}) {
      CHECK(job->wait(std::chrono::seconds(60)) != 0);
      INFO(job->out() << job->err());
      CHECK_THAT(job->err(), Catch::Contains("rank 1 will not join it: braid-launch reports rank 1 (pid ") &&
                                 Catch::Contains("exited with status 0 on node 1 while the job ran on"));
    }
  }
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(12));  // not the 30 s of BRAID_TIMEOUT
}

// Ranks that are not braid's (a torch job on gloo, here sleeps) learn
// nothing of another node's failure: node 0's ranks ran to their end (or to
// their own timeout) while node 1 had failed. Each node's launcher now
// watches node 0's store for it while its ranks run, and stops them.
TEST_CASE("a rank that fails on one node stops the running ranks of the others", "[launch]") {
  const EnvChanges env{{"BRAID_JOB_TOKEN", "running-failure"}};
  auto node = [](const char* node_rank, const std::vector<std::string>& program) {
    auto args = one_rank_node(3, node_rank, 29543, program);
    args.insert(args.begin(), {"--grace-period", "1"});
    return args;
  };
  JobDir dir0, dir1, dir2;
  const auto started = std::chrono::steady_clock::now();
  LaunchedJob node0(dir0, node("0", {"sleep", "60"}), env);
  LaunchedJob node2(dir2, node("2", {"sleep", "60"}), env);
  auto node1 = run_launch(dir1, node("1", {"sh", "-c", "sleep 1; exit 3"}), env);
  CHECK(node1.status == 3);
  const int status0 = node0.wait(std::chrono::seconds(60)), status2 = node2.wait(std::chrono::seconds(60));
  const auto took = std::chrono::steady_clock::now() - started;
  for (const LaunchedJob* job : {&node0, &node2}) {
    INFO(job->out() << job->err());
    CHECK_THAT(job->err(), Catch::Contains("the job failed on another node (rank 1") &&
                               Catch::Contains("exited with status 3") && Catch::Contains("on node 1") &&
                               Catch::Contains("stopping this node's 1 rank"));
  }
  CHECK(status0 == 1);
  CHECK(status2 == 1);
  CHECK(took < std::chrono::seconds(15));  // not the ranks' 60 s
}

// Node 0's launcher stopped by its --timeout said so in its store, which
// went at once: it served a little longer only after a rank failed, so the
// other nodes' ranks ran to their end and their launchers exited 0 (a
// review helper's case).
TEST_CASE("node 0's launcher stopped by its --timeout stops the other nodes' ranks", "[launch]") {
  const EnvChanges env{{"BRAID_JOB_TOKEN", "node0-timeout"}};
  auto node = [](const char* node_rank, std::vector<std::string> extra) {
    auto args = one_rank_node(2, node_rank, 29545, {"sleep", "60"});
    extra.insert(extra.end(), {"--grace-period", "1"});
    args.insert(args.begin(), extra.begin(), extra.end());
    return args;
  };
  JobDir dir0, dir1;
  const auto started = std::chrono::steady_clock::now();
  LaunchedJob node1(dir1, node("1", {}), env);
  auto node0 = run_launch(dir0, node("0", {"--timeout", "3"}), env);
  CHECK(node0.status == 124);
  const int status1 = node1.wait(std::chrono::seconds(60));
  INFO(node1.out() << node1.err());
  CHECK(status1 == 1);
  CHECK_THAT(node1.err(), Catch::Contains("the job failed on another node (its launcher's --timeout of 3 s ran out "
                                          "on node 0); stopping this node's 1 rank"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(15));  // not the ranks' 60 s
}

// A node that waits for node 0's store (numbered as it joins) catches its
// signals to end the wait: it took Ctrl-Z (SIGTSTP), caught since the
// launcher passes it on to its ranks, as a reason to give up. Here
// --master-port is held by a program that is not a store, so the node
// waits 3 s for one to appear there, then fails saying the port is taken.
TEST_CASE("Ctrl-Z stops a node waiting for node 0's store, and SIGCONT lets it wait on", "[launch]") {
  const SilentListener holder;
  const std::string port = std::to_string(holder.port);
  JobDir dir;
  LaunchedJob node(dir, {"-n", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "--", "true"},
                   {{"BRAID_JOB_TOKEN", "waits-for-node-0"}});
  std::this_thread::sleep_for(300ms);  // into the wait
  CHECK(stops_on_ctrl_z(node.pid()));
  REQUIRE(::kill(node.pid(), SIGCONT) == 0);
  CHECK(node.wait(20s) != 0);
  CHECK_THAT(node.err(), !Catch::Contains("SIGTSTP") && !Catch::Contains("SIGCONT"));
  CHECK_THAT(node.err(), Catch::Contains(port));
}

// Node 0's store moves past a --master-port that another program holds;
// one that never answers (an HTTP server waits for the client to speak)
// cost each of the other nodes' lookups of the store a probe's 2 s, past
// their short bounds, so a failure on one node never reached the others,
// whose ranks ran to their end (review helpers' cases).
TEST_CASE("a failure crosses nodes when a silent program holds --master-port", "[launch]") {
  const SilentListener holder;
  const int port = holder.port;
  const EnvChanges env{{"BRAID_JOB_TOKEN", "silent-master-port"}};
  JobDir dir0, dir1, dir2;
  const auto started = std::chrono::steady_clock::now();
  // Node 1's launcher tells node 0's store 1 s in, before it has ever
  // found it; node 2's reads it there.
  LaunchedJob node0(dir0, one_rank_node(3, "0", port, {"sleep", "60"}), env);
  LaunchedJob node2(dir2, one_rank_node(3, "2", port, {"sleep", "60"}), env);
  auto node1 = run_launch(dir1, one_rank_node(3, "1", port, {"sh", "-c", "sleep 1; exit 4"}), env);
  CHECK(node1.status == 4);
  for (LaunchedJob* job : {&node0, &node2}) {
    const int status = job->wait(60s);
    INFO(job->out() << job->err());
    CHECK(status == 1);
    CHECK_THAT(job->err(), Catch::Contains("the job failed on another node (rank 1") &&
                               Catch::Contains("exited with status 4 on node 1"));
  }
  CHECK(std::chrono::steady_clock::now() - started < 25s);  // not the ranks' 60 s
}

// Node 0 serves the store 2.5 s longer after its rank failed, for the other
// nodes to read why. Ctrl-C meanwhile was blocked, and delivered once the
// launcher restored its signal mask on the way out: it died by SIGINT
// (130) instead of returning the rank's status.
TEST_CASE("Ctrl-C while node 0 serves the store after a failure ends that at once with the rank's status",
          "[launch]") {
  JobDir dir;
  LaunchedJob node0(dir, one_rank_node(2, "0", 29541, {"sh", "-c", "exit 3"}), {{"BRAID_JOB_TOKEN", "linger"}});
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (node0.err().find("exited with status 3") == std::string::npos && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(20ms);
  REQUIRE_THAT(node0.err(), Catch::Contains("exited with status 3"));
  std::this_thread::sleep_for(200ms);  // into the linger
  const auto signalled = std::chrono::steady_clock::now();
  REQUIRE(::kill(node0.pid(), SIGINT) == 0);
  CHECK(node0.wait(20s) == 3);
  CHECK(std::chrono::steady_clock::now() - signalled < 2s);
  CHECK_THAT(node0.err(), Catch::Contains("received SIGINT; no longer serving the store"));
}

// A rank that ignores SIGINT outlives the first Ctrl-C; the second kills
// it, and node 0 then still served the store its 2.5 s: a second Ctrl-C
// means now (a third ended that).
TEST_CASE("a second Ctrl-C to node 0 ends it at once, without serving the store longer", "[launch]") {
  JobDir dir;
  LaunchedJob node0(dir, one_rank_node(2, "0", 29547, {"sh", "-c", "trap '' INT; echo ready; sleep 30"}),
                    {{"BRAID_JOB_TOKEN", "hurried"}});
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (node0.out().find("ready") == std::string::npos && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(20ms);
  REQUIRE_THAT(node0.out(), Catch::Contains("ready"));
  REQUIRE(::kill(node0.pid(), SIGINT) == 0);
  std::this_thread::sleep_for(700ms);  // past the 250 ms in which a repeat counts as the same signal
  const auto second = std::chrono::steady_clock::now();
  REQUIRE(::kill(node0.pid(), SIGINT) == 0);
  CHECK(node0.wait(20s) == 128 + SIGINT);
  CHECK(std::chrono::steady_clock::now() - second < 1500ms);  // not the store's 2.5 s linger
  INFO(node0.err());
  CHECK_THAT(node0.err(), Catch::Contains("while stopping; killing"));
}

// timeout(1) sends its signal to the launcher and then to its own process
// group, the launcher again: taken as a second Ctrl-C, it SIGKILLed the
// ranks at once, 2 runs in 3, instead of leaving them the grace period to
// save a checkpoint (a review helper's case).
TEST_CASE("the same signal twice at once, as timeout(1) sends it, leaves the ranks their grace period", "[launch]") {
  JobDir dir;
  LaunchedJob job(dir, {"--nproc-per-node", "1", "--grace-period", "10", "--", "sh", "-c",
                        "trap 'sleep 1; echo saved; exit 0' TERM; echo ready; while :; do sleep 0.1; done"});
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (job.out().find("ready") == std::string::npos && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(20ms);
  REQUIRE_THAT(job.out(), Catch::Contains("ready"));
  REQUIRE(::kill(job.pid(), SIGTERM) == 0);
  std::this_thread::sleep_for(30ms);
  REQUIRE(::kill(job.pid(), SIGTERM) == 0);
  CHECK(job.wait(20s) == 128 + SIGTERM);
  INFO(job.err());
  CHECK_THAT(job.out(), Catch::Contains("saved"));
  CHECK_THAT(job.err(), !Catch::Contains("while stopping"));
}

// A node whose program cannot be executed (a path missing on that node
// only) ended at once, but told no one: the other nodes' ranks waited for
// its ranks until BRAID_TIMEOUT.
TEST_CASE("a node that cannot execute its program fails the other nodes at once", "[launch]") {
  const char* bench = std::getenv("BRAID_BENCH");
  REQUIRE(bench != nullptr);
  const EnvChanges env{{"BRAID_JOB_TOKEN", "missing-program"}, {"BRAID_TIMEOUT", "20"}};
  auto node = [](const char* node_rank, const std::vector<std::string>& program) {
    return one_rank_node(2, node_rank, 29541, program);
  };
  JobDir dir0, dir1;
  const auto started = std::chrono::steady_clock::now();
  LaunchedJob node0(dir0, node("0", {bench, "-b", "8", "-e", "8", "-n", "1", "-w", "0"}), env);
  auto node1 = run_launch(dir1, node("1", {(dir1.path() / "no-such-program").string()}), env);
  INFO(node1.err);
  CHECK(node1.status == 127);
  CHECK(node0.wait(60s) != 0);
  INFO(node0.err());
  CHECK_THAT(node0.err(), Catch::Contains("braid-launch reports cannot execute") &&
                              Catch::Contains("no-such-program") && Catch::Contains("on node 1"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(12));  // not the 20 s of BRAID_TIMEOUT
}

// A node's launcher stopped by a signal (Ctrl-C, scancel, a pod's SIGTERM)
// said nothing to the other nodes, whose ranks waited for its ranks until
// BRAID_TIMEOUT.
TEST_CASE("a node's launcher stopped by a signal fails the other nodes at once", "[launch]") {
  const char* bench = std::getenv("BRAID_BENCH");
  REQUIRE(bench != nullptr);
  const EnvChanges env{{"BRAID_JOB_TOKEN", "stopped-node"}, {"BRAID_TIMEOUT", "20"}};
  JobDir dir0, dir1;
  auto node = [&](const char* node_rank, const std::string& script, const JobDir& dir) {
    return shell_job(1, script, dir, {"--nnodes", "2", "--node-rank", node_rank, "--master-port", "29537"});
  };
  const std::string joins = std::string("exec ") + bench + " -b 8 -e 8 -n 1 -w 0";
  const auto started = std::chrono::steady_clock::now();
  LaunchedJob node0(dir0, node("0", joins, dir0), env);
  LaunchedJob node1(dir1, node("1", recording("sleep 30"), dir1), env);
  wait_for_file(dir1.path() / "pid_1");
  REQUIRE(::kill(node1.pid(), SIGTERM) == 0);
  CHECK(node1.wait(20s) == 128 + SIGTERM);
  CHECK(node0.wait(60s) != 0);
  INFO(node0.err());
  CHECK_THAT(node0.err(), Catch::Contains("braid-launch reports its launcher was stopped by SIGTERM") &&
                              Catch::Contains("on node 1"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(12));  // not the 20 s of BRAID_TIMEOUT
}

TEST_CASE("rank output is relayed line by line with a rank prefix", "[launch]") {
  JobDir dir;
  std::string script = "echo \"out $BRAID_RANK\"; echo \"err $BRAID_RANK\" >&2; "
                       "echo second; printf \"tail $BRAID_RANK\"";
  auto result = run_launch(dir, shell_job(2, script, dir));
  REQUIRE(result.status == 0);
  CHECK(sorted_lines(result.out) ==
        std::vector<std::string>{"[rank 0] out 0", "[rank 0] second", "[rank 0] tail 0",
                                 "[rank 1] out 1", "[rank 1] second", "[rank 1] tail 1"});
  CHECK(sorted_lines(result.err) == std::vector<std::string>{"[rank 0] err 0", "[rank 1] err 1"});
}

// Waits until the launcher's stdout holds `text`; fails past the limit.
void wait_for_output(const LaunchedJob& job, const std::string& text, std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (job.out().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline)
      FAIL("no '" << text << "' on stdout within " << limit.count() << " ms; stdout:\n" << job.out());
    std::this_thread::sleep_for(20ms);
  }
}

TEST_CASE("rank 0 reads the launcher's stdin, and its prompt shows before the line ends", "[launch]") {
  JobDir dir;
  braid::launcher::Pipe input = braid::launcher::make_pipe();
  // Rank 0 asks, as input() does, and waits for the answer; rank 1 finds
  // its stdin at its end.
  std::string script =
      "if [ \"$BRAID_RANK\" = 0 ]; then printf 'name? '; read name; echo \"hello $name\"; "
      "else if read line; then echo \"read $line\"; else echo 'end of input'; fi; fi";
  ChildSetup setup;
  setup.stdin_fd = input.read_end.get();
  LaunchedJob job(dir, shell_job(2, script, dir), {}, setup);
  input.read_end.reset();
  // The prompt has no newline: it shows once rank 0 has written no more
  // for a moment, while the rank still waits for its answer.
  wait_for_output(job, "[rank 0] name? ");
  CHECK_THAT(job.out(), !Catch::Contains("hello"));
  const std::string answer = "bob\n";
  // A launcher that never read its stdin may have closed it already.
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old);
  const ssize_t written = ::write(input.write_end.get(), answer.data(), answer.size());
  sigaction(SIGPIPE, &old, nullptr);
  REQUIRE(written == static_cast<ssize_t>(answer.size()));
  input.write_end.reset();
  REQUIRE(job.wait() == 0);
  CHECK(sorted_lines(job.out()) == std::vector<std::string>{"[rank 0] name? hello bob", "[rank 1] end of input"});
}

// A terminal that is not the launcher's controlling one (setsid, a daemon
// handed a pty) has no foreground for it to wait for: it was never read.
TEST_CASE("stdin on a terminal that is not the launcher's own is forwarded", "[launch]") {
  JobDir dir;
  braid::launcher::UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  REQUIRE(master.valid());
  REQUIRE(::grantpt(master.get()) == 0);
  REQUIRE(::unlockpt(master.get()) == 0);
  braid::launcher::UniqueFd terminal(::open(::ptsname(master.get()), O_RDWR | O_NOCTTY | O_CLOEXEC));
  REQUIRE(terminal.valid());
  ChildSetup setup;
  setup.stdin_fd = terminal.get();
  LaunchedJob job(dir, shell_job(1, "read name; echo \"hello $name\"", dir), {}, setup);
  const std::string typed = "bob\n";
  REQUIRE(::write(master.get(), typed.data(), typed.size()) == static_cast<ssize_t>(typed.size()));
  REQUIRE(job.wait(20s) == 0);
  CHECK(job.out() == "[rank 0] hello bob\n");
}

// `> log 2>&1`: stdout and stderr are one open file, which had a sink each,
// so rank 1's line landed inside rank 0's unfinished one on stderr.
TEST_CASE("into one file (> log 2>&1) another rank's line starts a line of its own", "[launch]") {
  JobDir dir;
  const auto log = dir.path() / "log";
  const std::string script =
      "if [ \"$BRAID_RANK\" = 0 ]; then printf 'loading...' >&2; "
      "while [ ! -e \"$0/said\" ]; do sleep 0.02; done; sleep 0.3; echo ' done'; "
      "else while ! grep -q loading \"$0/log\"; do sleep 0.02; done; echo hello; sleep 0.3; touch \"$0/said\"; fi";
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$@\" > \"$0\" 2>&1", log.string(),
                                std::getenv("BRAID_LAUNCH")};
  for (const std::string& arg : shell_job(2, script, dir)) argv.push_back(arg);
  auto job = LaunchedJob::program(dir, "launcher", argv);
  REQUIRE(job->wait(30s) == 0);
  CHECK(read_file(log) == "[rank 0] loading...\n[rank 1] hello\n[rank 0]  done\n");
}

// A line of 64 KiB or more, written at once, was cut where a pipe's read
// ends as soon as another rank wrote too: JSON lines of 70 KB came out in
// two pieces, another rank's line between (a review helper's case).
TEST_CASE("lines up to 1 MiB written at once stay whole while other ranks write", "[launch]") {
  JobDir dir;
  const std::string script = "exec python3 -c \"import os\nfor _ in range(30): os.write(1, b'x' * 200000 + b'\\n')\"";
  const auto result = run_launch(dir, shell_job(2, script, dir));
  REQUIRE(result.status == 0);
  const std::string line(200000, 'x');
  std::istringstream lines(result.out);
  int whole = 0, other = 0;
  for (std::string l; std::getline(lines, l);) (l == "[rank 0] " + line || l == "[rank 1] " + line ? whole : other)++;
  CHECK(whole == 60);
  CHECK(other == 0);
}

TEST_CASE("--stdin picks the rank that reads stdin, or none", "[launch]") {
  JobDir dir;
  auto file = dir.path() / "input.txt";
  std::ofstream(file) << "first\nsecond\n";
  std::string script = "if read line; then echo \"read $line\"; else echo 'end of input'; fi";
  auto run_with = [&](const std::vector<std::string>& extra) {
    braid::launcher::UniqueFd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    REQUIRE(in.valid());
    ChildSetup setup;
    setup.stdin_fd = in.get();
    LaunchedJob job(dir, shell_job(3, script, dir, extra), {}, setup);
    REQUIRE(job.wait() == 0);
    return sorted_lines(job.out());
  };
  CHECK(run_with({"--stdin", "2"}) ==
        std::vector<std::string>{"[rank 0] end of input", "[rank 1] end of input", "[rank 2] read first"});
  CHECK(run_with({"--stdin", "none"}) ==
        std::vector<std::string>{"[rank 0] end of input", "[rank 1] end of input", "[rank 2] end of input"});
}

TEST_CASE("a progress bar redrawn with a carriage return is relayed as it is drawn", "[launch]") {
  JobDir dir;
  // Each step waits for the test's go-ahead, so only the launcher's
  // flush of the unfinished line can show it.
  std::string script = "printf '\\r 10%%'; while [ ! -e \"$0/go\" ]; do sleep 0.02; done; printf '\\r 20%%\\n'";
  LaunchedJob job(dir, shell_job(1, script, dir));
  wait_for_output(job, "[rank 0]  10%");
  std::ofstream(dir.path() / "go").flush();
  REQUIRE(job.wait() == 0);
  CHECK(job.out() == "[rank 0]  10%\r[rank 0]  20%\n");
}

TEST_CASE("--log-dir writes each rank's output to its own files", "[launch]") {
  JobDir dir;
  auto logs = dir.path() / "logs" / "nested";
  // An earlier job's restart files of this job's ranks read as this job's
  // attempts (a review helper's case): removed; another rank's stay.
  std::filesystem::create_directories(logs);
  std::ofstream(logs / "rank_1.restart2.err") << "an earlier job\n";
  std::ofstream(logs / "rank_9.restart1.out") << "a rank of another node\n";
  std::string script = "echo \"out $BRAID_RANK\"; echo \"err $BRAID_RANK\" >&2; printf tail";
  auto result = run_launch(dir, shell_job(2, script, dir, {"--log-dir", logs.string()}));
  REQUIRE(result.status == 0);
  CHECK_FALSE(std::filesystem::exists(logs / "rank_1.restart2.err"));
  CHECK(std::filesystem::exists(logs / "rank_9.restart1.out"));
  CHECK(result.out.empty());
  CHECK(result.err.empty());
  for (int rank = 0; rank < 2; ++rank) {
    std::string r = std::to_string(rank);
    CHECK(read_file(logs / ("rank_" + r + ".out")) == "out " + r + "\ntail");
    CHECK(read_file(logs / ("rank_" + r + ".err")) == "err " + r + "\n");
  }
}

TEST_CASE("a failing rank stops the job with its status", "[launch]") {
  JobDir dir;
  // Rank 2 fails once every rank has recorded its pid; the others would
  // sleep for a minute.
  std::string script = recording(
      "if [ \"$BRAID_RANK\" = 2 ]; then "
      "  while [ $(ls \"$0\" | grep -c '^pid_') -lt 4 ]; do sleep 0.02; done; exit 3; "
      "fi; exec sleep 60");
  auto started = std::chrono::steady_clock::now();
  auto result = run_launch(dir, shell_job(4, script, dir));
  CHECK(result.status == 3);
  CHECK(std::chrono::steady_clock::now() - started < 30s);
  CHECK_THAT(result.err, Catch::Contains("rank 2 (pid ") &&
                             Catch::Contains("exited with status 3; stopping the other 3 ranks"));
  check_no_rank_survives(dir, 4);
}

TEST_CASE("a rank that ignores SIGTERM is killed after the grace period", "[launch]") {
  JobDir dir;
  std::string script = recording(
      "if [ \"$BRAID_RANK\" = 0 ]; then "
      "  while [ ! -s \"$0/pid_1\" ]; do sleep 0.02; done; exit 5; "
      "fi; trap '' TERM; exec sleep 60");
  auto result = run_launch(dir, shell_job(2, script, dir, {"--grace-period", "0.3"}));
  CHECK(result.status == 5);
  CHECK_THAT(result.err, Catch::Contains("sending SIGKILL"));
  check_no_rank_survives(dir, 2);
}

// A stopped rank (SIGSTOP; its peers time out on it) holds the SIGTERM
// pending: the job waited out the whole grace period for it. SIGCONT
// follows the stop signal.
TEST_CASE("a stopped rank is stopped with the others at once, not after the grace period", "[launch]") {
  JobDir dir;
  std::string script = recording(
      "if [ \"$BRAID_RANK\" = 0 ]; then "
      "  while [ \"$(cut -d' ' -f3 /proc/$(cat \"$0/pid_1\" 2>/dev/null || echo 0)/stat 2>/dev/null)\" != T ]; do "
      "    sleep 0.02; done; exit 5; "
      "fi; kill -STOP $$; exec sleep 60");
  const auto started = std::chrono::steady_clock::now();
  auto result = run_launch(dir, shell_job(2, script, dir, {"--grace-period", "30"}));
  const auto took = std::chrono::steady_clock::now() - started;
  CHECK(result.status == 5);
  CHECK_THAT(result.err, !Catch::Contains("sending SIGKILL"));
  CHECK(took < std::chrono::seconds(15));  // not the 30 s grace period
  check_no_rank_survives(dir, 2);
}

TEST_CASE("a rank killed by a signal gives 128 + signal", "[launch]") {
  JobDir dir;
  // Rank 1 dies once rank 0 has recorded its pid (under load it was
  // stopped before it did, and the check saw one rank).
  std::string script = recording(
      "if [ \"$BRAID_RANK\" = 1 ]; then "
      "  while [ ! -s \"$0/pid_0\" ]; do sleep 0.02; done; kill -KILL $$; "
      "fi; exec sleep 60");
  auto result = run_launch(dir, shell_job(2, script, dir));
  CHECK(result.status == 137);
  CHECK_THAT(result.err, Catch::Contains("rank 1 (pid ") &&
                             Catch::Contains("was killed by signal 9 (SIGKILL)"));
  check_no_rank_survives(dir, 2);
}

// A rank killed by SIGKILL closes its sockets before the launcher can see
// it exit, and a peer that noticed at once and exited 1 was at times reaped
// first (1 run in 7): named as the failure, with status 1 instead of 137.
// Here rank 1 kills rank 0 and exits 1 at once: rank 0 is named. (Rank 0
// killing itself once rank 1 said it exits was at times not scheduled
// within the launcher's 100 ms under load: 2 runs in 100.)
TEST_CASE("a rank killed by a signal is named before a peer that exited at the same moment", "[launch]") {
  JobDir dir;
  std::string script = recording(
      "while [ ! -s \"$0/pid_0\" ] || [ ! -s \"$0/pid_1\" ]; do sleep 0.02; done; "
      "if [ \"$BRAID_RANK\" = 1 ]; then kill -KILL \"$(cat \"$0/pid_0\")\"; exit 1; fi; "
      "sleep 30");
  auto result = run_launch(dir, shell_job(2, script, dir));
  INFO(result.err);
  CHECK(result.status == 137);
  CHECK_THAT(result.err, Catch::Contains("rank 0 (pid ") && Catch::Contains("was killed by signal 9 (SIGKILL)"));
  CHECK_THAT(result.err, !Catch::Contains("exited with status 1"));
}

// SIGQUIT was not caught: the launcher died of it and its ranks were
// killed with no chance to clean up (torchrun forwards it too). A launcher
// started in the background by a shell script (SIGINT and SIGQUIT ignored)
// or under nohup (SIGHUP) still took the signal and forwarded it, but its
// ranks inherited the ignoring: they ran on until killed after the grace
// period, their traps never run.
TEST_CASE("SIGTERM and SIGQUIT to the launcher are forwarded to every rank", "[launch]") {
  const int signo = GENERATE(SIGTERM, SIGQUIT, SIGHUP);
  const bool ignored = GENERATE(false, true);
  const std::string name = signo == SIGTERM ? "TERM" : signo == SIGQUIT ? "QUIT" : "HUP";
  INFO("SIG" << name << (ignored ? ", ignored where the launcher started" : ""));
  JobDir dir;
  std::string script = recording(
      "trap 'echo term > \"$0/marker_$BRAID_RANK\"; exit 0' " + name + "; "
      "echo > \"$0/ready_$BRAID_RANK\"; sleep 60 & wait");
  ChildSetup setup;
  if (ignored) setup.ignored = {SIGINT, SIGQUIT, SIGHUP};
  LaunchedJob job(dir, shell_job(3, script, dir), {}, setup);
  for (int rank = 0; rank < 3; ++rank)
    wait_for_file(dir.path() / ("ready_" + std::to_string(rank)));
  REQUIRE(::kill(job.pid(), signo) == 0);
  CHECK(job.wait() == 128 + signo);
  CHECK_THAT(job.err(), Catch::Contains("received SIG" + name + "; forwarding it to 3 ranks"));
  for (int rank = 0; rank < 3; ++rank)
    CHECK(read_file(dir.path() / ("marker_" + std::to_string(rank))) == "term\n");
  check_no_rank_survives(dir, 3);
}

// With stdout or stderr closed, the launcher's signalfd took descriptor 1
// (or 2), and the ranks' output queued for it waited forever.
TEST_CASE("a launcher started with stdout or stderr closed runs its job to the end", "[launch]") {
  const std::string closed = GENERATE(">&-", "2>&-", ">&- 2>&-");
  INFO(closed);
  JobDir dir;
  // The job as a script, so that the closing redirection applies to the
  // launcher alone.
  const auto script = dir.path() / "job.sh";
  std::ofstream(script) << "timeout -k 5 20 \"$BRAID_LAUNCH\" -n 2 -- sh -c "
                           "'echo out; echo err >&2; touch \"$0/ran_$BRAID_RANK\"' \"$1\" "
                        << closed << "\necho $? > \"$1/status\"\n";
  REQUIRE(std::system(("sh " + script.string() + " " + dir.path().string()).c_str()) == 0);
  CHECK(read_file(dir.path() / "status") == "0\n");
  CHECK(std::filesystem::exists(dir.path() / "ran_0"));
  CHECK(std::filesystem::exists(dir.path() / "ran_1"));
}

TEST_CASE("--timeout stops the job and exits 124", "[launch]") {
  JobDir dir;
  auto result = run_launch(dir, shell_job(2, recording("exec sleep 60"), dir, {"--timeout", "0.5"}));
  CHECK(result.status == 124);
  CHECK_THAT(result.err, Catch::Contains("ran past its --timeout of 0.5 s"));
  check_no_rank_survives(dir, 2);
}

// A stdout nobody reads used to block the supervisor in write(2), so
// --timeout and signals went unheard until the reader woke up.
TEST_CASE("a reader of stdout that stalls holds up neither --timeout nor signals", "[launch]") {
  const bool stderr_too = GENERATE(false, true);
  INFO("stderr on the stalled FIFO too: " << stderr_too);
  JobDir dir;
  StalledReader reader(dir);
  const auto started = std::chrono::steady_clock::now();
  // The stop, then at most 2 s (the least output gets to drain) before the
  // output still pending is dropped; the reader never reads.
  auto check_stopped_in_time = [&](const LaunchedJob& job) {
    CHECK(std::chrono::steady_clock::now() - started < 10s);
    if (!stderr_too) CHECK_THAT(job.err(), Catch::Contains("bytes of output that stdout/stderr did not take in time"));
    check_no_rank_survives(dir, 2);
  };
  SECTION("--timeout") {
    auto job = launch_into(reader, dir, shell_job(2, recording("exec yes"), dir, {"--timeout", "2", "--grace-period", "1"}),
                           stderr_too);
    CHECK(job->wait(20s) == 124);
    check_stopped_in_time(*job);
  }
  SECTION("SIGTERM") {
    auto job = launch_into(reader, dir, shell_job(2, recording("exec yes"), dir, {"--grace-period", "1"}), stderr_too);
    for (int rank = 0; rank < 2; ++rank) wait_for_file(dir.path() / ("pid_" + std::to_string(rank)));
    std::this_thread::sleep_for(500ms);  // the FIFO, the sinks and the ranks' pipes fill up
    REQUIRE(::kill(job->pid(), SIGTERM) == 0);
    CHECK(job->wait(20s) == 128 + SIGTERM);
    check_stopped_in_time(*job);
  }
}

// A rank that exits leaving a background job of its own running (an
// upload) has it killed, as everything a rank starts ends with it: that
// happened without a word.
TEST_CASE("a rank that exits 0 leaving a background job running is told it is killed", "[launch]") {
  JobDir dir;
  auto result = run_launch(dir, shell_job(2, "if [ \"$BRAID_RANK\" = 0 ]; then sleep 30 & exit 0; fi; sleep 1", dir));
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("rank 0 exited leaving 1 process(es) it started still running") &&
                             Catch::Contains("wait for them before the rank exits"));
  CHECK_THAT(result.err, !Catch::Contains("rank 1 exited leaving"));
}

// One that leaves its group (setsid; a daemon's double fork) was out of
// reach of the group's SIGKILL: it ran on after the job, reparented to init
// (a review helper's find). The launcher is the ranks' subreaper, so it
// comes to the launcher when its parent exits and is killed with the job.
TEST_CASE("what a rank starts in a session of its own ends with the job, with a note", "[launch]") {
  JobDir dir;
  // A sleep of a length no other process here sleeps, found by its
  // command line. The rank waits until it has its own session (setsid
  // runs in the background: exited sooner, the rank's group took it along).
  const std::string seconds = "3" + std::to_string(100000 + getpid() % 100000);
  const std::string escape = "setsid sleep " + seconds + " </dev/null >/dev/null 2>&1 & "
                             "n=0; while [ \"$(cut -d' ' -f6 /proc/$!/stat)\" != \"$!\" ] && [ $n -lt 1000 ]; do "
                             "n=$((n + 1)); sleep 0.01; done; ";
  auto escaped_running = [&] {
    int count = 0;
    std::error_code ec;
    for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
      std::ifstream in(it->path() / "cmdline");
      std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      count += cmdline == std::string("sleep") + '\0' + seconds + '\0';
    }
    return count;
  };
  SECTION("a rank that fails") {
    auto result = run_launch(dir, shell_job(2, "if [ \"$BRAID_RANK\" = 1 ]; then " + escape +
                                                   "exit 4; fi; sleep 30", dir));
    CHECK(result.status == 4);
    CHECK_THAT(result.err, Catch::Contains("1 process(es) the ranks started outside their process groups"));
  }
  SECTION("ranks that succeed") {
    auto result = run_launch(dir, shell_job(2, escape, dir));
    CHECK(result.status == 0);
    CHECK_THAT(result.err, Catch::Contains("2 process(es) the ranks started outside their process groups"));
  }
  CHECK(escaped_running() == 0);
}

// Ctrl-Z sends SIGTSTP to the terminal's foreground group, the launcher's;
// each rank runs in a group of its own, so only the launcher stopped and
// the ranks ran on. It now passes SIGTSTP on, stops, and passes SIGCONT on.
TEST_CASE("Ctrl-Z (SIGTSTP) to the launcher stops its ranks, and SIGCONT continues them", "[launch]") {
  JobDir dir;
  LaunchedJob job(dir, shell_job(2, recording("while :; do sleep 0.05; done"), dir, {"--grace-period", "1"}));
  for (int rank = 0; rank < 2; ++rank) wait_for_file(dir.path() / ("pid_" + std::to_string(rank)));
  const auto pids = dir.recorded_pids();
  // The states (the third field of /proc/PID/stat) of the processes in a
  // rank's group: the shell and the sleep it runs.
  auto group_states = [](pid_t group) {
    std::string states;
    std::error_code ec;
    for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
      const std::string stat = read_file(it->path() / "stat");
      const auto close_paren = stat.rfind(')');
      if (close_paren == std::string::npos) continue;  // not a process, or gone
      std::istringstream fields(stat.substr(close_paren + 2));
      char state = '?';
      pid_t parent = 0, pgid = 0;
      if (fields >> state >> parent >> pgid && pgid == group) states += state;
    }
    return states;
  };
  // A stopped group has every member stopped (T), except that dash vforks
  // the sleep: when SIGTSTP stops the child before its exec, the shell
  // waits for that exec uninterruptibly (D), and takes its own SIGTSTP
  // only after it. The rank is stopped all the same; SIGCONT discards the
  // pending SIGTSTP. A running group has no member stopped.
  auto group_stopped = [&](pid_t group) {
    const std::string states = group_states(group);
    return states.find('T') != std::string::npos && states.find_first_not_of("TD") == std::string::npos;
  };
  auto group_running = [&](pid_t group) {
    const std::string states = group_states(group);
    return !states.empty() && states.find('T') == std::string::npos;
  };
  // Until every rank's group is in the state, or 10 s.
  auto all_become = [&](bool stopped) {
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    auto done = [&] {
      return std::all_of(pids.begin(), pids.end(),
                         [&](const auto& p) { return stopped ? group_stopped(p.second) : group_running(p.second); });
    };
    while (!done() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(20ms);
    if (!done())
      for (const auto& p : pids) UNSCOPED_INFO("rank " << p.first << "'s group: states " << group_states(p.second));
    return done();
  };
  CHECK(stops_on_ctrl_z(job.pid()));
  CHECK(all_become(true));
  REQUIRE(::kill(job.pid(), SIGCONT) == 0);
  CHECK(all_become(false));
  REQUIRE(::kill(job.pid(), SIGTERM) == 0);
  CHECK(job.wait(20s) == 128 + SIGTERM);
  check_no_rank_survives(dir, 2);
}

// `braid-launch ... | head`: once head has exited, the launcher's next
// write to stdout fails with EPIPE. It went on relaying into nothing, and a
// job piped into head ran to its end with nothing shown; now the ranks'
// pipes to stdout are closed, and a rank writing there dies of SIGPIPE as
// it would under torchrun, which ends the job.
TEST_CASE("a reader of stdout that goes away ends a job that writes there, as a pipe into head would", "[launch]") {
  // With restarts left, another attempt would die the same way: none is made.
  const std::string restarts = GENERATE("0", "2");
  INFO("--max-restarts " << restarts);
  JobDir dir;
  const auto path = dir.path() / "stdout";
  REQUIRE(mkfifo(path.c_str(), 0600) == 0);
  braid::launcher::UniqueFd reader(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  REQUIRE(reader.valid());
  const char* launcher = std::getenv("BRAID_LAUNCH");
  REQUIRE(launcher);
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$@\" > \"$0\"", path.string(), launcher};
  for (const auto& arg : shell_job(2, recording("exec yes"), dir, {"--grace-period", "1", "--max-restarts", restarts}))
    argv.push_back(arg);
  auto job = LaunchedJob::program(dir, "launcher", argv);
  for (int rank = 0; rank < 2; ++rank) wait_for_file(dir.path() / ("pid_" + std::to_string(rank)));
  pollfd ready{reader.get(), POLLIN, 0};
  REQUIRE(::poll(&ready, 1, 10'000) == 1);  // the job's output has begun
  char some[4096];
  CHECK(::read(reader.get(), some, sizeof some) > 0);
  reader.reset();  // head has read what it wanted
  CHECK(job->wait(20s) == 128 + SIGPIPE);
  CHECK_THAT(job->err(), Catch::Contains("the reader of its output has gone") && Catch::Contains("SIGPIPE"));
  CHECK_THAT(job->err(), !Catch::Contains("restarting all"));
  if (restarts != "0") CHECK_THAT(job->err(), Catch::Contains("not restarting: the reader of its output has gone"));
  check_no_rank_survives(dir, 2);
}


// spdlog, which blocks: with stderr on a reader that stalls, the warning
// about a refused connection held the store's thread in write(2), and every
// rank's store call waited with it until the reader woke up. They now queue
// in the stderr sink like every other line.
TEST_CASE("a reader of stderr that stalls holds up none of the launcher's log lines", "[launch][store]") {
  JobDir dir;
  StalledReader reader(dir);
  // Each rank says where the store is, then writes 200 kB (more than the
  // FIFO holds); the reader never reads.
  const std::string script = "echo \"$BRAID_STORE_ADDR $BRAID_JOB_TOKEN\" > \"$0/store.tmp\"; "
                             "mv \"$0/store.tmp\" \"$0/store\"; yes | head -c 200000; " +
                             recording("exec sleep 60");
  auto job = launch_into(reader, dir, shell_job(1, script, dir, {"--grace-period", "1"}), true);
  wait_for_file(dir.path() / "pid_0");
  std::this_thread::sleep_for(300ms);  // the FIFO fills up
  std::istringstream line(read_file(dir.path() / "store"));
  std::string addr, token;
  line >> addr >> token;
  const std::string host = addr.substr(0, addr.rfind(':'));
  // A wrong token: the store refuses it and logs a warning.
  CHECK_THROWS_AS(braid::runtime::Store(host, port_of(addr), token + "x", 5000ms), braid::RemoteError);
  // The store still answers.
  braid::runtime::Store store(host, port_of(addr), token, 5000ms);
  store.set("greeting", std::string("hello"));
  CHECK(store.get_string("greeting", 5000ms) == "hello");
  REQUIRE(::kill(job->pid(), SIGTERM) == 0);
  CHECK(job->wait(20s) == 128 + SIGTERM);
}

TEST_CASE("output held up by a slow reader is all relayed, in whole lines", "[launch]") {
  JobDir dir;
  StalledReader reader(dir);
  constexpr int kLines = 100000;
  auto job = launch_into(reader, dir, shell_job(2, "seq 1 " + std::to_string(kLines), dir), false);
  // Meanwhile the FIFO, the launcher's buffer and the ranks' pipes fill up
  // and the ranks block on their writes.
  std::this_thread::sleep_for(1s);
  std::string expected;
  for (int rank = 0; rank < 2; ++rank)
    for (int i = 1; i <= kLines; ++i) expected += "[rank " + std::to_string(rank) + "] " + std::to_string(i) + "\n";
  std::string got = reader.read(expected.size(), 30s);
  CHECK(job->wait(20s) == 0);
  REQUIRE(got.size() == expected.size());
  CHECK(sorted_lines(got) == sorted_lines(expected));
}

// The launcher's own failure after rank 0 started (rank 1's log file cannot
// be created) still kills rank 0 and removes the job's shared memory.
TEST_CASE("a launcher failure midway stops the started ranks and removes the job's segments", "[launch]") {
  JobDir dir;
  const std::string token = "launch-failure-test-" + std::to_string(::getpid());
  const std::string run_id = "launch-failure-run";
  const std::string segment = "/dev/shm" + braid::runtime::shm_run_prefix(token, run_id) + "left-by-rank";
  auto logs = dir.path() / "logs";
  std::filesystem::create_directories(logs / "rank_1.out");  // a directory: open(2) fails
  struct SegmentCleanup {
    std::string path;
    ~SegmentCleanup() { ::unlink(path.c_str()); }
  } cleanup{segment};
  {
    std::ofstream(segment) << "x";
  }
  REQUIRE(std::filesystem::exists(segment));
  auto result = run_launch(dir, shell_job(2, recording("exec sleep 60"), dir, {"--log-dir", logs.string()}),
                           {{"BRAID_JOB_TOKEN", token}, {"BRAID_RUN_ID", run_id}});
  CHECK(result.status == 1);
  CHECK_THAT(result.err, Catch::Contains("rank_1.out"));
  CHECK_FALSE(std::filesystem::exists(segment));
  CHECK_THAT(result.err, Catch::Contains("removed 1 shared-memory segment(s) left by failed ranks"));
  for (const auto& [rank, pid] : dir.recorded_pids()) {
    INFO("rank " << rank << " pid " << pid);
    CHECK_FALSE(process_exists(pid));
  }
}

TEST_CASE("huge --timeout and --grace-period mean no limit instead of overflowing", "[launch]") {
  auto value = GENERATE(as<std::string>{}, "1e10", "1e300", "inf", "1e9");
  INFO("value " << value);
  JobDir dir;
  auto result = run_launch(dir, shell_job(1, "echo ran", dir, {"--timeout", value, "--grace-period", value}));
  CHECK(result.status == 0);
  CHECK(result.out == "[rank 0] ran\n");
  CHECK(result.err.empty());
}

TEST_CASE("bad arguments exit 2 and start nothing", "[launch]") {
  auto args = GENERATE(as<std::vector<std::string>>{},
                       std::vector<std::string>{"-n", "0"},
                       std::vector<std::string>{"-n", "x"},
                       std::vector<std::string>{"-n", "2", "--master-port", "70000"},
                       // Decimal only: CLI11 read 0x7000 as port 28672 and 010 as node 8.
                       std::vector<std::string>{"-n", "2", "--master-port", "0x7000"},
                       std::vector<std::string>{"-n", "2", "--master-port", ""},
                       std::vector<std::string>{"-n", "2", "--nnodes", "9", "--node-rank", "010",
                                                "--master-port", "29517"},
                       std::vector<std::string>{"-n", "2", "--max-restarts", "1e2"},
                       std::vector<std::string>{"-n", "2", "--nnodes", "2", "--node-rank", "2",
                                                "--master-port", "29517"},
                       std::vector<std::string>{"-n", "2", "--nnodes", "2", "--node-rank", "1"},
                       std::vector<std::string>{"-n", "2", "--timeout", "-1"},
                       std::vector<std::string>{"-n", "2", "--timeout", "nan"},
                       std::vector<std::string>{"-n", "2", "--grace-period", "-inf"},
                       std::vector<std::string>{"-n", "2", "--stdin", "2"},
                       std::vector<std::string>{"-n", "2", "--stdin", "-1"},
                       std::vector<std::string>{"-n", "2", "--stdin", "x"},
                       std::vector<std::string>{"-n", "2", "--bogus"});
  JobDir dir;
  std::vector<std::string> full = args;
  for (std::string tail : {"--", "/bin/sh", "-c", "touch \"$0/started\""}) full.push_back(tail);
  full.push_back(dir.str());
  INFO("args: " << Catch::Detail::stringify(args));
  auto result = run_launch(dir, full);
  CHECK(result.status == 2);
  CHECK_FALSE(result.err.empty());
  CHECK_FALSE(std::filesystem::exists(dir.path() / "started"));
}

TEST_CASE("no program exits 2", "[launch]") {
  JobDir dir;
  auto result = run_launch(dir, {"-n", "2"});
  CHECK(result.status == 2);
  CHECK_THAT(result.err, Catch::Contains("no program given"));
}

TEST_CASE("a program that cannot be executed exits 127 and names it", "[launch]") {
  JobDir dir;
  std::filesystem::path program = dir.path() / "not-executable";
  SECTION("missing") { program = dir.path() / "no-such-program"; }
  SECTION("not executable") { std::ofstream(program) << "#!/bin/sh\n"; }
  auto result = run_launch(dir, {"-n", "3", "--", program.string()});
  CHECK(result.status == 127);
  CHECK_THAT(result.err, Catch::Contains(program.string()));
}

// exec's ENOENT for a script that exists is about its #! line: the message
// said only "No such file or directory" of the script.
TEST_CASE("a script whose #! interpreter does not exist is told apart from a missing script", "[launch]") {
  JobDir dir;
  std::filesystem::path script = dir.path() / "job.sh";
  std::string interpreter = "/nonexistent/interp", says = "which does not exist";
  SECTION("a missing interpreter") { std::ofstream(script) << "#!" << interpreter << " -e\necho hi\n"; }
  SECTION("Windows line ends") {
    interpreter = "/bin/sh\\r";
    says = "Windows line ends";
    std::ofstream(script) << "#!/bin/sh\r\necho hi\r\n";
  }
  SECTION("an interpreter that is a script of a missing one") {
    interpreter = (dir.path() / "interp").string();
    says = "which exists but names in turn something that does not";
    std::ofstream(interpreter) << "#!/nonexistent/interp\n";
    std::filesystem::permissions(interpreter, std::filesystem::perms::owner_all);
    std::ofstream(script) << "#!" << interpreter << "\necho hi\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto result = run_launch(dir, {"-n", "2", "--", script.string()});
  CHECK(result.status == 127);
  CHECK_THAT(result.err, Catch::Contains(script.string()) && Catch::Contains("'" + interpreter + "'") &&
                             Catch::Contains(says));
}

TEST_CASE("the launcher serves the store the ranks are told about", "[launch][store]") {
  JobDir dir;
  std::string script =
      "echo \"$BRAID_STORE_ADDR $BRAID_JOB_TOKEN\" > \"$0/store.tmp\"; "
      "mv \"$0/store.tmp\" \"$0/store\"; " + recording("exec sleep 60");
  LaunchedJob job(dir, shell_job(1, script, dir));
  wait_for_file(dir.path() / "store");
  std::istringstream line(read_file(dir.path() / "store"));
  std::string addr, token;
  line >> addr >> token;
  std::string host = addr.substr(0, addr.rfind(':'));
  {
    braid::runtime::Store store(host, port_of(addr), token, 5000ms);
    store.set("greeting", std::string("hello"));
    CHECK(store.get_string("greeting", 5000ms) == "hello");
    CHECK(store.add("counter", 2) == 2);
  }
  CHECK_THROWS_AS(braid::runtime::Store(host, port_of(addr), token + "x", 5000ms),
                  braid::RemoteError);
  REQUIRE(::kill(job.pid(), SIGTERM) == 0);
  CHECK(job.wait() == 128 + SIGTERM);
  check_no_rank_survives(dir, 1);
}

// torchrun's spellings and modes (issue 17).
TEST_CASE("braid-launch takes torchrun's spellings, --standalone and --nproc-per-node auto", "[launch]") {
  JobDir dir;
  auto result = run_launch(dir, {"--nproc_per_node", "auto", "--standalone", "--master_addr", "10.9.9.9", "--",
                                 "/bin/sh", "-c", "echo \"world $WORLD_SIZE at $MASTER_ADDR\""});
  INFO(result.out << result.err);
  REQUIRE(result.status == 0);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CHECK_THAT(result.out, Catch::Contains("world " + std::to_string(cores) + " at 127.0.0.1"));  // standalone wins
  CHECK_THAT(result.err, Catch::Contains("--standalone puts the store on a free port of 127.0.0.1"));  // said
  auto bad = run_launch(dir, {"--nproc-per-node", "some", "--", "true"});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.err, Catch::Contains("must be a number of ranks or 'auto'"));
  auto two_nodes = run_launch(dir, {"--nproc-per-node", "1", "--standalone", "--nnodes", "2", "--", "true"});
  CHECK(two_nodes.status == 2);
  // A flag given twice takes the last value, as torchrun's argparse does.
  auto twice = run_launch(dir, {"-n", "1", "--nproc_per_node", "2", "--", "/bin/sh", "-c", "echo \"world $WORLD_SIZE\""});
  INFO(twice.out << twice.err);
  CHECK(twice.status == 0);
  CHECK_THAT(twice.out, Catch::Contains("world 2"));
}

// torchrun's usual lines: a script it runs with Python (`torchrun
// --nproc_per_node 2 train.py`), a module (-m), and its rendezvous flags.
// braid-launch refused the script ("cannot execute 'train.py': Permission
// denied") and every rendezvous flag ("unknown option").
TEST_CASE("braid-launch runs torchrun's command lines: a script, -m, --rdzv-*", "[launch]") {
  JobDir dir;
  const auto script = dir.path() / "train.py";
  std::ofstream(script) << "import os, sys\nprint('rank', os.environ['RANK'], 'with', sys.orig_argv[1])\n";
  ::chmod(script.c_str(), 0644);  // as a script usually is: not executable
  auto ran = run_launch(dir, {"--nproc_per_node", "2", script.string()});
  INFO(ran.out << ran.err);
  CHECK(ran.status == 0);
  CHECK(sorted_lines(ran.out) == std::vector<std::string>{"[rank 0] rank 0 with -u", "[rank 1] rank 1 with -u"});
  std::filesystem::create_directories(dir.path() / "pkg");
  std::ofstream(dir.path() / "pkg" / "__init__.py").flush();
  std::ofstream(dir.path() / "pkg" / "job.py") << "import os\nprint('module on', os.environ['LOCAL_RANK'])\n";
  auto module = run_launch(dir, {"--nproc_per_node", "1", "-m", "pkg.job"}, {{"PYTHONPATH", dir.str()}});
  INFO(module.out << module.err);
  CHECK(module.status == 0);
  CHECK(module.out == "[rank 0] module on 0\n");
  auto plain = run_launch(dir, {"--nproc_per_node", "1", "--no-python", script.string()});
  CHECK(plain.status == 127);  // as asked: run as a program, which it is not
  // Executable without "#!" (exec ran it with /bin/sh), or named without a
  // path (exec looked it up in PATH): Python too, as under torchrun.
  ::chmod(script.c_str(), 0755);
  auto executable = run_launch(dir, {"--nproc_per_node", "1", script.string()});
  CHECK(executable.out == "[rank 0] rank 0 with -u\n");
  auto bare = LaunchedJob::program(dir, "bare", {"/bin/sh", "-c", "cd \"$0\" && exec \"$1\" --nproc_per_node 1 train.py",
                                                 dir.str(), std::getenv("BRAID_LAUNCH")});
  CHECK(bare->wait(20s) == 0);
  CHECK(bare->out() == "[rank 0] rank 0 with -u\n");
  auto rdzv = run_launch(dir, {"--nproc_per_node", "1", "--nnodes", "1:1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                               "127.0.0.1:29431", "--rdzv-id", "job7", "--", "/bin/sh", "-c",
                               "echo \"$MASTER_ADDR $TORCHELASTIC_RUN_ID\""});
  INFO(rdzv.out << rdzv.err);
  CHECK(rdzv.status == 0);
  CHECK(rdzv.out == "[rank 0] 127.0.0.1 job7\n");
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--nnodes", "1:4"}, "elastic job of 1 to 4 nodes"},
      {{"--rdzv-backend", "etcd"}, "--rdzv-backend etcd is not supported"},
      {{"--rdzv-endpoint", "127.0.0.1:29431", "--master-port", "29432"}, "pass one"},
      {{"--rdzv-endpoint", ":29431"}, "--rdzv-endpoint :29431 names no host"},
      {{"-m", "--no-python"}, "pass one"}};
  for (const auto& [flags, words] : refused) {
    std::vector<std::string> args{"--nproc_per_node", "1"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("true");
    auto result = run_launch(dir, args);
    INFO(Catch::Detail::stringify(flags) << ": " << result.err);
    CHECK(result.status == 2);
    CHECK_THAT(result.err, Catch::Contains(words));
  }
}

// torchrun's other options are refused by name wherever they stand. One
// before -n (as torchrun's lines are often written: --redirects 9:1 --tee
// 9:1 --nproc_per_node 2) read "--nproc-per-node is required", since the
// parse stopped at it and left -n to the program.
TEST_CASE("braid-launch names a torchrun-only option before or after -n, and a missing or malformed -n", "[launch]") {
  JobDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--redirects", "9:1", "--tee", "9:1", "--nproc_per_node", "1", "--", "true"}, "unknown option '--redirects'"},
      {{"--role", "trainer", "-n", "1", "true"}, "unknown option '--role'"},
      {{"-n", "1", "--tee", "3", "--", "true"}, "unknown option '--tee': braid-launch has no such option"},
      {{"-n", "1", "--monitor_interval=5", "true"},
       "unknown option '--monitor_interval'; put the program and its arguments after '--'"},
      {{"--", "true"}, "--nproc-per-node (-n) is required"},
      {{}, "--nproc-per-node (-n) is required"},
      // Given, but empty (a variable that expanded to nothing), or not in
      // decimal digits alone (stoi skipped a space and took '+').
      {{"-n", "", "true"}, "--nproc-per-node '' must be a number of ranks"},
      {{"-n", " 2", "true"}, "--nproc-per-node ' 2' must be a number of ranks"},
      {{"-n", "+2", "true"}, "--nproc-per-node '+2' must be a number of ranks"},
      {{"-n", "1", "--nnodes", "+1", "true"}, "--nnodes '+1' must be a number of nodes"}};
  for (const auto& [args, words] : refused) {
    auto result = run_launch(dir, args);
    INFO(Catch::Detail::stringify(args) << ": " << result.err);
    CHECK(result.status == 2);
    CHECK_THAT(result.err, Catch::Contains(words));
    CHECK(result.out.empty());
  }
}

TEST_CASE("--max-restarts stops every rank on a failure and starts them all again", "[launch]") {
  JobDir dir;
  // Attempt 0: rank 1 fails once both ranks run; attempt 1 succeeds. Each
  // rank notes the attempt it saw, from both restart-count variables.
  std::string script =
      "echo \"$BRAID_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS\" >> \"$0/attempts_$BRAID_RANK\"; "
      "echo \"$BRAID_RUN_ID $BRAID_JOB_TOKEN\" >> \"$0/ids_$BRAID_RANK\"; "
      "[ \"$BRAID_RESTART_COUNT\" -ge 1 ] && exit 0; "
      "if [ \"$BRAID_RANK\" = 1 ]; then "
      "  while [ ! -e \"$0/attempts_0\" ]; do sleep 0.02; done; exit 3; "
      "fi; exec sleep 60";
  auto result = run_launch(dir, shell_job(2, script, dir, {"--max-restarts", "2"}));
  INFO(result.out << result.err);
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("restarting all 2 ranks (restart 1 of at most 2)"));
  for (int r = 0; r < 2; ++r) CHECK(read_file(dir.path() / ("attempts_" + std::to_string(r))) == "0 0 2\n1 1 2\n");
  // Every attempt has a token of its own, and the job's run id.
  std::istringstream ids(read_file(dir.path() / "ids_0"));
  std::string run0, token0, run1, token1;
  ids >> run0 >> token0 >> run1 >> token1;
  CHECK(run0.size() == 16);
  CHECK(run1 == run0);
  CHECK(token1 != token0);
  // --log-dir: each attempt writes files of its own, so the failed
  // attempt's output stays (every attempt truncated rank_<r>.*).
  const auto logs = dir.path() / "logs";
  auto logged = run_launch(dir, shell_job(2,
                                          "echo \"attempt $BRAID_RESTART_COUNT\"; "
                                          "[ \"$BRAID_RESTART_COUNT\" = 0 ] && [ \"$BRAID_RANK\" = 1 ] && "
                                          "{ echo 'fatal: disk on fire' >&2; exit 3; }; exit 0",
                                          dir, {"--max-restarts", "1", "--log-dir", logs.string()}));
  CHECK(logged.status == 0);
  CHECK(read_file(logs / "rank_1.err") == "fatal: disk on fire\n");
  CHECK(read_file(logs / "rank_1.out") == "attempt 0\n");
  CHECK(read_file(logs / "rank_1.restart1.out") == "attempt 1\n");
  CHECK(read_file(logs / "rank_0.restart1.out") == "attempt 1\n");
  CHECK_FALSE(std::filesystem::exists(logs / "rank_0.restart2.out"));
  // A rank that always fails: the job gives up after the last restart with its status.
  auto always = run_launch(dir, shell_job(2, "exit 5", dir, {"--max_restarts", "1"}));
  CHECK(always.status == 5);
  CHECK_THAT(always.err, Catch::Contains("restart 1 of at most 1"));
  CHECK_THAT(always.err, !Catch::Contains("restart 2"));
  // Across nodes it is refused before anything starts.
  auto nodes = run_launch(dir, shell_job(1, "true", dir, {"--max-restarts", "1", "--nnodes", "2", "--master-port", "29999"}));
  CHECK(nodes.status == 2);
  CHECK_THAT(nodes.err, Catch::Contains("cannot restart yet"));
}
