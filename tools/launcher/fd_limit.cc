#include "tools/launcher/fd_limit.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <cerrno>

#include "runtime/errors.h"

namespace braid::launcher {
namespace {

// Output relay pipes (stdout and stderr) the launcher holds per local rank.
constexpr std::size_t kRelayFdsPerRank = 2;
// Per local peer: a pidfd, and room for the memfds of registered buffers.
constexpr std::size_t kShmFdsPerPeer = 2;

std::string text(std::size_t count) { return std::to_string(count); }

std::string limit_text(rlim_t value) { return value == RLIM_INFINITY ? "unlimited" : std::to_string(value); }

}  // namespace

FdNeeds estimate_fd_needs(const LaunchOptions& options, int tcp_sockets, bool tcp_only,
                          std::size_t pending_handshakes) {
  auto local = static_cast<std::size_t>(options.nproc_per_node);
  std::size_t world = local * static_cast<std::size_t>(options.nnodes);
  bool serves_store = options.node_rank == 0;
  FdNeeds needs;
  needs.launcher = kBaseFds + kRelayFdsPerRank * local + (serves_store ? world + pending_handshakes : 0);
  needs.launcher_detail =
      text(kBaseFds) + " of its own + " + text(kRelayFdsPerRank) + " per local rank for output";
  if (serves_store)
    needs.launcher_detail += " + 1 store connection per rank of the job + " + text(pending_handshakes) +
                             " for connections being admitted";
  std::size_t shm_peers = tcp_only ? 0 : local - 1;
  std::size_t tcp_peers = world - 1 - shm_peers;
  auto sockets = static_cast<std::size_t>(tcp_sockets);
  needs.rank = kBaseFds + kShmFdsPerPeer * shm_peers + sockets * tcp_peers;
  needs.rank_detail = text(kBaseFds) + " of its own + " + text(kShmFdsPerPeer) + " per peer on this node (" +
                      text(shm_peers) + ") + " + text(sockets) + " TCP sockets (BRAID_TCP_NSOCKS) per peer " +
                      "over TCP (" + text(tcp_peers) + ")";
  return needs;
}

void fit_fd_limit(const FdNeeds& needs, int nproc_per_node) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0)
    throw SystemError(errno_message("getrlimit(RLIMIT_NOFILE)", errno));
  std::size_t wanted = needs.most();
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted) return;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < wanted)
    throw InvalidUsage(
        std::to_string(nproc_per_node) + " ranks on this node need about " + text(wanted) +
        " file descriptors per process, but RLIMIT_NOFILE allows " + limit_text(limit.rlim_max) +
        " (soft limit " + limit_text(limit.rlim_cur) + ", hard limit " + limit_text(limit.rlim_max) + "): " +
        text(wanted - limit.rlim_max) + " short. braid-launch needs " + text(needs.launcher) + " (" +
        needs.launcher_detail + "), each rank " + text(needs.rank) + " (" + needs.rank_detail +
        "). Raise the hard limit (ulimit -Hn as root, LimitNOFILE= in a systemd unit, nofile in "
        "/etc/security/limits.conf) or start fewer ranks per node");
  rlim_t old_soft = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0)
    throw SystemError(errno_message("raising the soft RLIMIT_NOFILE to the hard limit " +
                                        limit_text(limit.rlim_max), errno));
  spdlog::info("braid-launch: raised the soft RLIMIT_NOFILE from {} to the hard limit {}: the job needs "
               "about {} file descriptors per process",
               limit_text(old_soft), limit_text(limit.rlim_max), wanted);
}

}  // namespace braid::launcher
