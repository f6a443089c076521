// The store under abuse (issue 13, "fault-and-abuse suite"): floods of idle
// connections, connections that never finish their handshake, and a client
// with the token that tries to fill the server's memory. Each case checks
// that the abuse is refused with a reason (in the log, or to the client) and
// that a real client still gets served. Every wait is bounded; children are
// killed and reaped by their guards.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/store.h"
#include "tests/runtime/store_test_util.h"

using namespace braid;
using namespace braid::test;
using Catch::Matchers::Contains;
using runtime::StoreLimits;
using runtime::StoreServer;

namespace {

std::size_t count_of(const std::string& text, const std::string& word) {
  std::size_t count = 0;
  for (auto at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++count;
  return count;
}

// Routes spdlog's default logger into a string for the scope of a test.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_, true);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string text() {
    spdlog::default_logger()->flush();
    return text_.str();
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream text_;
};

// Blocks until fd is readable or the limit passes; false on the limit.
bool readable_within(int fd, std::chrono::milliseconds limit) {
  pollfd pfd{fd, POLLIN, 0};
  return ::poll(&pfd, 1, static_cast<int>(limit.count())) == 1;
}

// A store server in a child process whose RLIMIT_NOFILE (soft and hard) is
// `nofile`, so that a flood exhausts its descriptors and not the test's. The
// child's log goes to a file; the guard kills and reaps it.
class ServerChild {
 public:
  ServerChild(rlim_t nofile, std::optional<std::size_t> max_pending) {
    char path[] = "/tmp/braid-store-abuse-XXXXXX";
    int log_fd = ::mkstemp(path);
    REQUIRE(log_fd >= 0);
    log_path_ = path;
    int port_pipe[2];
    REQUIRE(::pipe2(port_pipe, O_CLOEXEC) == 0);
    pid_ = ::fork();
    if (pid_ == 0) serve(port_pipe[1], log_fd, nofile, max_pending);
    REQUIRE(pid_ > 0);
    ::close(port_pipe[1]);
    ::close(log_fd);
    bool answered = readable_within(port_pipe[0], 10s) &&
                    ::read(port_pipe[0], &port_, sizeof port_) == static_cast<ssize_t>(sizeof port_);
    ::close(port_pipe[0]);
    REQUIRE(answered);
  }
  ~ServerChild() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    std::filesystem::remove(log_path_);
  }
  ServerChild(const ServerChild&) = delete;
  ServerChild& operator=(const ServerChild&) = delete;

  std::uint16_t port() const { return port_; }
  std::string log() const {
    std::ifstream in(log_path_);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  [[noreturn]] static void serve(int port_fd, int log_fd, rlim_t nofile,
                                 std::optional<std::size_t> max_pending) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    rlimit limit{nofile, nofile};
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(3);
    try {
      spdlog::flush_on(spdlog::level::warn);
      StoreLimits limits = runtime::store_limits(runtime::config());
      if (max_pending) limits.max_pending_handshakes = *max_pending;
      StoreServer server("127.0.0.1", 0, kToken, limits);
      std::uint16_t port = server.port();
      if (::write(port_fd, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) ::_exit(4);
      for (;;) ::pause();  // until the test kills us
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server child failed: %s\n", e.what());
      ::_exit(5);
    }
  }

  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
  std::string log_path_;
};

// The message of the InvalidUsage that fn throws.
template <class Fn>
std::string usage_error(Fn fn) {
  try {
    fn();
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "(no InvalidUsage was thrown)";
}

void check_serves(std::uint16_t port, const std::string& key) {
  auto store = connect_store(port, kToken, 10s);
  store->set(key, std::string("served"));
  CHECK(store->get_string(key, 5s) == "served");
  CHECK(store->add(key + "/count", 3) == 3);
}

void check_still_serving(const StoreServer& server) { check_serves(server.port(), "still-serving"); }

}  // namespace

TEST_CASE("store abuse: a flood of idle connections does not keep a real client out", "[abuse][store]") {
  constexpr int kFlood = 2000;
  SECTION("the pending cap follows the file-descriptor limit") {
    ServerChild server(256, std::nullopt);  // a cap of 256 / 4 = 64 pending handshakes
    Flood flood(server.port(), kFlood);
    check_serves(server.port(), "after-flood");
    // All but at most the cap's worth of idle connections were dropped.
    CHECK(flood.wait_closed(kFlood - 64 - 1, 10s) >= kFlood - 64 - 1);
    std::string log = server.log();
    INFO(log);
    CHECK_THAT(log, Contains("unauthenticated connection") && Contains("past the cap of 64"));
    CHECK(count_of(log, "dropped") <= 3);  // summed up, not a line per connection
  }
  SECTION("a cap above what the descriptors allow: running out of them drops the oldest") {
    ServerChild server(64, 100'000);
    Flood flood(server.port(), kFlood);
    check_serves(server.port(), "after-flood");
    std::string log = server.log();
    INFO(log);
    CHECK_THAT(log, Contains("for lack of file descriptors"));
    CHECK(count_of(log, "dropped") <= 3);
  }
}

TEST_CASE("store abuse: past the cap the oldest pending connection is dropped", "[abuse][store]") {
  LogCapture capture;
  StoreLimits limits;
  limits.max_pending_handshakes = 1;
  StoreServer server("127.0.0.1", 0, kToken, limits);
  RawClient first(server.port());
  std::this_thread::sleep_for(50ms);  // accepted before the second
  RawClient second(server.port());
  CHECK(first.closed_by_peer(5s));
  check_still_serving(server);  // drops `second` to make room
  CHECK(second.closed_by_peer(5s));
  CHECK_THAT(capture.text(), Contains("past the cap of 1 connections waiting for a handshake"));
}

TEST_CASE("store abuse: a client that never completes its handshake is dropped at the deadline",
          "[abuse][store]") {
  auto [what, sent] = GENERATE(table<std::string, Bytes>({
      {"nothing", Bytes{}},
      {"half a header", Bytes{'B', 'R', 'D', 'S', 1, 0}},
      {"a header promising a token",
       cat({Bytes{'B', 'R', 'D', 'S'}, le32_bytes(runtime::kStoreProtocolVersion), le32_bytes(100)})},
  }));
  INFO("the client sends " << what);
  LogCapture capture;
  StoreLimits limits;
  limits.handshake_timeout = 300ms;
  StoreServer server("127.0.0.1", 0, kToken, limits);
  RawClient raw(server.port());
  auto start = std::chrono::steady_clock::now();
  REQUIRE(raw.send(sent));
  CHECK(raw.closed_by_peer(5s));
  CHECK(seconds_since(start) >= 0.25);
  CHECK_THAT(capture.text(), Contains("without a complete handshake within 300 ms"));
  check_still_serving(server);
}

TEST_CASE("store abuse: the store's memory is bounded and past it the client gets a named error",
          "[abuse][store]") {
  StoreLimits limits;
  limits.max_bytes = 1u << 20;
  StoreServer server("127.0.0.1", 0, kToken, limits);
  auto store = connect_store(server.port());
  Bytes value(300u << 10, 7);

  SECTION("values fill it; then a set is refused, and freeing room lets it through") {
    for (const char* key : {"a", "b", "c"}) store->set(key, value);
    CHECK_THAT(usage_error([&] { store->set("d", value); }),
               Contains("'d'") && Contains("BRAID_STORE_MAX_BYTES") && Contains("1048576"));
    CHECK(store->get("a", 1s) == value);  // the same connection still works
    check_still_serving(server);
    CHECK(store->remove("a"));
    store->set("d", value);
    CHECK(store->get("d", 1s) == value);
  }
  SECTION("a value larger than the whole limit is read, refused and the connection kept") {
    CHECK_THAT(usage_error([&] { store->set("huge", Bytes(2u << 20, 1)); }),
               Contains("BRAID_STORE_MAX_BYTES") && Contains("1048576"));
    store->set("small", std::string("fine"));
    CHECK(store->get_string("small", 1s) == "fine");
  }
  SECTION("many small keys are bounded too (each key costs its overhead)") {
    int stored = 0;
    CHECK_THROWS_WITH(
        [&] {
          for (; stored < 100'000; ++stored)
            store->set("key/" + std::to_string(stored), std::string(100, 'x'));
        }(),
        Contains("BRAID_STORE_MAX_BYTES"));
    CHECK(stored < static_cast<int>((1u << 20) / (100 + runtime::kStoreEntryOverheadBytes)));
    for (int i = 0; i < 10; ++i) CHECK(store->remove("key/" + std::to_string(i)));
    check_still_serving(server);
  }
  SECTION("a wait's keys claim the request budget: a list too long for it is refused, not built") {
    // 20000 keys: about 200 KiB on the wire, but 20000 x 64 bytes claimed.
    std::vector<std::string> many;
    for (int i = 0; i < 20'000; ++i) many.push_back("wait/" + std::to_string(i));
    CHECK_THAT(usage_error([&] { store->wait(many, 1s); }),
               Contains("20000 keys") && Contains("BRAID_STORE_MAX_BYTES") && Contains("1048576"));
    std::vector<std::string> some(many.begin(), many.begin() + 1000);
    for (const std::string& key : some) store->set(key, std::string("v"));
    store->wait(some, 1s);  // within the budget, and the claim of the refused one was returned
    check_still_serving(server);
  }
}

TEST_CASE("store abuse: with the default limit, large values are refused by name", "[abuse][store]") {
  StoreServer server("127.0.0.1", 0, kToken, StoreLimits{});  // 64 MiB, as BRAID_STORE_MAX_BYTES's default
  auto store = connect_store(server.port(), kToken, 30s);
  Bytes value(40u << 20, 3);
  store->set("first", value);
  CHECK_THROWS_WITH(store->set("second", value), Contains("BRAID_STORE_MAX_BYTES"));
  CHECK(store->get("first", 10s).size() == value.size());
}

// A request past the size any request may have (64 MiB) was answered
// "bad request" and the connection closed for good, whatever
// BRAID_STORE_MAX_BYTES: every later call on it failed. It is refused
// before anything is sent, and the connection goes on (found by a review
// helper).
TEST_CASE("store abuse: a request larger than any may be is refused, and the connection goes on", "[abuse][store]") {
  StoreLimits limits;
  limits.max_bytes = 256u << 20;
  StoreServer server("127.0.0.1", 0, kToken, limits);
  auto store = connect_store(server.port(), kToken, 30s);
  const Bytes huge(65u << 20, 1);
  CHECK_THROWS_AS(store->set("huge", huge), InvalidUsage);
  CHECK_THROWS_WITH(store->set("huge", huge), Contains("is larger than any request may be"));
  store->set("small", std::string("v"));
  CHECK(store->get("small", 10s).size() == 1);
}

// A program that speaks something else to the store's port in a loop (an
// HTTP client, a port scanner) was logged a line per connection: 21,579
// lines in 6 s, and a launcher whose stderr nobody read kept them all.
TEST_CASE("store abuse: a stream of refused handshakes costs a line, not a line each", "[abuse][store]") {
  LogCapture capture;
  StoreServer server("127.0.0.1", 0, kToken, StoreLimits{});
  const Bytes http{'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1', '.', '1', '\r', '\n', '\r', '\n'};
  for (int i = 0; i < 200; ++i) {
    RawClient stranger(server.port());
    REQUIRE(stranger.send(http));
    CHECK(stranger.closed_by_peer(5s));
  }
  check_still_serving(server);
  const std::string log = capture.text();
  INFO(log);
  CHECK_THAT(log, Contains("store refused connection from 127.0.0.1") && Contains("(bad magic)"));
  CHECK(count_of(log, "refused") == 1);  // the rest are summed up 5 s later
}
