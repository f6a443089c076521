#include "runtime/rank_info.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>
#include <string_view>

#include "runtime/decimal.h"
#include "runtime/errors.h"
#include "runtime/store_ports.h"

namespace braid::runtime {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value && *value) ? value : nullptr;
}

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* value = env(name);
  if (!value) return fallback;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (!is_decimal_integer(value) || *end != '\0' || parsed < lo || parsed > hi)
    throw InvalidUsage(std::string("environment variable ") + name + "='" + value +
                       "' must be an integer in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
  return static_cast<int>(parsed);
}

int required_int(const char* name, int lo, int hi) {
  if (!env(name))
    throw InvalidUsage(std::string("environment variable ") + name +
                       " is not set; start the job with braid-launch, torchrun, srun or mpirun");
  return env_int(name, 0, lo, hi);
}

// The numeric address a host name (or address) resolves to, IPv4 first, as
// the store binds and connects to addresses: torchrun's --standalone and
// --master_addr localhost set MASTER_ADDR=localhost.
std::string numeric_address(const std::string& host, const char* var, const std::string& launcher) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  std::string address;
  for (int family : {AF_INET, AF_INET6}) {
    hints.ai_family = family;
    addrinfo* found = nullptr;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) continue;
    char text[NI_MAXHOST] = {};
    if (::getnameinfo(found->ai_addr, found->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0)
      address = text;
    ::freeaddrinfo(found);
    if (!address.empty()) return address;
  }
  throw InvalidUsage(std::string(var) + "='" + host + "' (read under " + launcher +
                     ") does not resolve to an address of this host's resolver; set it to the store host's "
                     "IP address or a name that resolves");
}

void parse_store_addr(RankInfo& info, const std::string& addr, const char* var) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InvalidUsage(std::string(var) + "='" + addr + "' must be host:port");
  std::string host = addr.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);  // [::1]:port
  info.store_host = numeric_address(host, var, "the environment");
  const std::string digits = addr.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(digits.c_str(), &end, 10);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || port <= 0 || port > 65535)
    throw InvalidUsage(std::string(var) + "='" + addr + "' has an invalid port");
  info.store_port = static_cast<std::uint16_t>(port);
}

void read_master(RankInfo& info) {
  info.store_host = numeric_address(env("MASTER_ADDR") ? env("MASTER_ADDR") : "127.0.0.1", "MASTER_ADDR",
                                    info.launcher);
  info.store_port = static_cast<std::uint16_t>(env_int("MASTER_PORT", 29500, 1, 65535));
}

bool read_braid(RankInfo& info) {
  if (!env("BRAID_RANK")) return false;
  info.launcher = "braid-launch";
  info.world_size = required_int("BRAID_WORLD_SIZE", 1, 1 << 20);
  info.rank = required_int("BRAID_RANK", 0, info.world_size - 1);
  info.local_world_size = env_int("BRAID_LOCAL_WORLD_SIZE", info.world_size, 1, info.world_size);
  info.local_rank = env_int("BRAID_LOCAL_RANK", info.rank, 0, info.local_world_size - 1);
  info.node_rank = env_int("BRAID_NODE_RANK", 0, 0, 1 << 20);
  if (!env("BRAID_STORE_ADDR"))
    throw InvalidUsage("BRAID_RANK is set but BRAID_STORE_ADDR is not; start ranks with braid-launch");
  info.store_served_by_rank0 = false;
  return true;
}

bool read_torchrun(RankInfo& info) {
  if (!env("RANK") || !env("WORLD_SIZE")) return false;
  info.launcher = "torchrun";
  info.world_size = required_int("WORLD_SIZE", 1, 1 << 20);
  info.rank = required_int("RANK", 0, info.world_size - 1);
  info.local_world_size = env_int("LOCAL_WORLD_SIZE", info.world_size, 1, info.world_size);
  info.local_world_known = env("LOCAL_WORLD_SIZE") != nullptr;
  info.local_rank = env_int("LOCAL_RANK", info.rank % info.local_world_size, 0, info.local_world_size - 1);
  info.node_rank = env_int("GROUP_RANK", info.rank / info.local_world_size, 0, 1 << 20);
  read_master(info);  // the agent's port: braid's store moves off it (rank_info_from_env)
  return true;
}

// The tasks on node `node` from Slurm's compressed list of tasks per node
// ("2(x3),1": three nodes of 2, then one of 1), or 0 where the list is
// shorter; InvalidUsage naming `var` where it is malformed.
int slurm_tasks_on_node(const char* var, int node) {
  const std::string list = env(var);
  auto malformed = [&] {
    return InvalidUsage(std::string("environment variable ") + var + "='" + list +
                        "' is not a Slurm list of tasks per node (as \"2(x3),1\")");
  };
  // Digits, '(', 'x', ')' and ',' only: strtol alone skipped a space and took '+'.
  if (list.find_first_not_of("0123456789(x),") != std::string::npos) throw malformed();
  std::size_t at = 0;
  long first = 0;  // the first node of the current entry
  while (at < list.size()) {
    char* end = nullptr;
    const long tasks = std::strtol(list.c_str() + at, &end, 10);
    if (end == list.c_str() + at || tasks < 1) throw malformed();
    at = static_cast<std::size_t>(end - list.c_str());
    long repeat = 1;
    if (list.compare(at, 2, "(x") == 0) {
      repeat = std::strtol(list.c_str() + at + 2, &end, 10);
      if (end == list.c_str() + at + 2 || *end != ')' || repeat < 1) throw malformed();
      at = static_cast<std::size_t>(end - list.c_str()) + 1;
    }
    if (node < first + repeat) return static_cast<int>(tasks);
    first += repeat;
    if (at < list.size() && list[at++] != ',') throw malformed();
  }
  return 0;
}

bool read_slurm(RankInfo& info) {
  if (!env("SLURM_PROCID") || !env("SLURM_NTASKS")) return false;
  info.launcher = "slurm";
  info.world_size = required_int("SLURM_NTASKS", 1, 1 << 20);
  info.rank = required_int("SLURM_PROCID", 0, info.world_size - 1);
  info.node_rank = env_int("SLURM_NODEID", 0, 0, 1 << 20);
  // The tasks on this node: srun sets the step's list for every step;
  // SLURM_NTASKS_PER_NODE is only there with --ntasks-per-node. With none
  // of them, one node holds every task only where the step has one node.
  int local = 0;
  for (const char* var : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (local == 0 && env(var)) {
      local = slurm_tasks_on_node(var, info.node_rank);
      if (local == 0)
        throw InvalidUsage(std::string("environment variable ") + var + "='" + env(var) + "' lists no node " +
                           std::to_string(info.node_rank) + " (SLURM_NODEID)");
    }
  }
  if (local == 0) local = env_int("SLURM_NTASKS_PER_NODE", 0, 1, info.world_size);
  if (local == 0) {
    const int nodes = env_int(env("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES", 1, 1,
                              info.world_size);
    local = (info.world_size + nodes - 1) / nodes;
  }
  info.local_world_size = std::min(local, info.world_size);
  info.local_rank = env_int("SLURM_LOCALID", 0, 0, info.local_world_size - 1);
  read_master(info);
  return true;
}

bool read_openmpi(RankInfo& info) {
  if (!env("OMPI_COMM_WORLD_RANK")) return false;
  info.launcher = "openmpi";
  info.world_size = required_int("OMPI_COMM_WORLD_SIZE", 1, 1 << 20);
  info.rank = required_int("OMPI_COMM_WORLD_RANK", 0, info.world_size - 1);
  info.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", info.world_size, 1, info.world_size);
  info.local_world_known = env("OMPI_COMM_WORLD_LOCAL_SIZE") != nullptr;
  info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0, info.local_world_size - 1);
  // OMPI_COMM_WORLD_NODE_RANK is a rank within the node, not the node's
  // index: the index under mpirun's default mapping (by slot, node after
  // node), as torchrun's GROUP_RANK defaults.
  info.node_rank = info.rank / info.local_world_size;
  read_master(info);
  return true;
}

// What every rank of the job shares: the store address as the launcher
// gave it, and the launcher's own job ids. Not the address as this host
// resolves it (a MASTER_ADDR name that one host's /etc/hosts maps to
// 127.0.1.1 split the job's token, and with it its store ports), nor
// another launcher's ids left in the environment (a SLURM_JOB_ID on one
// node of a torchrun job did the same); found by a review helper.
std::string derived_token(const RankInfo& info) {
  const char* given = env("BRAID_STORE_ADDR") ? env("BRAID_STORE_ADDR") : env("MASTER_ADDR");
  std::string shared = info.launcher + "|" + (given ? given : info.store_host) + ":" + std::to_string(info.store_port);
  std::vector<const char*> ids;
  if (info.launcher == "torchrun") ids = {"TORCHELASTIC_RUN_ID"};
  // Two srun steps of one allocation share SLURM_JOB_ID, not SLURM_STEP_ID.
  if (info.launcher == "slurm") ids = {"SLURM_JOB_ID", "SLURM_STEP_ID"};
  if (info.launcher == "openmpi") ids = {"OMPI_MCA_ess_base_jobid"};
  for (const char* var : ids)
    if (env(var)) shared += std::string("|") + env(var);
  return "derived-" + std::to_string(std::hash<std::string>{}(shared));
}

// The source address of the route to one resolved destination, or "" with
// `why` set: connect() on a UDP socket only looks up the route.
std::string source_address(const addrinfo& destination, std::string& why) {
  int fd = ::socket(destination.ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = errno_message("socket", errno);
    return "";
  }
  sockaddr_storage local{};
  socklen_t local_bytes = sizeof local;
  char text[NI_MAXHOST] = {};
  bool found = ::connect(fd, destination.ai_addr, destination.ai_addrlen) == 0 &&
               ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_bytes) == 0 &&
               ::getnameinfo(reinterpret_cast<sockaddr*>(&local), local_bytes, text, sizeof text, nullptr, 0,
                             NI_NUMERICHOST) == 0;
  if (!found) why = errno_message("route lookup", errno);
  ::close(fd);
  return found ? text : "";
}

[[noreturn]] void no_bind_address(const std::string& where, const std::string& why) {
  throw InvalidUsage("cannot find the local address that reaches the store host " + where + " (" + why +
                     "); the job spans several hosts, so ranks must listen on an address the other hosts "
                     "can reach: set BRAID_BIND_ADDR to this host's address on the network they share");
}

}  // namespace

std::string local_address_toward(const std::string& host, std::uint16_t port) {
  std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int err = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); err != 0)
    no_bind_address(where, std::string("cannot resolve it: ") + ::gai_strerror(err));
  std::string why = "it resolves to no address";
  std::string address;
  for (const addrinfo* entry = found; entry && address.empty(); entry = entry->ai_next)
    address = source_address(*entry, why);
  ::freeaddrinfo(found);
  if (address.empty()) no_bind_address(where, why);
  return address;
}

bool is_loopback_address(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return host == "localhost";
}

bool is_wildcard_address(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return v4.s_addr == htonl(INADDR_ANY);
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&v6);
}

std::string peer_bind_address(const RankInfo& info, const Config& config) {
  if (!is_loopback_address(config.bind_addr) || is_loopback_address(info.store_host)) return config.bind_addr;
  if (info.world_size > info.local_world_size) return local_address_toward(info.store_host, info.store_port);
  // One host, if the launcher said so. One that gives no local world size
  // (RANK, WORLD_SIZE and MASTER_* alone, as Kubeflow's PyTorchJob and
  // torch.distributed.launch's legacy mode set them) says nothing of the
  // hosts, and its ranks listened on 127.0.0.1, which other hosts do not
  // reach (found by a review helper). The store's host is reached from
  // here by some route: listen on its source address, which this host's
  // own ranks reach as well, or on loopback where there is none.
  if (info.local_world_known || info.world_size == 1) return config.bind_addr;
  try {
    return local_address_toward(info.store_host, info.store_port);
  } catch (const InvalidUsage&) {
    return config.bind_addr;
  }
}

RankInfo rank_info_from_env() {
  RankInfo info;
  // Open MPI before Slurm: mpirun inside an sbatch script starts its ranks
  // with the batch script's SLURM_PROCID (0 on every rank) beside its own
  // OMPI_COMM_WORLD_* variables, which are the ranks'.
  if (!read_braid(info) && !read_torchrun(info) && !read_openmpi(info) && !read_slurm(info)) {
    info.launcher = "none";
  }
  if (const char* addr = env("BRAID_STORE_ADDR")) parse_store_addr(info, addr, "BRAID_STORE_ADDR");
  info.job_token = env("BRAID_JOB_TOKEN") ? env("BRAID_JOB_TOKEN") : derived_token(info);
  // torchrun's agent serves its own store on MASTER_PORT, and a concurrent
  // job's MASTER_PORT may be the next port: braid's starts on a port derived
  // from both (runtime/store_ports.h).
  if (info.launcher == "torchrun" && !env("BRAID_STORE_ADDR"))
    info.store_port = derived_store_port(info.store_port, info.job_token);
  if (const char* id = env("BRAID_RUN_ID")) info.run_id = id;
  else if (const char* id = env("TORCHELASTIC_RUN_ID"); id && std::string_view(id) != "none") info.run_id = id;
  info.restart_count = env_int(env("BRAID_RESTART_COUNT") ? "BRAID_RESTART_COUNT" : "TORCHELASTIC_RESTART_COUNT", 0, 0,
                               1 << 20);
  return info;
}

// create_world(info) took any RankInfo: rank 3 of a world of 1 (or rank
// -1) crashed with SIGSEGV, a world of 0 "succeeded" (found by a review
// helper).
void validate(const RankInfo& info) {
  auto refuse = [&](const std::string& what) {
    throw InvalidUsage("RankInfo: " + what + " (rank " + std::to_string(info.rank) + ", world_size " +
                       std::to_string(info.world_size) + ", local_rank " + std::to_string(info.local_rank) +
                       ", local_world_size " + std::to_string(info.local_world_size) + ")");
  };
  if (info.world_size < 1) refuse("world_size must be at least 1");
  if (info.rank < 0 || info.rank >= info.world_size) refuse("rank must be in [0, world_size)");
  // Not held to the world: a torch group of some of the host's ranks keeps
  // the launcher's local rank (device selection) in a smaller world.
  if (info.local_world_size < 1) refuse("local_world_size must be at least 1");
  if (info.local_rank < 0) refuse("local_rank must be 0 or more");
  if (info.node_rank < 0) refuse("node_rank must be 0 or more");
  if (info.restart_count < 0) refuse("restart_count must be 0 or more");
}

std::string launcher_line_prefix() {
  const char* prefix = env("BRAID_LINE_PREFIX");
  return prefix ? prefix : "";
}

std::string describe(const RankInfo& info) {
  return "rank " + std::to_string(info.rank) + "/" + std::to_string(info.world_size) +
         " (local " + std::to_string(info.local_rank) + "/" + std::to_string(info.local_world_size) +
         ", node " + std::to_string(info.node_rank) + ") via " + info.launcher + ", store " +
         info.store_host + ":" + std::to_string(info.store_port);
}

}  // namespace braid::runtime
