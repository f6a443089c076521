// The guardian: a small process that stops the ranks' process groups when
// braid-launch dies without stopping them itself.
//
// A launcher killed with SIGKILL (the OOM killer, `kill -9`, a CI timeout)
// runs no code: PR_SET_PDEATHSIG kills its ranks (process.h), but not what
// the ranks started. A rank that is `sh -c "..."` or a wrapper script has
// the real workers as children, and those would keep running, holding
// ports, shared memory and GPUs, with nobody left to stop them.
//
// So before the first rank starts the launcher forks a guardian, which
// reads a pipe whose write end only the launcher holds (close-on-exec: no
// rank inherits it). The launcher writes to it the id of each rank's
// process group as soon as the group exists, and that the group is gone
// once its leader is reaped. End-of-file on the pipe without a goodbye
// means the launcher died: the guardian sends SIGTERM to every group still
// recorded, waits up to the grace period for them to empty, sends SIGKILL
// to those that have not, notes on stderr what it did, and exits. On an
// orderly exit the launcher says goodbye and the guardian exits quietly.
//
// The guardian lives in a process group of its own, which the signals
// meant for the job's group (Ctrl-C, a terminal's hangup, a CI runner's
// SIGTERM or SIGKILL to the group) do not reach, and it ignores SIGINT,
// SIGQUIT, SIGTERM and SIGHUP, so that it is still there when the launcher
// is gone; only its goodbye (or SIGKILL) ends it before. It makes only
// plain system calls after the fork (the launcher may have threads) and
// blocks in read(2) until the launcher writes or dies.
//
// A group id is recorded only while its leader is unreaped or its members
// may still run; the kernel reuses a group id only once the whole group is
// gone, so the guardian never signals a group that the job did not own.
// Descendants that leave the rank's group (setsid, a shell with job
// control) are beyond its reach, as they are beyond the supervisor's.
// Once the groups are stopped it also unlinks the attempt's shared-memory
// segments (watch_segments), which the launcher would have removed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "tools/launcher/process.h"

namespace braid::launcher {

class Guardian : public GroupWatcher {
 public:
  // Forks the guardian, which records at most `capacity` groups at once
  // and, when the launcher dies, gives them `grace_period` between SIGTERM
  // and SIGKILL. Throws SystemError if it cannot be started.
  Guardian(std::size_t capacity, std::chrono::milliseconds grace_period);
  // With no group left recorded, says goodbye and reaps the guardian.
  // Otherwise (ranks that could not be reaped) leaves the groups to it, as
  // if the launcher had died.
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  pid_t pid() const { return pid_; }
  void watch(pid_t pgid) noexcept override;
  void forget(pid_t pgid) noexcept override;
  // The names in /dev/shm of the attempt now running (shm_run_prefix
  // without its '/'), which the guardian unlinks once it has stopped the
  // groups: a launcher killed while its ranks set up left their segments
  // behind (about 12 MiB a rank), since only it removes them.
  void watch_segments(const std::string& prefix) noexcept;

 private:
  // Whether the record went out whole.
  bool send(pid_t record) noexcept;
  void reap() noexcept;

  UniqueFd channel_;  // the write end
  pid_t pid_ = -1;
  std::size_t watched_ = 0;
  bool lost_ = false;  // a record did not reach the guardian
};

}  // namespace braid::launcher
