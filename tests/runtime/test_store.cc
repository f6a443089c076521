// The store working as intended: every command, waits answered by other
// threads and processes, many clients at once, atomic counters. Real sockets
// on 127.0.0.1 with kernel-chosen ports.
#include <catch2/catch.hpp>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <numeric>
#include <thread>

#include "runtime/errors.h"
#include "runtime/store.h"
#include "tests/runtime/store_test_util.h"

using namespace braid;
using namespace braid::test;
using runtime::StoreServer;

TEST_CASE("store: set, get and try_get return what was stored", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  REQUIRE(server.port() != 0);
  auto store = connect_store(server.port());

  store->set("greeting", std::string("hello"));
  CHECK(store->get_string("greeting", 1s) == "hello");

  Bytes binary{0, 1, 2, 255, 0, 7};
  store->set("binary", binary);
  CHECK(store->get("binary", 1s) == binary);

  store->set("greeting", std::string("overwritten"));
  CHECK(store->get_string("greeting", 1s) == "overwritten");

  store->set("empty", Bytes{});
  CHECK(store->try_get("empty") == Bytes{});
  CHECK(store->try_get("absent") == std::nullopt);
  CHECK(store->try_get("binary") == binary);
}

TEST_CASE("store: a 4 MiB value survives the round trip", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto store = connect_store(server.port());
  Bytes big(4u << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 31 + 7);
  store->set("big", big);
  CHECK(store->get("big", 5s) == big);
}

TEST_CASE("store: wait returns once every key exists", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto store = connect_store(server.port());
  store->set("a", std::string("1"));
  store->set("b", std::string("2"));
  store->wait({"a", "b"}, 1s);
  store->wait({}, 1s);
}

TEST_CASE("store: add keeps a decimal counter", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto store = connect_store(server.port());

  CHECK(store->add("counter", 5) == 5);  // an absent key counts from 0
  CHECK(store->add("counter", -7) == -2);
  CHECK(store->get_string("counter", 1s) == "-2");

  store->set("seeded", std::string("40"));
  CHECK(store->add("seeded", 2) == 42);

  store->set("text", std::string("not a number"));
  CHECK_THROWS_AS(store->add("text", 1), InvalidUsage);
  store->set("max", std::to_string(INT64_MAX));
  CHECK_THROWS_AS(store->add("max", 1), InvalidUsage);
  CHECK(store->add("counter", 2) == 0);  // the connection survived both refusals
}

TEST_CASE("store: remove says whether the key existed", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto store = connect_store(server.port());
  store->set("doomed", std::string("x"));
  CHECK(store->remove("doomed"));
  CHECK_FALSE(store->remove("doomed"));
  CHECK(store->try_get("doomed") == std::nullopt);
}

TEST_CASE("store: remove_prefix removes the keys under a prefix, sparing the prefixes named", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto store = connect_store(server.port());
  for (const char* key : {"c/1", "c/2", "c/left", "c/split0/x", "c/split1/color0/y", "c2/1", "c", "b/1"})
    store->set(key, std::string(key));
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  CHECK(store->remove_prefix("c/", {"c/split"}, deadline) == 3);
  for (const char* gone : {"c/1", "c/2", "c/left"}) CHECK(store->try_get(gone) == std::nullopt);
  for (const char* kept : {"c/split0/x", "c/split1/color0/y", "c2/1", "c", "b/1"})
    CHECK(store->get_string(kept, 1s) == kept);
  CHECK(store->remove_prefix("c/", {"c/split"}, deadline) == 0);
  CHECK(store->remove_prefix("c/split1/color0/", {}, deadline) == 1);
  CHECK(store->try_get("c/split1/color0/y") == std::nullopt);
  CHECK(store->add("n", 2, deadline) == 2);
}

TEST_CASE("store: the bytes of removed keys are free again", "[store]") {
  runtime::StoreLimits limits;
  limits.max_bytes = 64u << 10;
  StoreServer server("127.0.0.1", 0, kToken, limits);
  auto store = connect_store(server.port());
  // Ten times what the store holds, in rounds that each remove their keys.
  for (int round = 0; round < 100; ++round) {
    const std::string prefix = "comm" + std::to_string(round) + "/";
    for (int i = 0; i < 16; ++i) store->set(prefix + std::to_string(i), std::string(300, 'x'));
    REQUIRE(store->remove_prefix(prefix, {}, std::chrono::steady_clock::now() + 5s) == 16);
  }
}

TEST_CASE("store: get waits for a key that another thread sets later", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto waiter = connect_store(server.port());
  TestThread setter([port = server.port()] {
    auto store = connect_store(port);
    std::this_thread::sleep_for(100ms);
    store->set("late", std::string("worth the wait"));
    std::this_thread::sleep_for(50ms);
    store->set("late-2", std::string("2"));
  });
  CHECK(waiter->get_string("late", 10s) == "worth the wait");
  waiter->wait({"late", "late-2"}, 10s);
  setter.join();
}

TEST_CASE("store: add wakes a get waiting on the counter", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto waiter = connect_store(server.port());
  TestThread adder([port = server.port()] {
    std::this_thread::sleep_for(50ms);
    connect_store(port)->add("arrivals", 3);
  });
  CHECK(waiter->get_string("arrivals", 10s) == "3");
  adder.join();
}

namespace {

// Child side of the fork test: read the port from the pipe, set one key.
[[noreturn]] void child_sets_key(int port_pipe) {
  int code = 1;
  try {
    std::uint16_t port = 0;
    pollfd pfd{port_pipe, POLLIN, 0};
    if (::poll(&pfd, 1, 10'000) == 1 && ::read(port_pipe, &port, sizeof port) == sizeof port) {
      auto store = connect_store(port);
      std::this_thread::sleep_for(50ms);
      store->set("from-child", std::string("pid ") + std::to_string(::getpid()));
      code = 0;
    }
  } catch (...) {
  }
  ::_exit(code);
}

// Waits up to `timeout` for the child; kills it if it overstays.
int wait_child(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("store: get waits for a key that a forked process sets", "[store][fork]") {
  // Fork before the server starts its thread, so the child is a clean copy.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) child_sets_key(fds[0]);
  ::close(fds[0]);

  StoreServer server("127.0.0.1", 0, kToken);
  std::uint16_t port = server.port();
  REQUIRE(::write(fds[1], &port, sizeof port) == sizeof port);
  ::close(fds[1]);
  auto store = connect_store(port);
  CHECK(store->get_string("from-child", 10s) == "pid " + std::to_string(pid));
  CHECK(wait_child(pid, 10s) == 0);
}

TEST_CASE("store: 16 clients exchange keys concurrently", "[store]") {
  constexpr int kClients = 16;
  StoreServer server("127.0.0.1", 0, kToken);
  std::vector<std::string> all_keys;
  for (int i = 0; i < kClients; ++i) all_keys.push_back("peer/" + std::to_string(i));
  std::vector<int> matches(kClients, 0);
  run_threads(kClients, [&](int i) {
    auto store = connect_store(server.port());
    store->set(all_keys[i], "addr-" + std::to_string(i));
    store->wait(all_keys, 10s);
    for (int j = 0; j < kClients; ++j) matches[i] += store->get_string(all_keys[j], 1s) == "addr-" + std::to_string(j);
  });
  CHECK(matches == std::vector<int>(kClients, kClients));
}

TEST_CASE("store: add is atomic across 8 clients x 1000 increments", "[store]") {
  constexpr int kClients = 8;
  constexpr int kIncrements = 1000;
  StoreServer server("127.0.0.1", 0, kToken);
  std::vector<std::vector<std::int64_t>> seen(kClients);
  run_threads(kClients, [&](int i) {
    auto store = connect_store(server.port());
    for (int k = 0; k < kIncrements; ++k) seen[i].push_back(store->add("ticket", 1));
  });

  // Every add returned a distinct value: together exactly 1..8000.
  std::vector<std::int64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> expected(kClients * kIncrements);
  std::iota(expected.begin(), expected.end(), 1);
  CHECK(all == expected);
  CHECK(connect_store(server.port())->get_string("ticket", 1s) == std::to_string(kClients * kIncrements));
}

TEST_CASE("store: one Store is safe to share between threads", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto store = connect_store(server.port());
  std::vector<int> good(4, 0);
  run_threads(4, [&](int i) {
    for (int k = 0; k < 200; ++k) {
      std::string key = std::to_string(i) + "/" + std::to_string(k);
      store->set(key, key);
      good[i] += store->get_string(key, 1s) == key;
    }
  });
  CHECK(good == std::vector<int>(4, 200));
}

TEST_CASE("store: a client started before its server connects once the server is up", "[store]") {
  std::uint16_t port = unused_port();
  std::unique_ptr<runtime::Store> store;
  TestThread client([&] { store = connect_store(port, kToken, 10s); });
  std::this_thread::sleep_for(150ms);
  StoreServer server("127.0.0.1", port, kToken);
  client.join();
  REQUIRE(store);
  store->set("k", std::string("v"));
  CHECK(store->get_string("k", 1s) == "v");
}
