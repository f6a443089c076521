// The store failing well: timeouts that name the missing keys, refusals of
// wrong tokens and broken requests (after which the server keeps serving),
// a silent server, and a server destroyed under parked waiters. Time bounds
// are generous: they catch hangs, not slowness.
#include <catch2/catch.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "runtime/errors.h"
#include "runtime/store.h"
#include "tests/runtime/store_test_util.h"

using namespace braid;
using namespace braid::test;
using Catch::Matchers::Contains;
using runtime::StoreServer;

namespace {

constexpr std::uint8_t kSet = 1, kGet = 2, kTryGet = 3, kWait = 4;
constexpr std::uint8_t kStatusBadRequest = 4;

// The server still serves a well-behaved client.
void check_still_serving(const StoreServer& server) {
  auto store = connect_store(server.port());
  store->set("alive", std::string("yes"));
  CHECK(store->get_string("alive", 1s) == "yes");
}

// Accepts one connection, completes its handshake, then never answers.
class SilentServer {
 public:
  SilentServer() : listen_fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr = loopback(0);
    socklen_t addr_bytes = sizeof addr;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listen_fd_, 4);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &addr_bytes);
    port_ = ntohs(addr.sin_port);
    thread_ = std::make_unique<TestThread>([this] { serve_handshake(); });
  }
  ~SilentServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept() if no client came
    thread_.reset();
    ::close(conn_fd_);
    ::close(listen_fd_);
  }
  std::uint16_t port() const { return port_; }

 private:
  void serve_handshake() {
    conn_fd_ = ::accept(listen_fd_, nullptr, nullptr);
    Bytes hello_bytes = hello();
    Bytes got(hello_bytes.size());
    ::recv(conn_fd_, got.data(), got.size(), MSG_WAITALL);
    Bytes ok{0, 8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};  // accepted: the store's instance
    ::send(conn_fd_, ok.data(), ok.size(), MSG_NOSIGNAL);
  }

  int listen_fd_;
  int conn_fd_ = -1;
  std::uint16_t port_ = 0;
  std::unique_ptr<TestThread> thread_;
};

}  // namespace

TEST_CASE("store failures: get of a missing key times out naming the key", "[store][failure]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto store = connect_store(server.port());
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(store->get("never-set", 200ms), Contains("'never-set'") && Contains("200 ms"));
  CHECK(seconds_since(start) >= 0.19);
  CHECK(seconds_since(start) < 5);
  // The server answered the timeout, so the connection is still good.
  store->set("after", std::string("timeout"));
  CHECK(store->get_string("after", 1s) == "timeout");
}

TEST_CASE("store failures: wait times out naming the keys still missing", "[store][failure]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto store = connect_store(server.port());
  store->set("present", std::string("1"));
  auto start = std::chrono::steady_clock::now();
  try {
    store->wait({"present", "missing-a", "missing-b"}, 200ms);
    FAIL("wait returned although keys were missing");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Contains("keys [missing-a, missing-b] did not appear"));
  }
  CHECK(seconds_since(start) < 5);
}

TEST_CASE("store failures: a client with no server times out after its connect timeout", "[store][failure]") {
  std::uint16_t port = unused_port();
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(connect_store(port, kToken, 300ms), TimeoutError);
  CHECK(seconds_since(start) >= 0.29);
  CHECK(seconds_since(start) < 5);
}

TEST_CASE("store failures: a silent server makes requests time out on the client", "[store][failure]") {
  SilentServer silent;
  auto store = connect_store(silent.port());
  store->set_request_timeout(200ms);
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(store->set("k", std::string("v")), TimeoutError);
  CHECK(seconds_since(start) < 5);
  // The unanswered connection is closed; the next request opens another,
  // which a silent server does not answer either.
  CHECK_THROWS_WITH(store->try_get("k"), Contains("a new connection to it went unanswered"));
}

TEST_CASE("store failures: a wrong token is refused and named", "[store][failure]") {
  StoreServer server("127.0.0.1", 0, kToken);
  CHECK_THROWS_AS(connect_store(server.port(), "some-other-job"), RemoteError);
  CHECK_THROWS_WITH(connect_store(server.port(), "some-other-job"), Contains("token"));
  check_still_serving(server);
}

TEST_CASE("store failures: a wrong handshake is refused and the connection closed", "[store][failure]") {
  StoreServer server("127.0.0.1", 0, kToken);
  auto [hello_bytes, reason] = GENERATE(table<Bytes, std::string>({
      {hello(kToken, runtime::kStoreProtocolVersion, "HTTP"), "magic"},
      {hello(kToken, runtime::kStoreProtocolVersion + 1), "version"},
      {hello(std::string(5000, 't')), "too long"},
      {hello(""), "token"},
  }));
  RawClient raw(server.port());
  REQUIRE(raw.send(hello_bytes));
  auto [status, message] = raw.recv_handshake_reply();
  CHECK(status != 0);
  CHECK_THAT(message, Contains("refused") && Contains(reason));
  CHECK(raw.closed_by_peer());
  check_still_serving(server);
}

TEST_CASE("store failures: an oversized request is refused and the server keeps serving", "[store][failure]") {
  StoreServer server("127.0.0.1", 0, kToken);
  RawClient raw(server.port());
  REQUIRE(raw.send(hello()));
  REQUIRE(raw.recv_handshake_reply().first == 0);
  REQUIRE(raw.send(cat({le32_bytes(static_cast<std::uint32_t>(runtime::kMaxRequestBytes + 1)), Bytes{kSet}})));
  auto [status, message] = raw.recv_response();
  CHECK(status == kStatusBadRequest);
  CHECK_THAT(message, Contains("exceeds"));
  CHECK(raw.closed_by_peer());
  check_still_serving(server);
}

TEST_CASE("store failures: malformed requests are refused and the server keeps serving", "[store][failure]") {
  Bytes past_body = cat({le32_bytes(1000), Bytes{'k'}});  // key_bytes far beyond the body
  Bytes huge_count = cat({le32_bytes(100), le32_bytes(0xffffffff)});  // timeout_ms, key count
  Bytes trailing = cat({key_field("k"), Bytes{0}});
  auto [frame, reason] = GENERATE_COPY(table<Bytes, std::string>({
      {request(99, key_field("k")), "unknown store command"},
      {request(kSet, {1, 2}), "runs past"},
      {request(kTryGet, past_body), "runs past"},
      {request(kWait, huge_count), "key count"},
      {request(kTryGet, trailing), "unexpected bytes"},
  }));
  StoreServer server("127.0.0.1", 0, kToken);
  RawClient raw(server.port());
  REQUIRE(raw.send(hello()));
  REQUIRE(raw.recv_handshake_reply().first == 0);
  REQUIRE(raw.send(frame));
  auto [status, message] = raw.recv_response();
  CHECK(status == kStatusBadRequest);
  CHECK_THAT(message, Contains(reason));
  CHECK(raw.closed_by_peer());
  check_still_serving(server);
}

TEST_CASE("store failures: a half-sent request does not hold up other clients", "[store][failure]") {
  StoreServer server("127.0.0.1", 0, kToken);
  RawClient raw(server.port());
  REQUIRE(raw.send(hello()));
  REQUIRE(raw.recv_handshake_reply().first == 0);
  REQUIRE(raw.send({50, 0, 0, 0, kSet, 1}));  // promises 50 bytes, sends 1
  check_still_serving(server);
}

TEST_CASE("store failures: a waiter that hangs up is forgotten", "[store][failure]") {
  StoreServer server("127.0.0.1", 0, kToken);
  {
    RawClient raw(server.port());
    REQUIRE(raw.send(hello()));
    REQUIRE(raw.recv_handshake_reply().first == 0);
    REQUIRE(raw.send(request(kGet, cat({le32_bytes(60'000), key_field("later")}))));
    std::this_thread::sleep_for(50ms);
  }  // hangs up while parked
  std::this_thread::sleep_for(50ms);
  auto store = connect_store(server.port());
  store->set("later", std::string("now"));  // wakes nobody, harms nothing
  CHECK(store->get_string("later", 1s) == "now");
}

TEST_CASE("store failures: destroying the server frees parked waiters and idle clients", "[store][failure]") {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0, kToken);
  auto idle = connect_store(server->port());
  std::atomic<int> remote_errors{0};
  std::vector<std::unique_ptr<TestThread>> waiters;
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<runtime::Store> store = connect_store(server->port());
    waiters.push_back(std::make_unique<TestThread>([&remote_errors, store] {
      try {
        store->get("never", 30s);
      } catch (const RemoteError& e) {
        remote_errors += std::string(e.what()).find("closed the connection") != std::string::npos;
      }
    }));
  }
  std::this_thread::sleep_for(200ms);  // let the waiters park

  auto start = std::chrono::steady_clock::now();
  server.reset();
  CHECK(seconds_since(start) < 5);
  for (auto& waiter : waiters) waiter->join();
  CHECK(remote_errors == 3);
  CHECK(seconds_since(start) < 5);
  CHECK_THROWS_AS(idle->set("k", std::string("v")), RemoteError);
  // A later request says why, too (a split after rank 0, the store's
  // server, exited, said only that the connection was unusable).
  CHECK_THROWS_AS(idle->try_get("k"), RemoteError);
  CHECK_THROWS_WITH(idle->try_get("k"), Contains("unusable after an earlier failure") &&
                                            Contains("the launcher or rank 0 may have exited"));
}

// The calls bounded by a deadline (store.h), for comm/status.cc's failure
// path: they must not wait a request timeout behind a store that does not
// answer, nor break a connection that another thread's request holds.

TEST_CASE("store failures: a bounded request to a silent server gives up at its deadline", "[store][failure]") {
  SilentServer silent;
  auto store = connect_store(silent.port());  // requests bounded by 5 s
  CHECK(store->request_timeout() == 5s);
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(store->try_get("k", start + 200ms), TimeoutError);
  CHECK(seconds_since(start) >= 0.19);
  CHECK(seconds_since(start) < 2.5);  // well short of the 5 s request timeout
  // Its request went out unanswered, so the connection is closed and the
  // next request's new one goes unanswered too.
  CHECK_THROWS_WITH(store->set("k", std::string("v"), std::chrono::steady_clock::now() + 200ms),
                    Contains("a new connection to it went unanswered"));
}

// Communicators split from one parent share its connection: a thread
// waiting for a key that only another thread's request leads to (through
// a peer) held it for the whole wait, so the two waited for each other.
TEST_CASE("store: a thread waiting for a key lets other threads' requests through in turn", "[store]") {
  StoreServer server("127.0.0.1", 0, kToken);
  std::shared_ptr<runtime::Store> store = connect_store(server.port());
  std::string got;
  TestThread waiter([&] { got = store->get_string("answer", 30s); });
  TestThread waiter2([&] { store->wait({"answer", "other"}, 30s); });
  std::this_thread::sleep_for(50ms);  // both wait now
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    store->set("question" + std::to_string(i), std::string("?"));
    CHECK(seconds_since(start) < 4.5);  // at most a slice (2 s at most) behind each waiter, not their 30 s
    CHECK(store->add("count", 1) == i + 1);
  }
  store->set("other", std::string("o"));
  store->set("answer", std::string("42"));
  waiter.join();
  waiter2.join();
  CHECK(got == "42");
}

TEST_CASE("store failures: a bounded request gives up behind another thread's and leaves the connection usable",
          "[store][failure]") {
  StoreServer server("127.0.0.1", 0, kToken);
  std::shared_ptr<runtime::Store> store = connect_store(server.port());
  std::string got;
  // Holds the connection until "late" is set, one slice of its wait (200
  // ms) at a time, as a heartbeat to a stopped store would until its timeout.
  TestThread waiter([&] { got = store->get_string("late", 20s); });
  bool gave_up = false;
  double waited = 0;
  for (int attempt = 0; attempt < 100 && !gave_up; ++attempt) {
    std::this_thread::sleep_for(20ms);  // until the waiter holds the connection
    auto start = std::chrono::steady_clock::now();
    try {
      store->try_get("late", start + 50ms);
    } catch (const TimeoutError& e) {
      gave_up = true;
      waited = seconds_since(start);
      CHECK_THAT(e.what(), Contains("earlier request"));
    }
  }
  connect_store(server.port())->set("late", std::string("here"));
  waiter.join();
  REQUIRE(gave_up);
  CHECK(waited >= 0.045);
  CHECK(waited < 2.5);
  CHECK(got == "here");
  const auto soon = std::chrono::steady_clock::now() + 2s;
  CHECK(store->try_get("late", soon) == Bytes{'h', 'e', 'r', 'e'});
  store->set("bounded", std::string("yes"), soon);
  CHECK(store->get_string("bounded", 1s) == "yes");
}

namespace {

// A store served by a child process, which the test can stop (SIGSTOP) as
// a starved or frozen rank 0 would be; killed when the test ends.
class StoreInChild {
 public:
  explicit StoreInChild(std::uint16_t port = 0) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_ = ::fork();  // before any thread of this process's own server
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(fds[0]);
      try {
        StoreServer server("127.0.0.1", port, kToken);
        const std::uint16_t bound = server.port();
        if (::write(fds[1], &bound, sizeof bound) == sizeof bound) std::this_thread::sleep_for(60s);
      } catch (...) {
      }
      ::_exit(0);
    }
    ::close(fds[1]);
    pollfd readable{fds[0], POLLIN, 0};
    const bool got = ::poll(&readable, 1, 10'000) == 1 && ::read(fds[0], &port_, sizeof port_) == sizeof port_;
    ::close(fds[0]);
    REQUIRE(got);
  }
  ~StoreInChild() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  std::uint16_t port() const { return port_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  // SIGSTOP, returning once the child is stopped (a request sent before
  // could otherwise still be answered).
  void stop() const {
    ::kill(pid_, SIGSTOP);
    int status = 0;
    ::waitpid(pid_, &status, WUNTRACED);
  }

 private:
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
};

}  // namespace

// A get asks in slices, each answer due a second after its slice: one the
// store answered later (its thread starved of CPU, under load) broke the
// connection for good, and the caller's wait, minutes from its end, failed
// as "unusable after an earlier failure" (seen in the torch tests).
TEST_CASE("store failures: a get whose slice the store answers late goes on and gets the key", "[store][failure]") {
  StoreInChild child;
  auto store = connect_store(child.port());
  std::string got;
  TestThread waiter([&] { got = store->get_string("late", 20s); });
  std::this_thread::sleep_for(300ms);
  child.signal(SIGSTOP);
  std::this_thread::sleep_for(3500ms);  // past any slice (2 s at most) and its margin
  child.signal(SIGCONT);
  connect_store(child.port())->set("late", std::string("here"));
  waiter.join();
  CHECK(got == "here");
  // The connection serves on.
  store->set("after", std::string("yes"));
  CHECK(store->get_string("after", 1s) == "yes");
}

// Where the store answers nothing for the whole wait, the wait ends at its
// own time and says the store did not answer (not that the key is missing).
TEST_CASE("store failures: a get the store never answers ends at its timeout, saying so", "[store][failure]") {
  StoreInChild child;
  auto store = connect_store(child.port());
  child.signal(SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(store->get("never", 2s), Contains("did not answer within 2000 ms while waiting for key 'never'") &&
                                                 Contains("stopped, or starved of CPU"));
  CHECK(seconds_since(start) >= 1.9);
  CHECK(seconds_since(start) < 4.5);
  // A bounded request meanwhile gives up at its deadline, sending nothing,
  // and leaves the connection to be opened again.
  CHECK_THROWS_AS(store->set("k", std::string("v"), std::chrono::steady_clock::now() + 300ms), TimeoutError);
  child.signal(SIGCONT);
  store->set("k", std::string("v"));
  CHECK(store->get_string("k", 1s) == "v");
}

// Any other request the store left unanswered broke the connection for
// good, so a split's bounded clean-up (comm/setup.cc: forget_store_keys)
// meeting a store starved of CPU for two seconds broke its parent's
// connection, which it shares: every later request of the parent failed
// as "unusable after an earlier failure". The connection is closed and the
// next request opens another.
TEST_CASE("store failures: a bounded request the store answers too late leaves the next one a new connection",
          "[store][failure]") {
  StoreInChild child;
  auto store = connect_store(child.port());
  store->set("before", std::string("b"));
  child.stop();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(store->add("count", 1, start + 300ms), Contains("did not answer within"));
  CHECK(seconds_since(start) < 2.5);
  child.signal(SIGCONT);
  store->set("after", std::string("a"));
  CHECK(store->get_string("after", 1s) == "a");
  CHECK(store->get_string("before", 1s) == "b");
}

// The next request after an unanswered one opens a new connection: one
// that reached a store started on that port since (the launcher serving it
// started again, with the same job token) carried on against a store
// holding none of the job's keys, and counters started again from zero.
TEST_CASE("store failures: a reconnect that reaches a store restarted on the same port fails naming it",
          "[store][failure]") {
  auto first = std::make_unique<StoreInChild>();
  const std::uint16_t port = first->port();
  auto store = connect_store(port);
  CHECK(store->add("count", 1) == 1);
  first->stop();
  CHECK_THROWS_WITH(store->add("count", 1, std::chrono::steady_clock::now() + 300ms),
                    Contains("did not answer within"));
  first.reset();
  StoreInChild second(port);
  REQUIRE(second.port() == port);
  CHECK_THROWS_WITH(store->add("count", 1), Contains("restarted since") && Contains("holds none of the keys"));
  CHECK_THROWS_WITH(store->get_string("count", 1s), Contains("unusable after an earlier failure"));
}
