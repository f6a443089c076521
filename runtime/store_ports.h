// Where a job's store listens, so that jobs sharing a node never collide on
// a port, whatever ports their launchers gave them.
//
// Every job has a short sequence of candidate ports that all its ranks
// compute alike from what they share: the port their launcher named
// (BRAID_STORE_ADDR, MASTER_PORT, --master-port) first, then ports derived
// from that port and the job token (FNV-1a, so every build and host agrees),
// in [kDerivedStorePortLo, kDerivedStorePortHi): below Linux's ephemeral
// range, where outgoing connections and the transports' kernel-chosen ports
// live, and clear of torch's 29400 and 29500.
//
// The server (rank 0 under torchrun, srun and mpirun; braid-launch on node
// 0) listens on the first candidate that is free. A client tries them in
// order, round after round, until its timeout (Store::find): another job's
// store refuses its token, so it moves on; where nothing listens yet it
// tries again shortly. Two jobs given the same port thus part at once, on
// sequences that differ because their tokens do, and the token still tells
// them apart where sequences meet. Jobs whose launchers give them no job id
// and the same port also share a derived token: give each its own
// BRAID_JOB_TOKEN.
//
// Under torchrun MASTER_PORT is the agent's own store and MASTER_PORT + 1
// may be another job's MASTER_PORT, so braid's store starts on a derived
// port (derived_store_port) instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/rank_info.h"
#include "runtime/store.h"

namespace braid::runtime {

// Where a launcher says that a rank of its node failed ("<launcher's line>
// on node N"): ranks of other nodes still waiting for that rank to join a
// communicator fail at once with it, instead of at BRAID_TIMEOUT.
inline constexpr const char* kJobFailedKey = "braid/job/failed";
// Where a launcher says that a rank of its world of `world_size` ranks
// exited with status 0 while the job ran on ("<launcher's line>"): peers
// still waiting for it to join a world of that size fail at once naming it,
// instead of at BRAID_TIMEOUT. (A world a program forms of some of the
// ranks, numbered its own way, is of another size and reads none.)
inline std::string job_exited_key(int world_size, int rank) {
  return "braid/job/exited/" + std::to_string(world_size) + "/" + std::to_string(rank);
}

inline constexpr std::size_t kStorePortCandidates = 8;
inline constexpr std::uint16_t kDerivedStorePortLo = 20000;
inline constexpr std::uint16_t kDerivedStorePortHi = 29000;

// `first`, then kStorePortCandidates - 1 distinct ports derived from `first`
// and `token`. For first == 0 (a port the kernel picks, which collides with
// nothing) just {0}.
std::vector<std::uint16_t> store_port_candidates(std::uint16_t first, const std::string& token);

// The first port derived from `seed` and `token` (store_port_candidates'
// second entry): where braid's store starts under torchrun.
std::uint16_t derived_store_port(std::uint16_t seed, const std::string& token);

// What to set when no port of the job's sequence works, for its launcher.
std::string store_port_remedy(const RankInfo& info);

// Rank 0 serving the job's store (info.store_served_by_rank0): listens on
// the first free port of info's candidates on info.store_host. Null for
// any other rank. Where a port before that one is in use by a store that
// takes the job's token (a second process started as rank 0), InvalidUsage
// names it.
std::shared_ptr<StoreServer> serve_job_store(const RankInfo& info);

// This rank's connection to the job's store: to `served` when this rank
// serves it, else found among info's candidate ports (Store::find).
// InvalidUsage when there is no store port to look on.
std::shared_ptr<Store> connect_job_store(const RankInfo& info, const StoreServer* served,
                                         std::chrono::milliseconds timeout);

}  // namespace braid::runtime
