// A job's store ports (runtime/store_ports.h): the candidate sequence, a
// server that moves past ports in use, and clients that find their own
// job's store among other jobs' stores and foreign listeners. Real sockets
// on 127.0.0.1; the first port of each sequence is kernel-chosen and then
// taken on purpose.
#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "runtime/errors.h"
#include "runtime/store.h"
#include "runtime/store_ports.h"
#include "tests/runtime/store_test_util.h"

using namespace braid;
using namespace braid::test;
using Catch::Matchers::Contains;
using runtime::Store;
using runtime::StoreServer;
using runtime::store_port_candidates;

namespace {

bool contains(const std::vector<std::uint16_t>& ports, std::uint16_t port) {
  return std::find(ports.begin(), ports.end(), port) != ports.end();
}

}  // namespace

TEST_CASE("store ports: the given port first, then distinct ports derived from it and the token", "[store_ports]") {
  auto ports = store_port_candidates(29500, "job-a");
  REQUIRE(ports.size() == runtime::kStorePortCandidates);
  CHECK(ports.front() == 29500);
  CHECK(std::set<std::uint16_t>(ports.begin(), ports.end()).size() == ports.size());
  for (std::size_t i = 1; i < ports.size(); ++i) {
    CHECK(ports[i] >= runtime::kDerivedStorePortLo);
    CHECK(ports[i] < runtime::kDerivedStorePortHi);
  }
  CHECK(store_port_candidates(29500, "job-a") == ports);  // every rank computes the same
  CHECK(runtime::derived_store_port(29500, "job-a") == ports[1]);
  // Another job (token) or another first port: another sequence after the first port.
  auto other = store_port_candidates(29500, "job-b");
  CHECK(std::vector<std::uint16_t>(other.begin() + 1, other.end()) !=
        std::vector<std::uint16_t>(ports.begin() + 1, ports.end()));
  CHECK(store_port_candidates(29501, "job-a")[1] != ports[1]);
  CHECK(store_port_candidates(0, "job-a") == std::vector<std::uint16_t>{0});
}

TEST_CASE("store ports: a server moves past ports in use, and says what to set when all are", "[store_ports]") {
  Squatter first;
  auto ports = store_port_candidates(first.port(), kToken);
  SECTION("the first port taken: it listens on a later one of the job's ports") {
    StoreServer server("127.0.0.1", ports, kToken, "set THE_PORT");
    CHECK(server.port() != first.port());
    CHECK(contains(ports, server.port()));
  }
  SECTION("every port taken: SystemError naming the ports and the remedy") {
    std::vector<std::unique_ptr<Squatter>> taken;
    for (std::size_t i = 1; i < ports.size(); ++i) {
      try {
        taken.push_back(std::make_unique<Squatter>(ports[i]));
      } catch (const std::runtime_error&) {
        // already in use by something else on this machine: taken all the same
      }
    }
    CHECK_THROWS_AS(StoreServer("127.0.0.1", ports, kToken, "set THE_PORT"), SystemError);
    CHECK_THROWS_WITH(StoreServer("127.0.0.1", ports, kToken, "set THE_PORT"),
                      Contains("set THE_PORT") && Contains(std::to_string(first.port())) &&
                          Contains(std::to_string(ports.back())) && Contains("in use"));
  }
}

TEST_CASE("store ports: two jobs given the same port each find their own store by token", "[store_ports]") {
  std::uint16_t shared = unused_port();
  auto ports_a = store_port_candidates(shared, "token-a");
  auto ports_b = store_port_candidates(shared, "token-b");
  StoreServer a("127.0.0.1", ports_a, "token-a", "");
  StoreServer b("127.0.0.1", ports_b, "token-b", "");
  REQUIRE(a.port() == shared);
  REQUIRE(b.port() != shared);
  auto client_a = Store::find("127.0.0.1", ports_a, "token-a", 10s, "");
  auto client_b = Store::find("127.0.0.1", ports_b, "token-b", 10s, "");
  CHECK(client_a->port() == a.port());
  CHECK(client_b->port() == b.port());
  client_a->set("who", std::string("a"));
  client_b->set("who", std::string("b"));
  CHECK(client_a->get_string("who", 1s) == "a");
  CHECK(client_b->get_string("who", 1s) == "b");
}

TEST_CASE("store ports: a client that starts first finds the store wherever it comes up", "[store_ports]") {
  std::uint16_t shared = unused_port();
  StoreServer other_job("127.0.0.1", shared, "token-other");
  auto ports = store_port_candidates(shared, kToken);
  std::unique_ptr<Store> client;
  TestThread finder([&] { client = Store::find("127.0.0.1", ports, kToken, 10s, ""); });
  std::this_thread::sleep_for(300ms);  // the client is probing by now; its store is not up yet
  StoreServer mine("127.0.0.1", ports, kToken, "");
  finder.join();
  REQUIRE(client);
  CHECK(client->port() == mine.port());
  CHECK(mine.port() != shared);
}

TEST_CASE("store ports: a listener that never answers is passed over", "[store_ports]") {
  Squatter silent;
  auto ports = store_port_candidates(silent.port(), kToken);
  StoreServer mine("127.0.0.1", ports, kToken, "");
  REQUIRE(mine.port() != silent.port());
  auto start = std::chrono::steady_clock::now();
  auto client = Store::find("127.0.0.1", ports, kToken, 20s, "");
  CHECK(client->port() == mine.port());
  CHECK(seconds_since(start) < 15);  // one silent port costs one handshake bound, not the whole timeout
  // Within less than that bound, the ports after it were never tried, and
  // the error says so: it said "nothing listens (not tried)".
  CHECK_THROWS_WITH(Store::find("127.0.0.1", {silent.port(), mine.port()}, kToken, 500ms, ""),
                    Contains(" ms at " + std::to_string(silent.port())) && Contains("no answer within ") &&
                        !Contains("within 2000 ms") &&
                        Contains("not tried before the time ran out at " + std::to_string(mine.port())) &&
                        !Contains("nothing listens"));
}

TEST_CASE("store ports: no store of the job means a bounded error naming the ports and the remedy",
          "[store_ports]") {
  std::uint16_t first = unused_port();
  auto ports = store_port_candidates(first, kToken);
  SECTION("nothing at all: TimeoutError") {
    auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(Store::find("127.0.0.1", ports, kToken, 1s, "set MASTER_PORT"), TimeoutError);
    CHECK(seconds_since(start) < 5);
    CHECK_THROWS_WITH(Store::find("127.0.0.1", ports, kToken, 500ms, "set MASTER_PORT"),
                      Contains("set MASTER_PORT") && Contains(std::to_string(first)) &&
                          Contains(std::to_string(ports.back())) && Contains("nothing listens"));
  }
  SECTION("only another job's store: RemoteError saying it refused the token") {
    StoreServer other_job("127.0.0.1", first, "token-other");
    CHECK_THROWS_AS(Store::find("127.0.0.1", ports, kToken, 1s, "set MASTER_PORT"), RemoteError);
    CHECK_THROWS_WITH(Store::find("127.0.0.1", ports, kToken, 1s, "set MASTER_PORT"),
                      Contains("wrong job token") && Contains("set MASTER_PORT"));
  }
}

// A process out of file descriptors (torch's new_group, called a hundred
// times) retried as if the store were not up yet, for the whole timeout.
TEST_CASE("store ports: a client out of file descriptors fails at once, naming the limit", "[store_ports]") {
  StoreServer server("127.0.0.1", 0, kToken);
  rlimit before{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &before) == 0);
  // The lowest free descriptor becomes the limit: the next socket() fails.
  const int lowest = ::dup(0);
  REQUIRE(lowest >= 0);
  ::close(lowest);
  rlimit tight = before;
  tight.rlim_cur = static_cast<rlim_t>(lowest);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &tight) == 0);
  struct Restore {
    rlimit limit;
    ~Restore() { setrlimit(RLIMIT_NOFILE, &limit); }
  } restore{before};
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(Store::find("127.0.0.1", {server.port()}, kToken, 20s, ""),
                    Contains("cannot open a socket to reach the store") && Contains("Too many open files") &&
                        Contains("of its " + std::to_string(lowest) + " descriptors") && Contains("ulimit -n"));
  CHECK_THROWS_WITH(Store("127.0.0.1", server.port(), kToken, 20s), Contains("Too many open files"));
  // Room for the client's own io_context (an epoll, an eventfd), none for
  // its socket.
  tight.rlim_cur = static_cast<rlim_t>(lowest + 2);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &tight) == 0);
  CHECK_THROWS_WITH(Store::find("127.0.0.1", {server.port()}, kToken, 20s, ""),
                    Contains("cannot open a socket to reach the store at 127.0.0.1:") &&
                        Contains("Too many open files") && Contains("ulimit -n"));
  CHECK(seconds_since(start) < 5);
}

TEST_CASE("store ports: serve_job_store and connect_job_store under srun's variables", "[store_ports]") {
  runtime::RankInfo info;
  info.launcher = "slurm";
  info.world_size = 2;
  info.store_port = unused_port();
  info.job_token = "srun-job";
  StoreServer other_job("127.0.0.1", info.store_port, "another-srun-job");
  auto server = runtime::serve_job_store(info);  // rank 0
  REQUIRE(server);
  CHECK(server->port() != info.store_port);
  auto rank0 = runtime::connect_job_store(info, server.get(), 5s);
  info.rank = 1;
  CHECK_FALSE(runtime::serve_job_store(info));
  auto rank1 = runtime::connect_job_store(info, nullptr, 10s);
  CHECK(rank1->port() == server->port());
  rank0->set("k", std::string("v"));
  CHECK(rank1->get_string("k", 1s) == "v");
  CHECK_THAT(runtime::store_port_remedy(info), Contains("MASTER_PORT") && Contains("BRAID_STORE_ADDR"));
}

TEST_CASE("store ports: a second process started as rank 0 of the same job is named, not served elsewhere",
          "[store_ports]") {
  runtime::RankInfo info;
  info.launcher = "slurm";
  info.world_size = 2;
  info.store_port = unused_port();
  info.job_token = "srun-job";
  auto first = runtime::serve_job_store(info);
  REQUIRE(first);
  REQUIRE(first->port() == info.store_port);
  // Before, the second served the job's store on the next port and waited
  // there alone until the timeout: "rank 1 has not joined".
  CHECK_THROWS_AS(runtime::serve_job_store(info), InvalidUsage);
  CHECK_THROWS_WITH(runtime::serve_job_store(info),
                    Contains("a store of this very job") &&
                        Contains("127.0.0.1:" + std::to_string(info.store_port)) &&
                        Contains("another process started as rank 0") && Contains("BRAID_JOB_TOKEN"));
  // Another job's store on the port is no duplicate: this job's moves on.
  info.job_token = "another-srun-job";
  auto other = runtime::serve_job_store(info);
  REQUIRE(other);
  CHECK(other->port() != info.store_port);
}
