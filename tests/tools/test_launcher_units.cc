// Unit tests of the launcher's pure parts; test_launch.cc runs the binary.
#include <fcntl.h>
#include <sys/mman.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <termios.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <optional>
#include <string>
#include <thread>

#include "tools/launcher/environment.h"
#include "tools/launcher/launcher.h"
#include "tools/launcher/output.h"
#include "tools/launcher/process.h"
#include "tools/launcher/supervisor.h"

using namespace braid::launcher;
using namespace std::chrono_literals;

namespace {

// A write that blocks would hang the test: past the limit SIGALRM ends the
// whole test binary instead, which fails it.
class BlockingGuard {
 public:
  explicit BlockingGuard(unsigned seconds) { alarm(seconds); }
  ~BlockingGuard() { alarm(0); }
};

// SIGPIPE ignored for the scope, as braid-launch ignores it.
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &old_);
  }
  ~IgnoreSigpipe() { sigaction(SIGPIPE, &old_, nullptr); }

 private:
  struct sigaction old_ {};
};

std::string read_available(int fd) {
  std::string out;
  char buffer[65536];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) out.append(buffer, static_cast<std::size_t>(n));
  return out;
}

// Feeds the relay's output into a file in memory and returns what came
// out: a pipe held 1 MiB at most (F_SETPIPE_SZ past that needs
// CAP_SYS_RESOURCE), less than two pieces of half the line limit.
std::string relayed(const std::vector<std::string>& pieces) {
  braid::launcher::UniqueFd file(::memfd_create("relayed", MFD_CLOEXEC));
  REQUIRE(file.valid());
  {
    OutputSink sink(file.get());
    LineRelay relay("[rank 7] ", sink);
    for (const std::string& piece : pieces) relay.feed(piece);
    relay.finish();
    CHECK_FALSE(sink.has_pending());
  }
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::pread(file.get(), buffer, sizeof buffer, static_cast<off_t>(out.size()))) > 0;)
    out.append(buffer, static_cast<std::size_t>(n));
  return out;
}

LaunchOptions options_with(const std::string& master_addr, int nnodes = 1) {
  LaunchOptions options;
  options.master_addr = master_addr;
  options.nnodes = nnodes;
  options.master_port = nnodes > 1 ? 29517 : 0;
  options.command = {"true"};
  return options;
}

}  // namespace

TEST_CASE("LineRelay prefixes whole lines however the bytes arrive", "[launcher]") {
  CHECK(relayed({"a\nb", "c\n", "\n", "tail"}) == "[rank 7] a\n[rank 7] bc\n[rank 7] \n[rank 7] tail\n");
  CHECK(relayed({}).empty());
  // Text without a newline is written out once it passes the limit, and
  // the line goes on without a second prefix.
  std::string half(LineRelay::kMaxLineBytes / 2 + 1, 'x');
  std::string out = relayed({half, half, "y\n"});
  bool cut_at_limit = out == "[rank 7] " + half + half + "y\n";
  CHECK(cut_at_limit);
  // "\r\n" ends a line (its '\r' kept), also split across reads; a lone
  // '\r' ends a piece, and the next is prefixed again (a progress bar).
  CHECK(relayed({"dos\r\n", "split\r", "\nnext\n"}) == "[rank 7] dos\r\n[rank 7] split\r\n[rank 7] next\n");
  CHECK(relayed({"\r10%", "\r20%\r", "30%\n"}) == "[rank 7] 10%\r[rank 7] 20%\r[rank 7] 30%\n");
}

// Two relays (a rank's stdout and another rank's) on one sink, read back
// through a pipe; flush_partial is called as the supervisor would at the
// relay's deadline.
struct SharedSink {
  Pipe pipe = make_pipe();
  std::optional<OutputSink> sink;
  SharedSink() {
    REQUIRE(fcntl(pipe.read_end.get(), F_SETFL, O_NONBLOCK) == 0);
    sink.emplace(pipe.write_end.get());
  }
  std::string take() { return read_available(pipe.read_end.get()); }
};

TEST_CASE("LineRelay writes an unfinished line once it waited, and keeps lines apart", "[launcher]") {
  SharedSink shared;
  LineRelay a("[rank 0] ", *shared.sink);
  LineRelay b("[rank 1] ", *shared.sink);
  const auto start = Clock::now();
  a.feed("name? ", start);
  CHECK(shared.take().empty());
  REQUIRE(a.partial_deadline() == start + LineRelay::kPartialLineWait);
  a.flush_partial();
  CHECK_FALSE(a.partial_deadline());
  CHECK(shared.take() == "[rank 0] name? ");
  // Its rest follows on the same line.
  a.feed("bob\n");
  CHECK(shared.take() == "bob\n");
  // Another writer's line comes between: it starts a line of its own, and
  // the first rank's rest is prefixed again.
  a.feed("step 1 ");
  a.flush_partial();
  b.feed("hello\n");
  a.feed("done\n");
  CHECK(shared.take() == "[rank 0] step 1 \n[rank 1] hello\n[rank 0] done\n");
  // A bare newline after such a break adds no empty line; the launcher's
  // own message also starts on a line of its own.
  a.feed("progress");
  a.flush_partial();
  shared.sink->write("braid-launch: note\n");
  a.feed("\n");
  CHECK(shared.take() == "[rank 0] progress\nbraid-launch: note\n");
  // A progress bar: each '\r' ends a piece at once; finish ends the line.
  b.feed("\r 10%");
  b.flush_partial();
  b.feed("\r 20%");
  b.finish();
  CHECK(shared.take() == "[rank 1]  10%\r[rank 1]  20%\n");
  // A flush never ends inside a UTF-8 character: its start waits for the
  // rest, or for the stream's end, with no deadline meanwhile.
  a.feed("caf\xC3");
  a.flush_partial();
  CHECK(shared.take() == "[rank 0] caf");
  CHECK_FALSE(a.partial_deadline());
  a.feed("\xA9!\n");
  CHECK(shared.take() == "\xC3\xA9!\n");
  a.feed("\xE2\x82");
  a.flush_partial();
  CHECK(shared.take().empty());
  CHECK_FALSE(a.partial_deadline());
  a.finish();
  CHECK(shared.take() == "[rank 0] \xE2\x82\n");
}

TEST_CASE("an unfinished line waits 100 ms after its last byte, 1 s after its first at most", "[launcher]") {
  SharedSink shared;
  LineRelay relay("[rank 0] ", *shared.sink);
  const auto start = Clock::now();
  relay.feed("a", start);
  relay.feed("b", start + 80ms);
  CHECK(relay.partial_deadline() == start + 180ms);
  for (int i = 2; i < 20; ++i) relay.feed(".", start + i * 80ms);
  CHECK(relay.partial_deadline() == start + LineRelay::kLongestPartialWait);
  // A '\r' flushed at the start of a line, then its '\n': a blank line, kept.
  relay.flush_partial();
  relay.feed("\n");
  CHECK(shared.take() == "[rank 0] ab" + std::string(18, '.') + "\n");
  relay.feed("\r");
  relay.flush_partial();
  relay.feed("\n");
  CHECK(shared.take() == "[rank 0] \n");
}

TEST_CASE("a terminal's echo of a typed line ends the open line", "[launcher]") {
  // A pipe saw no echo: the rank's rest goes on the same line.
  SharedSink shared;
  LineRelay piped("[rank 0] ", *shared.sink);
  piped.feed("name? ");
  piped.flush_partial();
  shared.sink->terminal_line_ended();
  piped.feed("hello\n");
  CHECK(shared.take() == "[rank 0] name? hello\n");
  // On a terminal the echo moved the cursor to a new line.
  UniqueFd master(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  REQUIRE(master.valid());
  REQUIRE(grantpt(master.get()) == 0);
  REQUIRE(unlockpt(master.get()) == 0);
  UniqueFd terminal(::open(ptsname(master.get()), O_RDWR | O_NOCTTY | O_CLOEXEC));
  REQUIRE(terminal.valid());
  termios raw{};
  REQUIRE(tcgetattr(terminal.get(), &raw) == 0);
  cfmakeraw(&raw);
  REQUIRE(tcsetattr(terminal.get(), TCSANOW, &raw) == 0);
  REQUIRE(fcntl(master.get(), F_SETFL, O_NONBLOCK) == 0);
  OutputSink sink(terminal.get());
  LineRelay relay("[rank 0] ", sink);
  relay.feed("name? ");
  relay.flush_partial();
  sink.terminal_line_ended();
  relay.feed("hello\n");
  std::string shown;
  for (int i = 0; i < 200 && shown.find('\n') == std::string::npos; ++i) {
    shown += read_available(master.get());
    std::this_thread::sleep_for(10ms);
  }
  CHECK(shown == "[rank 0] name? [rank 0] hello\n");
}

TEST_CASE("store endpoints follow --master-addr and BRAID_BIND_ADDR", "[launcher]") {
  auto plain = store_endpoints(options_with("127.0.0.1"), "127.0.0.1");
  CHECK(plain.listen_addr == "127.0.0.1");
  CHECK(plain.advertised_addr == "127.0.0.1");
  auto remote = store_endpoints(options_with("10.1.2.3", 2), "127.0.0.1");
  CHECK(remote.listen_addr == "10.1.2.3");
  CHECK(remote.advertised_addr == "10.1.2.3");
  auto wildcard = store_endpoints(options_with("127.0.0.1"), "0.0.0.0");
  CHECK(wildcard.listen_addr == "0.0.0.0");
  CHECK(wildcard.advertised_addr == "127.0.0.1");
  // 0.0.0.0 is IPv4 only: the store listened there while the ranks, told an
  // IPv6 --master-addr, failed after BRAID_TIMEOUT with "nothing listens".
  for (const char* v6 : {"::1", "fd38::1"}) {
    auto wide = store_endpoints(options_with(v6, 2), "0.0.0.0");
    CHECK(wide.listen_addr == "::");
    CHECK(wide.advertised_addr == v6);
  }
  CHECK(store_endpoints(options_with("::1"), "::").listen_addr == "::");
  CHECK(store_endpoints(options_with("10.1.2.3", 2), "0.0.0.0").listen_addr == "0.0.0.0");
  auto bound = store_endpoints(options_with("127.0.0.1"), "10.1.2.3");
  CHECK(bound.listen_addr == "10.1.2.3");
  CHECK(bound.advertised_addr == "10.1.2.3");
  // Another loopback address: the store listened on 127.0.0.1 while the
  // ranks were told 127.0.0.2 (or ::1), and none reached it.
  for (const char* other : {"127.0.0.2", "::1"}) {
    auto loopback = store_endpoints(options_with(other), "127.0.0.1");
    CHECK(loopback.listen_addr == other);
    CHECK(loopback.advertised_addr == other);
  }
  auto named = store_endpoints(options_with("localhost"), "127.0.0.1");
  CHECK(named.listen_addr == "127.0.0.1");
  CHECK(named.advertised_addr == "localhost");
}

TEST_CASE("tokens: random ones differ", "[launcher]") {
  CHECK(random_token().size() == 32);
  CHECK(random_token() != random_token());
}

TEST_CASE("exit statuses read as a shell reports them", "[launcher]") {
  ExitStatus exited{false, 3, 0};
  CHECK(describe(exited) == "exited with status 3");
  CHECK(exited.shell_status() == 3);
  ExitStatus killed{true, 0, SIGKILL};
  CHECK(describe(killed) == "was killed by signal 9 (SIGKILL)");
  CHECK(killed.shell_status() == 137);
  CHECK(ExitStatus{}.success());
}

TEST_CASE("validate names the bad option", "[launcher]") {
  LaunchOptions options = options_with("127.0.0.1");
  CHECK_NOTHROW(validate(options));
  options.node_rank = 1;
  CHECK_THROWS_WITH(validate(options), Catch::Contains("--node-rank"));
  options = options_with("127.0.0.1", 2);
  options.master_port = 0;
  CHECK_THROWS_WITH(validate(options), Catch::Contains("--master-port"));
  options = options_with("127.0.0.1");
  options.command.clear();
  CHECK_THROWS_WITH(validate(options), Catch::Contains("no program"));
}

// Reads the pipe and flushes the sink whenever the pipe has room, until
// the sink has nothing pending; what was read.
std::string drain(OutputSink& sink, int read_end) {
  std::string got;
  while (sink.has_pending()) {
    got += read_available(read_end);
    pollfd ready{sink.poll_fd(), POLLOUT, 0};
    REQUIRE(::poll(&ready, 1, 1000) == 1);
    sink.flush();
  }
  return got + read_available(read_end);
}

TEST_CASE("OutputSink never blocks on a pipe nobody reads, and loses nothing once it is read", "[launcher]") {
  BlockingGuard guard(20);
  Pipe pipe = make_pipe();
  REQUIRE(fcntl(pipe.read_end.get(), F_SETFL, O_NONBLOCK) == 0);
  OutputSink sink(pipe.write_end.get());
  // Lines of many sizes, now and then one longer than the pipe holds.
  std::string expected;
  for (int i = 0; expected.size() < 3 * OutputSink::kMaxPendingBytes; ++i) {
    std::string line = std::to_string(i) + std::string(static_cast<std::size_t>(i % 97), 'x') + "\n";
    if (i % 5000 == 4999) line = std::string(100000, 'L') + "\n";
    expected += line;
    sink.write(line);
  }
  CHECK(sink.full());
  CHECK(sink.pending_bytes() > expected.size() - (1u << 20));  // the pipe took at most its capacity
  // The reader catches up: flushing whenever the pipe has room gets
  // everything through, in order.
  std::string got = drain(sink, pipe.read_end.get());
  CHECK(got.size() == expected.size());
  CHECK(got == expected);
  sink.write("more\n");
  CHECK(read_available(pipe.read_end.get()) == "more\n");
}

// The launcher's own messages have no pipe to stop reading: something that
// keeps it talking while nothing reads its stderr (a flood on its store's
// port, logged per connection) grew its memory without end. Past
// kMaxOwnPendingBytes they are dropped, and the count told once it drains.
TEST_CASE("OutputSink bounds the launcher's own messages that nobody reads, and says how many it dropped",
          "[launcher]") {
  BlockingGuard guard(20);
  Pipe pipe = make_pipe();
  REQUIRE(fcntl(pipe.read_end.get(), F_SETFL, O_NONBLOCK) == 0);
  OutputSink sink(pipe.write_end.get());
  const std::string line = "braid-launch: " + std::string(100, 'x') + "\n";
  const std::size_t lines = 2 * OutputSink::kMaxOwnPendingBytes / line.size();
  for (std::size_t i = 0; i < lines; ++i) sink.write(line);
  CHECK(sink.pending_bytes() <= OutputSink::kMaxOwnPendingBytes);
  std::string got = drain(sink, pipe.read_end.get());
  const std::size_t kept = got.rfind(line) / line.size() + 1;
  INFO(got.substr(got.rfind(line) + line.size()));
  CHECK(kept < lines);
  CHECK_THAT(got.substr(kept * line.size()), Catch::Equals("braid-launch: dropped " + std::to_string(lines - kept) +
                                                          " of its own message(s) (" +
                                                          std::to_string((lines - kept) * line.size()) +
                                                          " bytes) while this output was not read\n"));
}

// Each write(2) to a SOCK_SEQPACKET socket is one record, so the records
// read back count the writes. One read of a rank's pipe full of short
// lines went out as one write per line (2 million lines: 4 s, where sed
// takes 0.25); now in writes of up to PIPE_BUF bytes, each of whole pieces.
TEST_CASE("OutputSink writes the short lines of one read together, up to PIPE_BUF a write", "[launcher]") {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds) == 0);
  const int size = 1 << 20;
  setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  std::string text, expected;
  for (int i = 0; i < 1000; ++i) {
    text += "line " + std::to_string(i) + "\n";
    expected += "[rank 7] line " + std::to_string(i) + "\n";
  }
  {
    OutputSink sink(fds[0]);
    LineRelay relay("[rank 7] ", sink);
    relay.feed(text);
    relay.finish();
    CHECK_FALSE(sink.has_pending());
  }
  close(fds[0]);
  std::string out;
  std::size_t records = 0, largest = 0;
  char buffer[1 << 16];
  for (ssize_t n; (n = ::recv(fds[1], buffer, sizeof buffer, 0)) > 0; ++records) {
    out.append(buffer, static_cast<std::size_t>(n));
    largest = std::max(largest, static_cast<std::size_t>(n));
  }
  close(fds[1]);
  CHECK(out == expected);
  INFO(records << " writes for " << expected.size() << " bytes");
  CHECK(largest <= PIPE_BUF);
  CHECK(records <= expected.size() / (PIPE_BUF / 2) + 1);
}

TEST_CASE("OutputSink drops what it cannot write once the reader is gone", "[launcher]") {
  BlockingGuard guard(20);
  IgnoreSigpipe ignore;
  Pipe pipe = make_pipe();
  OutputSink sink(pipe.write_end.get());
  std::string chunk(60000, 'x');
  for (int i = 0; i < 40; ++i) sink.write(chunk);
  CHECK(sink.full());
  CHECK(sink.discard() > 0);
  CHECK_FALSE(sink.has_pending());
  for (int i = 0; i < 40; ++i) sink.write(chunk);
  CHECK_FALSE(sink.reader_gone());
  pipe.read_end.reset();
  sink.flush();  // EPIPE: nowhere to report it
  CHECK_FALSE(sink.has_pending());
  CHECK(sink.reader_gone());  // the supervisor closes the ranks' pipes to it
  sink.write("after\n");
  CHECK_FALSE(sink.has_pending());
}

TEST_CASE("deadlines saturate instead of overflowing, and poll timeouts stay in range", "[launcher]") {
  const Clock::time_point now = Clock::now();
  CHECK(deadline_after(now, 1500ms) == now + 1500ms);
  CHECK(deadline_after(now, Clock::duration::max()) == Clock::time_point::max());
  CHECK(deadline_after(Clock::time_point::max(), 1ms) == Clock::time_point::max());
  CHECK(poll_timeout_ms(std::nullopt, now) == -1);
  CHECK(poll_timeout_ms(now - 1s, now) == 0);
  CHECK(poll_timeout_ms(now, now) == 0);
  CHECK(poll_timeout_ms(now + 1500us, now) == 2);  // rounded up: poll must not wake early
  CHECK(poll_timeout_ms(now + 10s, now) == 10000);
  CHECK(poll_timeout_ms(now + std::chrono::hours(24 * 30), now) == INT_MAX);
  CHECK(poll_timeout_ms(deadline_after(now, kMaxDuration), now) == INT_MAX);
  CHECK(poll_timeout_ms(Clock::time_point::max(), now) == INT_MAX);
}

TEST_CASE("validate refuses durations beyond kMaxDuration", "[launcher]") {
  LaunchOptions options = options_with("127.0.0.1");
  options.timeout = kMaxDuration;
  options.grace_period = kMaxDuration;
  CHECK_NOTHROW(validate(options));
  options.timeout = std::chrono::milliseconds(kMaxDuration) + 1ms;
  CHECK_THROWS_WITH(validate(options), Catch::Contains("--timeout must be at most"));
  options.timeout = kMaxDuration;
  options.grace_period = std::chrono::milliseconds::max();
  CHECK_THROWS_WITH(validate(options), Catch::Contains("--grace-period must be at most"));
  options.grace_period = -1ms;
  CHECK_THROWS_WITH(validate(options), Catch::Contains("--grace-period must not be negative"));
}

TEST_CASE("a Supervisor that is not run to the end kills and reaps its ranks", "[launcher]") {
  BlockingGuard guard(20);
  pid_t pid = -1;
  {
    SignalCatcher signals;
    Supervisor supervisor(signals, 0ms, 5000ms);
    pid = spawn(ProcessSpec{{"sleep", "60"}, {"PATH=/usr/bin:/bin"}, 1, 2});
    REQUIRE(pid > 0);
    supervisor.add(RankProcess{0, pid, UniqueFd(), UniqueFd()});
    // As when start_and_supervise or run() throws: the destructor is all
    // that runs.
  }
  // Reaped: the pid is no longer our child.
  CHECK(waitpid(pid, nullptr, WNOHANG) < 0);
  CHECK(errno == ECHILD);
}
