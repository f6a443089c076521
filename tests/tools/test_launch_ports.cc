// Jobs sharing a node never collide on ports (issue 17): concurrent jobs
// given the same store port, under braid-launch and under the variables of
// srun, mpirun and torchrun, each run braid-bench (every value checked) to
// the end. The first job's rank 0 is up, serving its store, before the
// second starts, and stays up until the second is done, so the two stores
// always meet. The real torchrun and mpirun run in launchers.sh.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/shm_names.h"
#include "runtime/store_ports.h"
#include "tests/runtime/store_test_util.h"
#include "tests/tools/launch_harness.h"

using namespace braid::test;
using Catch::Matchers::Contains;

namespace {

std::string bench_path() {
  const char* path = std::getenv("BRAID_BENCH");
  REQUIRE(path != nullptr);  // set by meson test
  return path;
}

// braid-bench's arguments: a short checked all_reduce sweep.
std::vector<std::string> bench_args() {
  return {"--coll", "all_reduce", "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "-c", "1", "--memcpy_bytes", "0"};
}

const char* const kCheckedOk = "Out of bounds values : 0 OK";

std::uint16_t port_of(const std::string& host_port) {
  return static_cast<std::uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1)));
}

// A rank script: record the environment, wait for $0/go when asked, then
// become braid-bench.
std::string bench_script(bool hold) {
  std::string script = "env > \"$0/env_$BRAID_RANK\"; ";
  if (hold) script += "i=0; while [ ! -e \"$0/go\" ]; do i=$((i+1)); [ $i -gt 600 ] && exit 3; sleep 0.1; done; ";
  script += "exec \"$BENCH\"";
  for (const auto& arg : bench_args()) script += " " + arg;
  return script;
}

std::string store_addr(const JobDir& dir, int rank) {
  return parse_env(read_file(dir.path() / ("env_" + std::to_string(rank)))).at("BRAID_STORE_ADDR");
}

// Every variable by which some launcher names a rank or a store, unset, so
// that only the ones a test sets count.
EnvChanges clean_env() {
  EnvChanges env;
  for (const char* name :
       {"BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_WORLD_SIZE", "BRAID_NODE_RANK",
        "BRAID_STORE_ADDR", "BRAID_JOB_TOKEN", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
        "SLURM_NTASKS_PER_NODE", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_MCA_ess_base_jobid"})
    env[name] = std::nullopt;
  env["BRAID_TIMEOUT"] = "60";
  return env;
}

}  // namespace

TEST_CASE("two braid-launch jobs given the same --master-port both run", "[launch][ports]") {
  std::uint16_t port = unused_port();
  EnvChanges env{{"BENCH", bench_path()}, {"BRAID_JOB_TOKEN", std::nullopt}, {"BRAID_TIMEOUT", "60"}};
  std::vector<std::string> fixed{"--master-port", std::to_string(port), "--timeout", "90"};
  JobDir first_dir, second_dir;
  LaunchedJob first(first_dir, shell_job(2, bench_script(true), first_dir, fixed), env);
  wait_for_file(first_dir.path() / "env_1");  // its store is up on the port
  LaunchedJob second(second_dir, shell_job(2, bench_script(false), second_dir, fixed), env);
  int second_status = second.wait(120s);
  INFO("second job:\n" << second.out() << second.err());
  CHECK(second_status == 0);
  CHECK_THAT(second.out(), Contains(kCheckedOk));
  std::filesystem::path go = first_dir.path() / "go";
  { std::ofstream(go.string()) << "go\n"; }
  int first_status = first.wait(120s);
  INFO("first job:\n" << first.out() << first.err());
  CHECK(first_status == 0);
  CHECK_THAT(first.out(), Contains(kCheckedOk));
  CHECK(port_of(store_addr(first_dir, 0)) == port);
  std::uint16_t moved = port_of(store_addr(second_dir, 0));
  std::string token = parse_env(read_file(second_dir.path() / "env_0")).at("BRAID_JOB_TOKEN");
  CHECK(moved != port);
  auto sequence = braid::runtime::store_port_candidates(port, token);
  CHECK(std::find(sequence.begin(), sequence.end(), moved) != sequence.end());
}

// BRAID_JOB_TOKEN, exported once for jobs across nodes, is inherited by
// every later job of that shell. Two such jobs on one host named their
// shared memory alike: one's rank found the other's segment there ("File
// exists") and failed when their set-ups met, and each launcher's clean-up
// removed the other's segments by the token's prefix. The run id
// braid-launch draws for each job now tells them apart: here a segment of
// another run with the token stands where the job's first communicator
// puts its own.
TEST_CASE("a braid-launch job given another job's BRAID_JOB_TOKEN runs and leaves that job's segments alone",
          "[launch][ports]") {
  const std::string token = "shared-token-" + std::to_string(::getpid());
  const std::string other = "/dev/shm" + braid::runtime::shm_run_prefix(token, "other-run") + "00000001-0";
  struct Cleanup {
    std::string path;
    ~Cleanup() { ::unlink(path.c_str()); }
  } cleanup{other};
  { std::ofstream(other) << "another job's"; }
  EnvChanges env{{"BENCH", bench_path()}, {"BRAID_JOB_TOKEN", token}, {"BRAID_RUN_ID", std::nullopt},
                 {"BRAID_TIMEOUT", "60"}};
  JobDir dir;
  auto result = run_launch(dir, shell_job(2, bench_script(false), dir, {"--timeout", "90"}), env);
  INFO(result.out << result.err);
  CHECK(result.status == 0);
  CHECK_THAT(result.out, Contains(kCheckedOk));
  CHECK(std::filesystem::exists(other));
}

// Node 1's ranks are told --master-port; node 0's store had to move past
// another job's store there, so they find it by the token.
TEST_CASE("a second node finds node 0's store past another job's store on --master-port", "[launch][ports]") {
  std::uint16_t port = unused_port();
  EnvChanges env{{"BENCH", bench_path()}, {"BRAID_TIMEOUT", "60"}, {"BRAID_JOB_TOKEN", std::nullopt}};
  JobDir other_dir;
  LaunchedJob other(other_dir, shell_job(1, bench_script(true), other_dir, {"--master-port", std::to_string(port)}),
                    env);
  wait_for_file(other_dir.path() / "env_0");
  env["BRAID_JOB_TOKEN"] = "two-node-job-" + std::to_string(port);
  std::vector<std::unique_ptr<JobDir>> dirs;
  std::vector<std::unique_ptr<LaunchedJob>> nodes;
  for (int node = 0; node < 2; ++node) {
    dirs.push_back(std::make_unique<JobDir>());
    std::vector<std::string> args{"--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr",
                                  "127.0.0.1", "--master-port", std::to_string(port), "--timeout", "90"};
    nodes.push_back(std::make_unique<LaunchedJob>(*dirs.back(), shell_job(1, bench_script(false), *dirs.back(), args),
                                                  env));
  }
  for (int node = 0; node < 2; ++node) {
    int status = nodes[node]->wait(120s);
    INFO("node " << node << ":\n" << nodes[node]->out() << nodes[node]->err());
    CHECK(status == 0);
  }
  CHECK_THAT(nodes[0]->out(), Contains(kCheckedOk));
  CHECK(port_of(store_addr(*dirs[0], 0)) != port);  // node 0's ranks were told where it moved
  CHECK(port_of(store_addr(*dirs[1], 1)) == port);  // node 1's, only --master-port
  { std::ofstream((other_dir.path() / "go").string()) << "go\n"; }
  CHECK(other.wait(120s) == 0);
}

namespace {

// The variables srun, mpirun or torchrun would give rank `rank` of 2 of
// job `job`, whose launcher named `port`.
EnvChanges launcher_env(const std::string& launcher, const std::string& job, int rank, std::uint16_t port) {
  EnvChanges env = clean_env();
  auto set = [&env](const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars) env[name] = value;
  };
  std::string r = std::to_string(rank);
  set({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}, {"BRAID_LOG_LEVEL", "info"},
       // peers over TCP: its listening ports meet too, and no shm is left behind
       {"BRAID_TRANSPORT", "tcp"}});
  if (launcher == "srun")  // two steps of one allocation: the same job id, another step id
    set({{"SLURM_PROCID", r}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", r}, {"SLURM_NTASKS_PER_NODE", "2"},
         {"SLURM_NODEID", "0"}, {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", job}});
  else if (launcher == "mpirun")
    set({{"OMPI_COMM_WORLD_RANK", r}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", r},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_MCA_ess_base_jobid", "87719936" + job}});
  else
    set({{"RANK", r}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", r}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "0"},
         {"TORCHELASTIC_RUN_ID", "none"}});
  return env;
}

std::unique_ptr<LaunchedJob> start_rank(const JobDir& dir, const std::string& launcher, const std::string& job,
                                        int rank, std::uint16_t port) {
  std::vector<std::string> argv{bench_path()};
  for (const auto& arg : bench_args()) argv.push_back(arg);
  return LaunchedJob::program(dir, "job" + job + "_rank" + std::to_string(rank), argv,
                              launcher_env(launcher, job, rank, port));
}

// Listens on two adjacent ports P and P + 1, as two torchrun agents given
// MASTER_PORTs one apart do, and returns them in `ports`.
std::vector<std::unique_ptr<Squatter>> hold_two_ports(std::uint16_t (&ports)[2]) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    try {
      std::vector<std::unique_ptr<Squatter>> agents;
      agents.push_back(std::make_unique<Squatter>(unused_port()));
      ports[0] = agents[0]->port();
      ports[1] = static_cast<std::uint16_t>(ports[0] + 1);
      agents.push_back(std::make_unique<Squatter>(ports[1]));
      return agents;
    } catch (const std::runtime_error&) {
      // P + 1 is in use here: try another P
    }
  }
  FAIL("found no two adjacent free ports in 50 tries");
  return {};
}

}  // namespace

// srun and mpirun: both jobs are told the same MASTER_PORT, where rank 0
// serves braid's store. torchrun: the jobs' MASTER_PORTs are one apart and
// held, as torchrun's agents hold them for their own stores, so braid's
// stores must keep off both.
TEST_CASE("two jobs under srun's, mpirun's or torchrun's variables and one port both run", "[launch][ports]") {
  std::string launcher = GENERATE("srun", "mpirun", "torchrun");
  INFO("launcher " << launcher);
  std::uint16_t port = unused_port();
  std::uint16_t ports[2] = {port, port};
  std::vector<std::unique_ptr<Squatter>> agents;
  if (launcher == "torchrun") agents = hold_two_ports(ports);
  JobDir dir;
  auto first_rank0 = start_rank(dir, launcher, "0", 0, ports[0]);
  std::this_thread::sleep_for(300ms);  // most often the first job's store is up before the second's
  auto second_rank0 = start_rank(dir, launcher, "1", 0, ports[1]);
  auto second_rank1 = start_rank(dir, launcher, "1", 1, ports[1]);
  int statuses[2] = {second_rank0->wait(120s), second_rank1->wait(120s)};
  INFO("second job:\n" << second_rank0->out() << second_rank0->err() << second_rank1->err());
  CHECK(statuses[0] == 0);
  CHECK(statuses[1] == 0);
  CHECK_THAT(second_rank0->out(), Contains(kCheckedOk));
  auto first_rank1 = start_rank(dir, launcher, "0", 1, ports[0]);
  int first_statuses[2] = {first_rank0->wait(120s), first_rank1->wait(120s)};
  INFO("first job:\n" << first_rank0->out() << first_rank0->err() << first_rank1->err());
  CHECK(first_statuses[0] == 0);
  CHECK(first_statuses[1] == 0);
  CHECK_THAT(first_rank0->out(), Contains(kCheckedOk));
  if (launcher != "torchrun")  // one of the two stores moved off the shared port
    CHECK_THAT(first_rank0->err() + second_rank0->err(), Contains("so this job's store listens on"));
}
