#include "tools/launcher/environment.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <random>

#include "runtime/errors.h"

extern char** environ;

namespace braid::launcher {
namespace {

std::string hex(std::uint64_t value, int digits) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(static_cast<std::size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, value >>= 4) out[static_cast<std::size_t>(i)] = kDigits[value & 0xf];
  return out;
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; *entry; ++entry) {
    std::string text(*entry);
    std::size_t eq = text.find('=');
    if (eq != std::string::npos) vars[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return vars;
}

}  // namespace

std::string random_token() {
  std::random_device urandom;  // libstdc++ reads the kernel's CSPRNG
  std::string token;
  for (int i = 0; i < 4; ++i) token += hex(urandom(), 8);
  return token;
}

JobToken job_token(int nnodes, int node_rank) {
  // Rank identity, like the rest of the rank contract, is read here and in
  // runtime/rank_info.cc rather than in runtime/config.
  const char* shared = std::getenv("BRAID_JOB_TOKEN");
  if (shared && *shared) return {shared, false};
  if (nnodes == 1 || node_rank == 0) return {random_token(), nnodes > 1};
  throw InvalidUsage("BRAID_JOB_TOKEN is not set: every node of a job across " + std::to_string(nnodes) +
                     " nodes must use node 0's token, which this node cannot know. Start node 0 first and "
                     "set BRAID_JOB_TOKEN here to the token it prints (export BRAID_JOB_TOKEN=...), or set "
                     "BRAID_JOB_TOKEN to one secret on every node (e.g. from `openssl rand -hex 16`)");
}

std::string token_instruction(const std::string& token) {
  return "BRAID_JOB_TOKEN is not set, so this job's token was generated; start the other nodes with it:\n"
         "  export BRAID_JOB_TOKEN=" + token + "\n"
         "(keep it secret: whoever has it can join the job and write to its store)";
}

std::uint16_t torch_store_port(const std::string& listen_addr, int nnodes, std::uint16_t store_port) {
  std::uint16_t next = static_cast<std::uint16_t>(store_port == 65535 ? store_port - 1 : store_port + 1);
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (nnodes > 1 || getaddrinfo(listen_addr.c_str(), "0", &hints, &found) != 0) return next;
  std::uint16_t port = next;
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage bound{};
  socklen_t bound_bytes = sizeof bound;
  if (fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_bytes) == 0)
    port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return port;
}

std::vector<std::string> rank_environment(const JobIdentity& job, int local_rank, const std::string& line_prefix) {
  auto vars = current_environment();
  vars.try_emplace("OMP_NUM_THREADS", "1");
  vars.try_emplace("OPENBLAS_NUM_THREADS", "1");
  std::string rank = std::to_string(job.node_rank * job.nproc_per_node + local_rank);
  std::string world_size = std::to_string(job.nnodes * job.nproc_per_node);
  std::string port = std::to_string(job.store_port);
  vars["BRAID_RANK"] = vars["RANK"] = rank;
  vars["BRAID_WORLD_SIZE"] = vars["WORLD_SIZE"] = world_size;
  vars["BRAID_LOCAL_RANK"] = vars["LOCAL_RANK"] = std::to_string(local_rank);
  vars["BRAID_LOCAL_WORLD_SIZE"] = vars["LOCAL_WORLD_SIZE"] = std::to_string(job.nproc_per_node);
  vars["BRAID_NODE_RANK"] = vars["GROUP_RANK"] = std::to_string(job.node_rank);
  vars["BRAID_RESTART_COUNT"] = vars["TORCHELASTIC_RESTART_COUNT"] = std::to_string(job.restart);
  vars["BRAID_STORE_ADDR"] = job.store_host + ":" + port;
  vars["BRAID_JOB_TOKEN"] = job.token;
  vars["BRAID_RUN_ID"] = vars["TORCHELASTIC_RUN_ID"] = job.run_id;
  vars["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(job.max_restarts);
  vars["ROLE_NAME"] = "default";
  vars["ROLE_RANK"] = rank;
  vars["ROLE_WORLD_SIZE"] = world_size;
  vars["GROUP_WORLD_SIZE"] = std::to_string(job.nnodes);
  if (!job.bind_addr.empty()) vars["BRAID_BIND_ADDR"] = job.bind_addr;
  if (line_prefix.empty())
    vars.erase("BRAID_LINE_PREFIX");  // one the launcher inherited is not this rank's
  else
    vars["BRAID_LINE_PREFIX"] = line_prefix;
  vars["MASTER_ADDR"] = job.store_host;
  vars["MASTER_PORT"] = std::to_string(job.torch_port);
  std::vector<std::string> flat;
  flat.reserve(vars.size());
  for (const auto& [name, value] : vars) flat.push_back(name + "=" + value);
  return flat;
}

}  // namespace braid::launcher
