// runtime/rank_info: who this process is, from each launcher's environment,
// with braid-launch > torchrun > Slurm > Open MPI precedence and
// InvalidUsage naming the variable for anything missing or malformed.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/rank_info.h"
#include "runtime/store_ports.h"
#include "tests/runtime/store_test_util.h"

using namespace braid;
using Catch::Matchers::Contains;
using runtime::rank_info_from_env;

namespace {

// Clears every variable rank_info reads, sets the given ones, and restores
// the original environment when the test ends.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const char* name : kVars) {
      const char* value = std::getenv(name);
      saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  static constexpr const char* kVars[] = {
      "BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_WORLD_SIZE", "BRAID_NODE_RANK",
      "BRAID_STORE_ADDR", "BRAID_JOB_TOKEN", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
      "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS",
      "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
      "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
      "OMPI_COMM_WORLD_NODE_RANK", "OMPI_MCA_ess_base_jobid", "BRAID_RESTART_COUNT",
      "TORCHELASTIC_RESTART_COUNT"};
  std::map<std::string, std::optional<std::string>> saved_;
};

const std::map<std::string, std::string> kBraid = {
    {"BRAID_RANK", "3"},       {"BRAID_WORLD_SIZE", "8"},  {"BRAID_LOCAL_RANK", "1"},
    {"BRAID_LOCAL_WORLD_SIZE", "2"}, {"BRAID_NODE_RANK", "1"}, {"BRAID_STORE_ADDR", "10.0.0.5:40123"},
    {"BRAID_JOB_TOKEN", "job-42"}};
const std::map<std::string, std::string> kTorchrun = {
    {"RANK", "5"},       {"WORLD_SIZE", "8"},          {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "4"},
    {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.7"},     {"MASTER_PORT", "29400"}};
const std::map<std::string, std::string> kSlurm = {
    {"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "12"}, {"SLURM_LOCALID", "2"},     {"SLURM_NTASKS_PER_NODE", "4"},
    {"SLURM_NODEID", "1"}, {"SLURM_JOB_ID", "777"}, {"MASTER_ADDR", "10.0.0.9"},   {"MASTER_PORT", "31000"}};
const std::map<std::string, std::string> kOpenMpi = {
    {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_COMM_WORLD_NODE_RANK", "0"}};  // a rank within the node

std::map<std::string, std::string> merged(std::map<std::string, std::string> a,
                                          const std::map<std::string, std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

std::map<std::string, std::string> with(std::map<std::string, std::string> vars, const std::string& name,
                                        const std::string& value) {
  vars[name] = value;
  return vars;
}

}  // namespace

TEST_CASE("rank_info: no launcher means one process serving its own store", "[rank_info]") {
  ScopedEnv env({});
  auto info = rank_info_from_env();
  CHECK(info.launcher == "none");
  CHECK(info.rank == 0);
  CHECK(info.world_size == 1);
  CHECK(info.store_port == 0);
  CHECK(info.store_served_by_rank0);
  CHECK_FALSE(info.job_token.empty());
}

TEST_CASE("rank_info: braid-launch variables", "[rank_info]") {
  ScopedEnv env(kBraid);
  auto info = rank_info_from_env();
  CHECK(info.launcher == "braid-launch");
  CHECK(info.rank == 3);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.node_rank == 1);
  CHECK(info.store_host == "10.0.0.5");
  CHECK(info.store_port == 40123);
  CHECK_FALSE(info.store_served_by_rank0);
  CHECK(info.job_token == "job-42");
  CHECK_THAT(runtime::describe(info), Contains("rank 3/8") && Contains("braid-launch") &&
                                          Contains("10.0.0.5:40123"));
}

// torchrun's agent serves its store on MASTER_PORT, and another job's
// MASTER_PORT may be the next port: braid's store starts on a port derived
// from MASTER_PORT and the token, the same for every rank of the job.
TEST_CASE("rank_info: torchrun variables, store on a port derived from MASTER_PORT", "[rank_info]") {
  ScopedEnv env(kTorchrun);
  auto info = rank_info_from_env();
  CHECK(info.launcher == "torchrun");
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 4);
  CHECK(info.node_rank == 1);
  CHECK(info.store_host == "10.0.0.7");
  CHECK(info.store_port == runtime::derived_store_port(29400, info.job_token));
  CHECK(info.store_port >= runtime::kDerivedStorePortLo);
  CHECK(info.store_port < runtime::kDerivedStorePortHi);
  CHECK(info.store_served_by_rank0);
  auto port_for = [](const std::map<std::string, std::string>& vars) {
    ScopedEnv scoped(vars);
    return rank_info_from_env().store_port;
  };
  CHECK(port_for(with(with(kTorchrun, "RANK", "0"), "LOCAL_RANK", "0")) == info.store_port);
  CHECK(port_for(with(kTorchrun, "MASTER_PORT", "29401")) != info.store_port);
  CHECK(info.local_world_known);
  auto without_local_size = kTorchrun;
  without_local_size.erase("LOCAL_WORLD_SIZE");
  without_local_size.erase("LOCAL_RANK");
  ScopedEnv bare(without_local_size);
  CHECK_FALSE(rank_info_from_env().local_world_known);  // its local world size says nothing of the hosts
}

TEST_CASE("rank_info: Slurm variables", "[rank_info]") {
  ScopedEnv env(kSlurm);
  auto info = rank_info_from_env();
  CHECK(info.launcher == "slurm");
  CHECK(info.rank == 6);
  CHECK(info.world_size == 12);
  CHECK(info.local_rank == 2);
  CHECK(info.local_world_size == 4);
  CHECK(info.node_rank == 1);
  CHECK(info.store_host == "10.0.0.9");
  CHECK(info.store_port == 31000);
}

TEST_CASE("rank_info: Open MPI variables, store defaulting to 127.0.0.1:29500", "[rank_info]") {
  ScopedEnv env(kOpenMpi);
  auto info = rank_info_from_env();
  CHECK(info.launcher == "openmpi");
  CHECK(info.rank == 2);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 0);
  CHECK(info.local_world_size == 2);
  CHECK(info.node_rank == 1);
  CHECK(info.store_host == "127.0.0.1");
  CHECK(info.store_port == 29500);
}

TEST_CASE("rank_info: precedence is braid-launch, torchrun, Open MPI, Slurm", "[rank_info]") {
  SECTION("braid-launch over everything") {
    ScopedEnv env(merged(merged(merged(kBraid, kTorchrun), kSlurm), kOpenMpi));
    CHECK(rank_info_from_env().launcher == "braid-launch");
  }
  SECTION("torchrun over Slurm and Open MPI") {
    ScopedEnv env(merged(merged(kTorchrun, kSlurm), kOpenMpi));
    CHECK(rank_info_from_env().launcher == "torchrun");
  }
  SECTION("Open MPI over Slurm: mpirun inside an sbatch script") {
    // Every rank of mpirun sees the batch script's SLURM_PROCID 0.
    ScopedEnv env(merged(with(with(kSlurm, "SLURM_PROCID", "0"), "SLURM_NTASKS", "1"), kOpenMpi));
    const auto info = rank_info_from_env();
    CHECK(info.launcher == "openmpi");
    CHECK(info.rank == 2);
    CHECK(info.world_size == 4);
  }
}

// srun sets the step's tasks per node on every step; SLURM_NTASKS_PER_NODE
// only comes with --ntasks-per-node. `srun -N2 -n8` without it spans two
// nodes, which the ranks must see (they listen for peers on another host).
TEST_CASE("rank_info: Slurm's tasks on this node", "[rank_info]") {
  auto plain = kSlurm;
  plain.erase("SLURM_NTASKS_PER_NODE");  // rank 6 of 12, SLURM_LOCALID 2, node 1
  auto local_size = [](const std::map<std::string, std::string>& vars) {
    ScopedEnv env(vars);
    return rank_info_from_env().local_world_size;
  };
  CHECK(local_size(with(plain, "SLURM_STEP_TASKS_PER_NODE", "6(x2)")) == 6);
  CHECK(local_size(with(plain, "SLURM_TASKS_PER_NODE", "4,5,3")) == 5);
  CHECK(local_size(with(with(plain, "SLURM_TASKS_PER_NODE", "3(x2),6"), "SLURM_NODEID", "2")) == 6);
  CHECK(local_size(with(with(plain, "SLURM_STEP_TASKS_PER_NODE", "3(x4)"), "SLURM_TASKS_PER_NODE", "12")) == 3);
  CHECK(local_size(with(plain, "SLURM_NNODES", "3")) == 4);
  CHECK(local_size(plain) == 12);  // nothing says more than one node
  for (const char* bad : {"4(x", "x3", "4(x0)", "4,,5", "4;5", "0", " 4", "+4", "4(x +2)", "4(x2) "}) {
    INFO(bad);
    ScopedEnv env(with(plain, "SLURM_TASKS_PER_NODE", bad));
    CHECK_THROWS_WITH(rank_info_from_env(), Contains("SLURM_TASKS_PER_NODE"));
  }
  ScopedEnv env(with(plain, "SLURM_TASKS_PER_NODE", "6"));  // lists node 0 only
  CHECK_THROWS_WITH(rank_info_from_env(), Contains("lists no node 1"));
}

TEST_CASE("rank_info: BRAID_STORE_ADDR and BRAID_JOB_TOKEN override any launcher", "[rank_info]") {
  ScopedEnv env(merged(kTorchrun, {{"BRAID_STORE_ADDR", "10.0.0.11:5555"}, {"BRAID_JOB_TOKEN", "tok"}}));
  auto info = rank_info_from_env();
  CHECK(info.launcher == "torchrun");
  CHECK(info.store_host == "10.0.0.11");
  CHECK(info.store_port == 5555);
  CHECK(info.job_token == "tok");
  // IPv6, bare or in brackets as in a URL.
  for (const char* addr : {"[::1]:5556", "::1:5556"}) {
    ScopedEnv v6(merged(kTorchrun, {{"BRAID_STORE_ADDR", addr}}));
    INFO(addr);
    CHECK(rank_info_from_env().store_host == "::1");
    CHECK(rank_info_from_env().store_port == 5556);
  }
}

TEST_CASE("rank_info: the derived token is shared by a job's ranks and differs between jobs", "[rank_info]") {
  auto token_for = [](const std::map<std::string, std::string>& vars) {
    ScopedEnv env(vars);
    return rank_info_from_env().job_token;
  };
  std::string rank6 = token_for(kSlurm);
  CHECK(rank6 == token_for(with(with(kSlurm, "SLURM_PROCID", "7"), "SLURM_LOCALID", "3")));
  CHECK(rank6 != token_for(with(kSlurm, "SLURM_JOB_ID", "778")));
  // Two srun steps of one allocation share the job id, not the step id.
  CHECK(token_for(with(kSlurm, "SLURM_STEP_ID", "0")) != token_for(with(kSlurm, "SLURM_STEP_ID", "1")));
  // Two mpirun jobs with the same MASTER_PORT differ in Open MPI's job id.
  CHECK(token_for(with(kOpenMpi, "OMPI_MCA_ess_base_jobid", "877199361")) !=
        token_for(with(kOpenMpi, "OMPI_MCA_ess_base_jobid", "876412929")));
  // Another launcher's ids left in one node's environment (a SLURM_JOB_ID
  // where torchrun was started from an allocation) split a torchrun job's
  // token, and with it its store ports: the job waited out BRAID_TIMEOUT.
  const auto torchrun = with(kTorchrun, "TORCHELASTIC_RUN_ID", "abc");
  CHECK(token_for(torchrun) == token_for(with(with(torchrun, "SLURM_JOB_ID", "4242"), "SLURM_STEP_ID", "3")));
  CHECK(token_for(torchrun) == token_for(with(torchrun, "OMPI_MCA_ess_base_jobid", "877199361")));
  CHECK(token_for(torchrun) != token_for(with(kTorchrun, "TORCHELASTIC_RUN_ID", "abd")));
  // The address as given, not as each host resolves it (one host's
  // /etc/hosts may map the name to 127.0.1.1).
  CHECK(token_for(with(kTorchrun, "MASTER_ADDR", "localhost")) !=
        token_for(with(kTorchrun, "MASTER_ADDR", "127.0.0.1")));
}

TEST_CASE("rank_info: malformed values are InvalidUsage naming the variable", "[rank_info]") {
  auto [vars, variable] = GENERATE(table<std::map<std::string, std::string>, std::string>({
      {with(kBraid, "BRAID_RANK", "three"), "BRAID_RANK"},
      {with(kBraid, "BRAID_RANK", "8"), "BRAID_RANK"},  // not below the world size
      {with(kBraid, "BRAID_RANK", " 1"), "BRAID_RANK"},  // strtol skipped the space
      {with(kBraid, "BRAID_WORLD_SIZE", "+8"), "BRAID_WORLD_SIZE"},
      {with(kBraid, "BRAID_WORLD_SIZE", "0"), "BRAID_WORLD_SIZE"},
      {with(kBraid, "BRAID_LOCAL_RANK", "2"), "BRAID_LOCAL_RANK"},
      {with(kBraid, "BRAID_STORE_ADDR", "no-port"), "BRAID_STORE_ADDR"},
      {with(kBraid, "BRAID_STORE_ADDR", "host:99999"), "BRAID_STORE_ADDR"},
      {with(kBraid, "BRAID_STORE_ADDR", "host:12ab"), "BRAID_STORE_ADDR"},
      {with(kBraid, "BRAID_STORE_ADDR", "127.0.0.1: 5555"), "BRAID_STORE_ADDR"},  // strtol skipped the space
      {with(kBraid, "BRAID_STORE_ADDR", "127.0.0.1:"), "BRAID_STORE_ADDR"},
      {with(kTorchrun, "RANK", "-1"), "RANK"},
      {with(kTorchrun, "WORLD_SIZE", "8x"), "WORLD_SIZE"},
      {with(kTorchrun, "MASTER_PORT", "65536"), "MASTER_PORT"},
      {with(kSlurm, "SLURM_NTASKS", ""), "SLURM"},  // empty counts as unset: not Slurm at all
      {with(kSlurm, "SLURM_PROCID", "12"), "SLURM_PROCID"},
      {with(kSlurm, "SLURM_LOCALID", "4"), "SLURM_LOCALID"},  // 4 tasks on this node
      {with(kOpenMpi, "OMPI_COMM_WORLD_LOCAL_RANK", "2"), "OMPI_COMM_WORLD_LOCAL_RANK"},
  }));
  ScopedEnv env(vars);
  if (variable == "SLURM") {
    CHECK(rank_info_from_env().launcher == "none");
  } else {
    CHECK_THROWS_AS(rank_info_from_env(), InvalidUsage);
    CHECK_THROWS_WITH(rank_info_from_env(), Contains(variable));
  }
}

TEST_CASE("rank_info: missing required variables are InvalidUsage naming them", "[rank_info]") {
  SECTION("BRAID_RANK without BRAID_STORE_ADDR") {
    auto vars = kBraid;
    vars.erase("BRAID_STORE_ADDR");
    ScopedEnv env(vars);
    CHECK_THROWS_WITH(rank_info_from_env(), Contains("BRAID_STORE_ADDR"));
  }
  SECTION("BRAID_RANK without BRAID_WORLD_SIZE") {
    auto vars = kBraid;
    vars.erase("BRAID_WORLD_SIZE");
    ScopedEnv env(vars);
    CHECK_THROWS_WITH(rank_info_from_env(), Contains("BRAID_WORLD_SIZE"));
  }
  SECTION("OMPI_COMM_WORLD_RANK without its size") {
    auto vars = kOpenMpi;
    vars.erase("OMPI_COMM_WORLD_SIZE");
    ScopedEnv env(vars);
    CHECK_THROWS_WITH(rank_info_from_env(), Contains("OMPI_COMM_WORLD_SIZE"));
  }
}

namespace {

runtime::RankInfo across_hosts(const std::string& store_host) {
  runtime::RankInfo info;
  info.world_size = 4;
  info.local_world_size = 2;
  info.store_host = store_host;
  info.store_port = 29500;
  return info;
}

}  // namespace

// No packet leaves the machine: a route lookup connects a UDP socket only.
TEST_CASE("rank_info: ranks of a job across hosts listen on the address that routes to the store",
          "[rank_info][abuse]") {
  runtime::Config config;  // BRAID_BIND_ADDR unset: 127.0.0.1
  CHECK(runtime::local_address_toward("127.0.0.1", 29500) == "127.0.0.1");
  CHECK(runtime::is_loopback_address(runtime::local_address_toward("localhost", 29500)));
  CHECK(runtime::peer_bind_address(across_hosts("127.0.0.1"), config) == "127.0.0.1");
  if (auto mine = test::local_ipv4_address()) {
    INFO("this machine's address " << *mine);
    CHECK(runtime::peer_bind_address(across_hosts(*mine), config) == *mine);
    runtime::RankInfo one_host = across_hosts(*mine);
    one_host.local_world_size = one_host.world_size;
    CHECK(runtime::peer_bind_address(one_host, config) == "127.0.0.1");
    // A launcher that gave no local world size (RANK, WORLD_SIZE and
    // MASTER_* alone) says nothing of the hosts: its ranks listened on
    // 127.0.0.1, which other hosts do not reach.
    one_host.local_world_known = false;
    CHECK(runtime::peer_bind_address(one_host, config) == *mine);
    one_host.world_size = one_host.local_world_size = 1;  // alone: nobody to reach it
    CHECK(runtime::peer_bind_address(one_host, config) == "127.0.0.1");
  } else {
    WARN("no non-loopback IPv4 address here: the route to one is not checked");
  }
  // The remedy of a store nobody found: a job across hosts with a loopback
  // store address (MASTER_ADDR unset, or a name /etc/hosts maps to
  // 127.0.1.1) waited out BRAID_TIMEOUT and never heard of MASTER_ADDR.
  runtime::RankInfo slurm = across_hosts("127.0.1.1");
  slurm.launcher = "slurm";
  CHECK_THAT(runtime::store_port_remedy(slurm),
             Contains("is a loopback address here: if they run on other hosts, set MASTER_ADDR on every rank"));
  CHECK_THAT(runtime::store_port_remedy(across_hosts("10.0.0.7")), !Contains("loopback"));
  config.bind_addr = "10.9.8.7";  // a BRAID_BIND_ADDR that is set is kept
  CHECK(runtime::peer_bind_address(across_hosts("127.0.0.1"), config) == "10.9.8.7");
}

TEST_CASE("rank_info: without a route to the store the bind address fails at once saying what to set",
          "[rank_info][abuse]") {
  runtime::Config config;
  // Connecting a UDP socket to the broadcast address is refused (EACCES).
  auto info = across_hosts("255.255.255.255");
  CHECK_THROWS_AS(runtime::peer_bind_address(info, config), InvalidUsage);
  CHECK_THROWS_WITH(runtime::peer_bind_address(info, config),
                    Contains("255.255.255.255:29500") && Contains("set BRAID_BIND_ADDR"));
}

// torchrun --standalone and --master_addr localhost set MASTER_ADDR=localhost
// (issue 17): names resolve; one that does not is refused naming the
// variable and the launcher that set it.
TEST_CASE("rank_info: MASTER_ADDR names resolve, and an unknown one says where it came from", "[rank_info]") {
  auto vars = kTorchrun;
  vars["MASTER_ADDR"] = "localhost";
  {
    ScopedEnv env(vars);
    auto info = rank_info_from_env();
    CHECK((info.store_host == "127.0.0.1" || info.store_host == "::1"));
  }
  vars["MASTER_ADDR"] = "no-such-host.invalid";
  ScopedEnv env(vars);
  try {
    rank_info_from_env();
    FAIL("an unresolvable MASTER_ADDR was accepted");
  } catch (const braid::InvalidUsage& e) {
    CHECK_THAT(e.what(), Catch::Contains("MASTER_ADDR='no-such-host.invalid' (read under torchrun)"));
  }
}

TEST_CASE("rank_info: the restart count of braid-launch or torchrun", "[rank_info]") {
  auto vars = kTorchrun;
  vars["TORCHELASTIC_RESTART_COUNT"] = "2";
  {
    ScopedEnv env(vars);
    CHECK(rank_info_from_env().restart_count == 2);
  }
  vars["BRAID_RESTART_COUNT"] = "3";
  ScopedEnv env(vars);
  CHECK(rank_info_from_env().restart_count == 3);
}
