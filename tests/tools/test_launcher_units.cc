// Unit tests of the launcher's pure parts; test_launch.cc runs the binary.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "tools/launcher/environment.h"
#include "tools/launcher/launcher.h"
#include "tools/launcher/output.h"
#include "tools/launcher/process.h"

using namespace braid::launcher;

namespace {

// Feeds the relay's output through a pipe and returns what came out. The
// pipe is made large enough to hold it all, as one thread writes and reads.
std::string relayed(const std::vector<std::string>& pieces) {
  Pipe pipe = make_pipe();
  REQUIRE(fcntl(pipe.write_end.get(), F_SETPIPE_SZ, 1 << 20) >= (1 << 20));
  {
    LineRelay relay("[rank 7] ", pipe.write_end.get());
    for (const std::string& piece : pieces) relay.feed(piece);
    relay.finish();
  }
  pipe.write_end.reset();
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe.read_end.get(), buffer, sizeof buffer)) > 0;)
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
  // Text without a newline is written out once it passes the limit.
  std::string half(LineRelay::kMaxLineBytes / 2 + 1, 'x');
  std::string out = relayed({half, half, "y\n"});
  bool cut_at_limit = out == "[rank 7] " + half + half + "\n[rank 7] y\n";
  CHECK(cut_at_limit);
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
  auto bound = store_endpoints(options_with("127.0.0.1"), "10.1.2.3");
  CHECK(bound.listen_addr == "10.1.2.3");
  CHECK(bound.advertised_addr == "10.1.2.3");
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
