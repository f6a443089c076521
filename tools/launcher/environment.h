// The environment braid-launch gives each rank, and the per-job token in it.
//
// Ranks read the contract in runtime/rank_info.h: BRAID_RANK,
// BRAID_WORLD_SIZE, BRAID_LOCAL_RANK, BRAID_LOCAL_WORLD_SIZE,
// BRAID_NODE_RANK, BRAID_STORE_ADDR (host:port), BRAID_JOB_TOKEN and
// BRAID_RUN_ID. The
// torchrun names (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR, MASTER_PORT) are set too, for programs written
// against torchrun. As under torchrun, MASTER_PORT is where
// torch.distributed's rank 0 serves torch's own store (env://), never
// braid's store (torch_store_port); braid ranks read BRAID_STORE_ADDR.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace braid::launcher {

// What every rank of the job shares.
struct JobIdentity {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string store_host;
  std::uint16_t store_port = 0;
  std::string token;
  // BRAID_BIND_ADDR for the ranks when the launcher chose it (a job across
  // nodes without one set); empty: the ranks read their own.
  std::string bind_addr;
  int restart = 0;  // how many times --max-restarts has restarted the job (BRAID_RESTART_COUNT)
  int max_restarts = 0;  // --max-restarts (TORCHELASTIC_MAX_RESTARTS)
  // The same for every attempt of the job, unlike the token (BRAID_RUN_ID):
  // how a restarted rank knows what an earlier attempt of its job wrote.
  std::string run_id = {};
  // MASTER_PORT: where torch.distributed's rank 0 serves torch's own store.
  std::uint16_t torch_port = 0;
};

// 128 random bits from std::random_device, as 32 hex digits.
std::string random_token();

// The job's token, and whether this launcher made it up.
struct JobToken {
  std::string token;
  bool generated = false;
};

// BRAID_JOB_TOKEN from the launcher's environment if set. Otherwise a
// random token on a single node, and on node 0 of several, which must then
// tell the other nodes (generated is true). Any other node cannot learn
// node 0's random token by itself: it throws InvalidUsage saying to set
// BRAID_JOB_TOKEN. No token is ever derived from the address, which anyone
// could compute.
JobToken job_token(int nnodes, int node_rank);

// The line node 0 prints when it generated the token of a job across nodes.
std::string token_instruction(const std::string& token);

// MASTER_PORT for torch.distributed's store. On one node a port free now on
// `listen_addr` (as torchrun picks its MASTER_PORT); across nodes, which
// cannot agree on a free one, `store_port` + 1 (- 1 for 65535), where
// store_port is --master-port, which every node knows (braid's store itself
// may have moved past it on node 0).
std::uint16_t torch_store_port(const std::string& listen_addr, int nnodes, std::uint16_t store_port);

// The launcher's own environment with the rank's variables set over it:
// braid's, and those torchrun sets for a job of one role (ROLE_NAME
// "default", so ROLE_RANK is RANK), TORCHELASTIC_RUN_ID being BRAID_RUN_ID.
// OMP_NUM_THREADS and OPENBLAS_NUM_THREADS default to 1 (one BLAS thread
// per rank, as N ranks already share the node) unless already set.
// `line_prefix`: what the launcher puts before each line of the rank's
// output ("[rank 1] "; empty with --log-dir), given as BRAID_LINE_PREFIX.
std::vector<std::string> rank_environment(const JobIdentity& job, int local_rank, const std::string& line_prefix);

}  // namespace braid::launcher
