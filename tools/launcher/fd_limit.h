// The file descriptors a job needs on this node, checked against
// RLIMIT_NOFILE before any rank starts.
//
// Ranks inherit the launcher's limit, and the launcher itself holds
// descriptors per rank (output pipes, and on node 0 a store connection per
// rank of the job), so a job too large for the limit would otherwise fail
// half-started with "Too many open files" somewhere. As many launchers do,
// braid-launch raises the soft limit to the hard limit when the estimate
// needs it; when even the hard limit is too low it refuses, naming the
// limit, the estimate and the shortfall.
#pragma once

#include <cstddef>
#include <string>

#include "tools/launcher/launcher.h"

namespace braid::launcher {

// Descriptors a process needs for its own use whatever the job: stdio,
// Asio's and the progress engine's event descriptors, libraries, logs.
inline constexpr std::size_t kBaseFds = 32;

// The estimate, with how each figure is made up (for the refusal message).
struct FdNeeds {
  std::size_t launcher = 0;  // braid-launch itself
  std::size_t rank = 0;      // each rank of this node, for its world communicator
  std::string launcher_detail;
  std::string rank_detail;
  std::size_t most() const { return launcher > rank ? launcher : rank; }
};

// tcp_sockets: BRAID_TCP_NSOCKS; tcp_only: BRAID_TRANSPORT=tcp (no shared
// memory between the local ranks); pending_handshakes: the least the store
// keeps for connections being admitted.
FdNeeds estimate_fd_needs(const LaunchOptions& options, int tcp_sockets, bool tcp_only,
                          std::size_t pending_handshakes);

// Makes RLIMIT_NOFILE fit the needs: raises the soft limit to the hard limit
// when the soft one is too low and the hard one is enough; throws
// InvalidUsage naming both limits, the estimate and the shortfall when the
// hard limit is too low too; throws SystemError when the limit cannot be
// read or set. Nothing is changed when the soft limit already fits.
void fit_fd_limit(const FdNeeds& needs, int nproc_per_node);

}  // namespace braid::launcher
