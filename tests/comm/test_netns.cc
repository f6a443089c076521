// Two test hosts of two ranks each, in network namespaces this test creates
// (ip netns + a veth pair): shared memory inside each "host", real TCP over
// the veth between them. Skipped, with the reason printed, where namespaces
// are not permitted (not root, no CAP_NET_ADMIN).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/comm/harness.h"
#include "tools/bench/verify.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;

namespace {

int run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); }

// Two namespaces joined by a veth pair, 10.213.<n>.1 and .2; removed on destruction.
struct TwoHosts {
  std::string a, b;
  bool ok = false;
  std::string why;

  TwoHosts() {
    std::string tag = std::to_string(getpid() % 100000);
    a = "braidA" + tag;
    b = "braidB" + tag;
    std::string va = "bva" + tag, vb = "bvb" + tag;
    const std::vector<std::string> steps = {
        "ip netns add " + a,
        "ip netns add " + b,
        "ip link add " + va + " type veth peer name " + vb,
        "ip link set " + va + " netns " + a,
        "ip link set " + vb + " netns " + b,
        "ip -n " + a + " addr add 10.213.7.1/24 dev " + va,
        "ip -n " + b + " addr add 10.213.7.2/24 dev " + vb,
        "ip -n " + a + " link set " + va + " up",
        "ip -n " + b + " link set " + vb + " up",
        "ip -n " + a + " link set lo up",
        "ip -n " + b + " link set lo up",
    };
    for (const auto& step : steps)
      if (run(step) != 0) {
        why = "'" + step + "' failed (network namespaces need root or CAP_NET_ADMIN)";
        return;
      }
    ok = true;
  }
  ~TwoHosts() {
    run("ip netns del " + a);  // deleting a namespace removes its veth end and the pair
    run("ip netns del " + b);
  }
};

void enter(const std::string& ns) {
  int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) throw std::runtime_error("cannot enter namespace " + ns);
  close(fd);
}

}  // namespace

TEST_CASE("two hosts of two ranks in network namespaces: shm inside, TCP across", "[collectives][netns]") {
  TwoHosts hosts;
  if (!hosts.ok) {
    WARN("skipped: " << hosts.why);
    return;
  }
  test::RunOptions options = test::run_options(std::chrono::seconds(120), test::test_config());
  options.host_of = [](int rank) { return rank < 2 ? "hostA" : "hostB"; };
  options.enter_rank = [&](int rank) {
    enter(rank < 2 ? hosts.a : hosts.b);
    return std::string(rank < 2 ? "10.213.7.1" : "10.213.7.2");
  };
  options.store_host = "10.213.7.1";
  options.store_netns = open(("/var/run/netns/" + hosts.a).c_str(), O_RDONLY);
  REQUIRE(options.store_netns >= 0);
  auto result = test::run_ranks(4, [](Communicator& comm) {
    expect(comm.transport_summary() == "shm+tcp", "expected shm+tcp, got " + comm.transport_summary());
    const int n = comm.size(), r = comm.rank();
    for (DataType dtype : {DataType::f32, DataType::bf16, DataType::i64})
      for (std::size_t count : {std::size_t{1}, std::size_t{1009}, std::size_t{300007}}) {
        std::vector<std::byte> buf(count * dtype_bytes(dtype));
        verify::fill_input(buf.data(), count, 0, r, n, dtype, ReduceOp::sum);
        comm.all_reduce(buf.data(), buf.data(), count, dtype, ReduceOp::sum).wait();
        verify::ExpectedTable table(n, dtype, ReduceOp::sum);
        for (std::size_t i = 0; i < count; ++i)
          expect(std::memcmp(buf.data() + i * dtype_bytes(dtype), table.reduction(i), dtype_bytes(dtype)) == 0,
                 "wrong all_reduce element " + std::to_string(i));
        std::vector<std::byte> gathered(count * n * dtype_bytes(dtype));
        comm.all_gather(buf.data(), gathered.data(), count, dtype).wait();
      }
    comm.barrier().wait();
  }, options);
  close(options.store_netns);
  INFO(result.summary());
  REQUIRE(result.all_ok());
  CHECK(result.leftover_shm == 0);
}
