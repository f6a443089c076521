// Child processes of braid-launch: starting one rank, signalling it, and
// reading how it ended.
//
// Every rank runs in its own process group whose id is the rank's pid, so a
// signal sent to the group reaches the rank and everything it started (a
// shell's `sleep`, a Python data-loader worker). The rank also asks the
// kernel to SIGKILL it when the launcher dies (PR_SET_PDEATHSIG), so a
// launcher killed with SIGKILL leaves no rank behind; only grandchildren
// that outlive their rank can escape that, which is why the supervisor kills
// a rank's whole group as soon as the rank itself exits, and why the
// launcher's guardian (guardian.h) stops the groups when the launcher dies.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "runtime/errors.h"

namespace braid::launcher {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A pipe whose both ends are close-on-exec, so no rank inherits another
// rank's pipe (which would keep it from ever reaching end-of-file).
struct Pipe {
  UniqueFd read_end;
  UniqueFd write_end;
};
Pipe make_pipe();

// exec failed in the child: the program is missing or not executable.
class CannotExecute : public SystemError {
 public:
  CannotExecute(const std::string& program, int err);
  int error_number() const { return err_; }

 private:
  int err_;
};

// Told of each rank's process group for as long as it may hold processes:
// from just after the fork that creates it (before the launcher waits for
// the exec) until its leader has been reaped. The guardian is one
// (guardian.h). Neither call may throw: they are made on the way out of
// failures.
class GroupWatcher {
 public:
  virtual void watch(pid_t pgid) noexcept = 0;
  virtual void forget(pid_t pgid) noexcept = 0;

 protected:
  ~GroupWatcher() = default;
};

// What a rank's process receives: argv (argv[0] is looked up in PATH), the
// complete environment as "NAME=value" strings, and the descriptors that
// become its stdin (-1: /dev/null), stdout and stderr.
struct ProcessSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;
  int stdin_fd = -1;
  int stdout_fd = 1;
  int stderr_fd = 2;
  GroupWatcher* watcher = nullptr;  // told of the rank's group, if set
};

// Forks and execs; returns the child's pid once exec has succeeded. Throws
// CannotExecute if exec failed (the child is reaped before the throw) and
// SystemError if fork or pipe failed.
pid_t spawn(const ProcessSpec& spec);

// Sends signo to the process group led by pid; a group that is already gone
// is not an error.
void signal_group(pid_t pid, int signo);

// How many live processes other than pid are in the process group pid
// leads (read from /proc).
int others_in_group(pid_t pid);

// The children of `parent` and the state /proc gives each ('Z': exited,
// not yet reaped).
struct ChildProcess {
  pid_t pid;
  char state;
};
std::vector<ChildProcess> children_of(pid_t parent);

// How a child ended, decoded from a wait status.
struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signo = 0;   // terminating signal when signaled

  bool success() const { return !signaled && code == 0; }
  // The status a shell reports for it: the exit code, or 128 + signal.
  int shell_status() const { return signaled ? 128 + signo : code; }
};
ExitStatus decode_wait_status(int status);

// "exited with status 3" / "was killed by signal 9 (SIGKILL)"
std::string describe(const ExitStatus& status);

// "SIGTERM"; "signal 64" for a signal without a name.
std::string signal_name(int signo);

}  // namespace braid::launcher
