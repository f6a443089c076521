// Who this process is in the job: read from the environment of whichever
// launcher started it.
//
// Precedence (first match wins):
//   1. braid-launch:  BRAID_RANK, BRAID_WORLD_SIZE, BRAID_LOCAL_RANK,
//                     BRAID_LOCAL_WORLD_SIZE, BRAID_NODE_RANK,
//                     BRAID_STORE_ADDR (host:port), BRAID_JOB_TOKEN.
//                     The launcher serves the store.
//   2. torchrun:      RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//                     GROUP_RANK, MASTER_ADDR, MASTER_PORT. torchrun's agent
//                     owns MASTER_PORT, so rank 0 serves braid's store on
//                     MASTER_ADDR at a port derived from MASTER_PORT and the
//                     job token (runtime/store_ports.h).
//   3. Open MPI:      OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                     OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE;
//                     store at MASTER_ADDR:MASTER_PORT (default
//                     127.0.0.1:29500), served by rank 0. Before Slurm:
//                     mpirun inside an sbatch script leaves the script's
//                     SLURM_* variables in its ranks' environment.
//   4. Slurm (srun):  SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                     the tasks on this node from SLURM_STEP_TASKS_PER_NODE
//                     or SLURM_TASKS_PER_NODE ("2(x3),1"), else
//                     SLURM_NTASKS_PER_NODE; store as for Open MPI.
//   5. none:          a single process, rank 0 of 1, serving its own store.
// BRAID_STORE_ADDR and BRAID_JOB_TOKEN, when set, override the store address
// and token under any launcher. Without BRAID_JOB_TOKEN the token is derived
// from what every rank of the job shares (launcher, job and step id, store
// address). Where the store's port is taken (another job on the node), it
// moves to the next of the job's ports, which every rank computes alike from
// store_port and job_token and probes (runtime/store_ports.h).
#pragma once

#include <cstdint>
#include <string>

#include "braid/config.h"

namespace braid::runtime {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // Whether the launcher said how many ranks share this host (torchrun's
  // LOCAL_WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE); where it did
  // not, local_world_size is the world's and says nothing of the hosts.
  bool local_world_known = true;
  int node_rank = 0;
  // Restarts of the job so far (braid-launch / torchrun --max-restarts:
  // BRAID_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT), 0 on the first run.
  int restart_count = 0;
  // What every attempt of the job shares, restarts included: BRAID_RUN_ID
  // (braid-launch), else TORCHELASTIC_RUN_ID (torchrun's --rdzv-id; not its
  // default "none"); empty where the launcher gives none.
  std::string run_id;
  std::string store_host = "127.0.0.1";
  std::uint16_t store_port = 0;    // 0: pick a free port (single process only)
  bool store_served_by_rank0 = true;  // false when the launcher serves it
  std::string job_token;
  std::string launcher = "none";  // braid-launch | torchrun | slurm | openmpi | none
};

// Reads and validates the environment; throws InvalidUsage naming the
// variable that is missing or malformed.
RankInfo rank_info_from_env();
// Throws InvalidUsage naming the field whose value no launcher gives (a
// rank outside [0, world_size), a world of no ranks, a negative local rank
// or node rank): for a RankInfo made in code
// (Communicator::create_world(info) checks its argument).
void validate(const RankInfo& info);

// What the launcher puts before each line this process writes, as it tells
// the process in BRAID_LINE_PREFIX ("[rank 1] " under braid-launch when it
// relays the ranks' output; empty when it writes each rank's output to a
// file of its own, or under any other launcher). braid's logger leaves out
// its own rank tag where this prefix already names the rank.
std::string launcher_line_prefix();

// "rank 1/4 (local 1/2, node 0) via braid-launch, store 127.0.0.1:40123"
std::string describe(const RankInfo& info);

// The local address this host sends from when it talks to host:port (a
// name or a numeric address): the kernel's route lookup, made by connecting
// a UDP socket, which sends no packet. Throws InvalidUsage naming
// BRAID_BIND_ADDR when the name does not resolve or no route reaches it.
std::string local_address_toward(const std::string& host, std::uint16_t port);

// Loopback: 127.0.0.0/8, ::1 or "localhost".
bool is_loopback_address(const std::string& host);
// The wildcard, every address of this host: 0.0.0.0 or ::.
bool is_wildcard_address(const std::string& host);

// The address this rank listens on for its peers: config.bind_addr, except
// in a job that spans several hosts and whose store is not on loopback,
// where a loopback bind address (BRAID_BIND_ADDR's default) cannot be
// reached from the other hosts; there it is the local address that routes
// to the store's host, or InvalidUsage saying to set BRAID_BIND_ADDR.
std::string peer_bind_address(const RankInfo& info, const Config& config);

}  // namespace braid::runtime
