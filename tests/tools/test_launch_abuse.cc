// braid-launch under abuse and exhausted resources (issue 13, the
// "fault-and-abuse suite", tag [abuse]): multi-node launches without a job
// token or a bind address, more ranks than RLIMIT_NOFILE allows, and a flood
// of idle connections at the store a second node must still join. The real
// binary runs as a child of the test with shell scripts as ranks; network
// traffic goes to 127.0.0.1 only (the route lookups send no packet).
#include <signal.h>

#include <catch2/catch.hpp>
#include <regex>
#include <sstream>

#include "launch_harness.h"
#include "runtime/errors.h"
#include "runtime/store.h"
#include "tests/runtime/store_test_util.h"

using namespace braid::test;
using Catch::Matchers::Contains;

namespace {

std::string recording(const std::string& script) {
  return "echo $$ > \"$0/pid_$BRAID_RANK\"; " + script;
}

std::vector<std::string> node_args(int node_rank, const std::string& master_addr, std::uint16_t port) {
  return {"--nnodes", "2", "--node-rank", std::to_string(node_rank), "--master-addr", master_addr,
          "--master-port", std::to_string(port)};
}

// The store address and token a rank wrote to $0/store, once it is there.
struct StoreAccess {
  std::string host;
  std::uint16_t port = 0;
  std::string token;
};

// A rank script that publishes its store and token, then waits to be stopped.
const std::string kPublishStore = recording(
    "echo \"$BRAID_STORE_ADDR $BRAID_JOB_TOKEN\" > \"$0/store.tmp\"; mv \"$0/store.tmp\" \"$0/store\"; "
    "exec sleep 60");

StoreAccess published_store(const JobDir& dir) {
  wait_for_file(dir.path() / "store");
  std::istringstream line(read_file(dir.path() / "store"));
  std::string addr;
  StoreAccess access;
  line >> addr >> access.token;
  access.host = addr.substr(0, addr.rfind(':'));
  access.port = static_cast<std::uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
  return access;
}

void stop(LaunchedJob& job) {
  REQUIRE(::kill(job.pid(), SIGTERM) == 0);
  CHECK(job.wait() == 128 + SIGTERM);
}

// The token in node 0's "export BRAID_JOB_TOKEN=..." line, or "".
std::string printed_token(const std::string& err) {
  std::smatch match;
  static const std::regex kLine("export BRAID_JOB_TOKEN=([0-9a-f]+)");
  return std::regex_search(err, match, kLine) ? match[1].str() : "";
}

}  // namespace

TEST_CASE("launch abuse: a job across nodes without BRAID_JOB_TOKEN gets no token computed from its address",
          "[abuse][launch]") {
  std::uint16_t port = unused_port();
  EnvChanges no_token{{"BRAID_JOB_TOKEN", std::nullopt}};

  SECTION("another node refuses to start, saying what to set") {
    JobDir dir;
    auto args = shell_job(2, recording("true"), dir, node_args(1, "127.0.0.1", port));
    auto result = run_launch(dir, args, no_token);
    CHECK(result.status == 2);
    CHECK_THAT(result.err, Contains("BRAID_JOB_TOKEN is not set") && Contains("node 0"));
    CHECK(dir.recorded_pids().empty());
  }
  SECTION("node 0 generates one, prints how to pass it on, and its store takes only that") {
    std::string first_token;
    for (int launch = 0; launch < 2; ++launch) {  // the same address twice
      JobDir dir;
      LaunchedJob job(dir, shell_job(1, kPublishStore, dir, node_args(0, "127.0.0.1", port)), no_token);
      StoreAccess store = published_store(dir);
      INFO(job.err());
      CHECK(printed_token(job.err()) == store.token);
      CHECK(store.token.size() == 32);
      braid::runtime::Store client(store.host, store.port, store.token, 5s);
      client.set("joined", std::string("yes"));
      CHECK_THROWS_AS(braid::runtime::Store(store.host, store.port, "derived-guess", 5s), braid::RemoteError);
      stop(job);
      if (launch == 0) first_token = store.token;
      else CHECK(store.token != first_token);
    }
  }
  SECTION("with the token node 0 printed, another node starts") {
    JobDir dir;
    auto result = run_launch(dir, shell_job(1, recording("echo $BRAID_JOB_TOKEN > \"$0/token\""), dir,
                                            node_args(1, "127.0.0.1", port)),
                             {{"BRAID_JOB_TOKEN", "0123456789abcdef0123456789abcdef"}});
    CHECK(result.status == 0);
    CHECK(read_file(dir.path() / "token") == "0123456789abcdef0123456789abcdef\n");
  }
}

TEST_CASE("launch abuse: without BRAID_BIND_ADDR a job across nodes listens where the master is reached",
          "[abuse][launch]") {
  EnvChanges env{{"BRAID_JOB_TOKEN", "bind-test-token"}, {"BRAID_BIND_ADDR", std::nullopt}};
  std::string script = recording("echo \"bind=$BRAID_BIND_ADDR\" > \"$0/bind_$BRAID_RANK\"");

  SECTION("no route to the master: every node fails at once naming BRAID_BIND_ADDR, nothing starts") {
    for (int node = 0; node < 2; ++node) {
      INFO("node " << node);
      JobDir dir;
      auto start = std::chrono::steady_clock::now();
      auto args = shell_job(2, script, dir, node_args(node, "255.255.255.255", 29517));
      auto result = run_launch(dir, args, env);
      CHECK(result.status == 2);
      CHECK_THAT(result.err, Contains("255.255.255.255") && Contains("set BRAID_BIND_ADDR"));
      CHECK(dir.recorded_pids().empty());
      CHECK(seconds_since(start) < 10);
    }
  }
  SECTION("a master on this machine's network address: ranks are told to listen on the routed address") {
    auto mine = local_ipv4_address();
    if (!mine) {
      WARN("no non-loopback IPv4 address here: skipped");
      return;
    }
    JobDir dir;  // node 1 serves no store, so no connection is made
    auto result = run_launch(dir, shell_job(2, script, dir, node_args(1, *mine, 29517)), env);
    REQUIRE(result.status == 0);
    for (int rank : {2, 3})
      CHECK(read_file(dir.path() / ("bind_" + std::to_string(rank))) == "bind=" + *mine + "\n");
  }
}

// Every rank listens on BRAID_BIND_ADDR. A name or a mistyped address
// failed as "cannot resolve store address" (never given), one of another
// machine as the store's "cannot listen", "localhost" on every rank after
// the launch: refused at once, by its name, before any rank starts.
TEST_CASE("launch abuse: a BRAID_BIND_ADDR that is no IP address of this machine is refused by its name",
          "[abuse][launch]") {
  const std::string script = recording("true");
  for (const char* addr : {"garbage", "localhost", "999.1.1.1", "192.0.2.1"}) {
    INFO(addr);
    JobDir dir;
    auto result = run_launch(dir, shell_job(2, script, dir), {{"BRAID_BIND_ADDR", addr}});
    CHECK(result.status == 2);
    CHECK_THAT(result.err, Contains("BRAID_BIND_ADDR") && Contains(addr) && !Contains("store address"));
    CHECK(dir.recorded_pids().empty());
  }
}

TEST_CASE("launch abuse: more ranks than RLIMIT_NOFILE allows", "[abuse][launch]") {
  constexpr int kRanks = 40;  // about 170 descriptors for the launcher
  std::string script = recording("ulimit -n > \"$0/nofile_$BRAID_RANK\"");
  SECTION("past the hard limit: refused before any rank starts, naming the limit and the shortfall") {
    JobDir dir;
    auto result = run_launch(dir, shell_job(kRanks, script, dir), {}, {rlimit{64, 64}});
    CHECK(result.status == 2);
    CHECK_THAT(result.err, Contains("RLIMIT_NOFILE") && Contains("hard limit 64") && Contains("short") &&
                               Contains("40 ranks"));
    CHECK(dir.recorded_pids().empty());
  }
  SECTION("past the soft limit only: raised to the hard limit, and the job runs") {
    JobDir dir;
    auto result = run_launch(dir, shell_job(kRanks, script, dir), {}, {rlimit{64, 4096}});
    REQUIRE(result.status == 0);
    for (int rank = 0; rank < kRanks; ++rank)
      CHECK(read_file(dir.path() / ("nofile_" + std::to_string(rank))) == "4096\n");
  }
}

TEST_CASE("launch abuse: a flood of idle connections does not stop a second node from joining",
          "[abuse][launch][store]") {
  JobDir dir;
  std::uint16_t port = unused_port();
  // 128 descriptors: the flood would exhaust them many times over.
  LaunchedJob node0(dir, shell_job(1, kPublishStore, dir, node_args(0, "127.0.0.1", port)),
                    {{"BRAID_JOB_TOKEN", "flood-test-token"}}, {rlimit{128, 128}});
  StoreAccess store = published_store(dir);
  {
    Flood flood(store.port, 2000);
    // What a rank of node 1 does first: connect to the store, publish, read.
    braid::runtime::Store rank_of_node1(store.host, store.port, store.token, 10s);
    rank_of_node1.set("braid/world/host/1", std::string("node1"));
    CHECK(rank_of_node1.get_string("braid/world/host/1", 5s) == "node1");
  }
  stop(node0);
  CHECK_THAT(node0.err(), Contains("dropped") && Contains("unauthenticated connection"));
}

TEST_CASE("launch abuse: the launcher's store is bounded by BRAID_STORE_MAX_BYTES",
          "[abuse][launch][store]") {
  JobDir dir;
  LaunchedJob job(dir, shell_job(1, kPublishStore, dir), {{"BRAID_STORE_MAX_BYTES", "1M"}});
  StoreAccess store = published_store(dir);
  {
    braid::runtime::Store client(store.host, store.port, store.token, 5s);
    CHECK_THROWS_WITH(client.set("big", braid::runtime::Bytes(2u << 20, 1)),
                      Contains("BRAID_STORE_MAX_BYTES"));
    client.set("small", std::string("fits"));
    CHECK(client.get_string("small", 5s) == "fits");
  }
  stop(job);
}
