#include "runtime/store_ports.h"

#include <algorithm>
#include <chrono>

#include "runtime/errors.h"
#include "runtime/hash.h"

namespace braid::runtime {
namespace {

std::uint16_t derived_port(std::uint16_t seed, const std::string& token, int index) {
  std::uint64_t hash = fnv1a(token + "|" + std::to_string(seed) + "|" + std::to_string(index));
  return static_cast<std::uint16_t>(kDerivedStorePortLo + hash % (kDerivedStorePortHi - kDerivedStorePortLo));
}

}  // namespace

std::vector<std::uint16_t> store_port_candidates(std::uint16_t first, const std::string& token) {
  std::vector<std::uint16_t> ports{first};
  if (first == 0) return ports;
  // Collisions among the derived ports are skipped; the range holds 9000.
  for (int index = 0; ports.size() < kStorePortCandidates; ++index) {
    std::uint16_t port = derived_port(first, token, index);
    if (std::find(ports.begin(), ports.end(), port) == ports.end()) ports.push_back(port);
  }
  return ports;
}

std::uint16_t derived_store_port(std::uint16_t seed, const std::string& token) {
  return store_port_candidates(seed, token)[1];
}

namespace {

// How long serve_job_store gives a port in use to take this job's token.
constexpr std::chrono::milliseconds kDuplicateProbe{500};

std::string launcher_remedy(const RankInfo& info) {
  // braid_torch's rendezvous: group rank 0 served the store and published
  // its address through torch's store, so no setting of this rank's is at
  // fault (it was told MASTER_PORT and job tokens; helper-134's finding 7).
  if (info.launcher.starts_with("torch.distributed"))
    return "group rank 0 served it and published its address through torch's store: it has closed it since, "
           "having given up on the group (its timeout passed before this rank joined) or exited";
  if (info.launcher == "braid-launch")
    return "the store is braid-launch's (on node 0 of a job across nodes, started with the same --master-port "
           "and BRAID_JOB_TOKEN): check that it is running, and that node 0 was given this --master-addr too "
           "(without one it serves the store on 127.0.0.1, which other machines do not reach)";
  if (info.launcher == "torchrun")
    return "set BRAID_STORE_ADDR=host:port to a free port on rank 0's host (torchrun's MASTER_PORT is its own "
           "store's) on every rank, and check that rank 0 is running";
  return "set MASTER_PORT (or BRAID_STORE_ADDR=host:port) to a port free on rank 0's host on every rank, check "
         "that rank 0 is running, and give concurrent jobs distinct BRAID_JOB_TOKENs where the launcher sets "
         "no job id";
}

}  // namespace

std::string store_port_remedy(const RankInfo& info) {
  // A job across hosts whose store address is loopback here: MASTER_ADDR
  // unset, or a name that this host's /etc/hosts maps to 127.0.1.1.
  if (info.launcher != "braid-launch" && info.world_size > info.local_world_size &&
      is_loopback_address(info.store_host))
    return "this job's " + std::to_string(info.world_size) + " ranks are not all on this host (" +
           std::to_string(info.local_world_size) + " are), and its store address " + info.store_host +
           " is a loopback address here: if they run on other hosts, set MASTER_ADDR on every rank to an "
           "address of rank 0's host that every host reaches (a hostname that /etc/hosts maps to 127.0.1.1 "
           "will not do); else " + launcher_remedy(info);
  return launcher_remedy(info);
}

// The ports before the one a server got were in use. One that takes this
// job's token is a store of this very job: another process serves it as rank
// 0. Served on the next port, this one would wait alone for ranks that all
// joined the other, and fail at the timeout saying only that they had not.
std::shared_ptr<StoreServer> serve_job_store(const RankInfo& info) {
  if (!info.store_served_by_rank0 || info.rank != 0) return nullptr;
  const auto ports = store_port_candidates(info.store_port, info.job_token);
  auto server = std::make_shared<StoreServer>(info.store_host, ports, info.job_token, store_port_remedy(info));
  for (std::uint16_t port : ports) {
    if (port == server->port() || port == 0) break;  // 0: the kernel chose, no port before it
    // One attempt each: another job's store, another program or no answer
    // is not this job's.
    if (!Store::takes_token(info.store_host, port, info.job_token, kDuplicateProbe)) continue;
    throw InvalidUsage("rank 0 cannot serve this job's store: a store of this very job (it took this job's "
                       "token) already listens on " + info.store_host + ":" + std::to_string(port) +
                       ", served by another process started as rank 0. Start each rank once (check RANK, or "
                       "--node-rank under a launcher), stop an earlier run of this job that still runs, or, for "
                       "two jobs given the same MASTER_PORT without a job id, give each its own BRAID_JOB_TOKEN");
  }
  return server;
}

std::shared_ptr<Store> connect_job_store(const RankInfo& info, const StoreServer* served,
                                         std::chrono::milliseconds timeout) {
  if (served) return std::make_shared<Store>(info.store_host, served->port(), info.job_token, timeout);
  if (info.store_port == 0) throw InvalidUsage("no store address: set BRAID_STORE_ADDR or start with braid-launch");
  return Store::find(info.store_host, store_port_candidates(info.store_port, info.job_token), info.job_token,
                     timeout, store_port_remedy(info));
}

}  // namespace braid::runtime
