// fork + exec of one rank.
//
// The launcher is multi-threaded (the store serves on its own thread), so
// between fork and exec the child may only make async-signal-safe calls:
// everything it needs (argv and envp as C arrays, /dev/null) is prepared
// before the fork. Whether exec succeeded comes back through a close-on-exec
// "report" pipe: a successful exec closes it with nothing written; a failed
// one writes errno into it. The parent's blocking read therefore returns
// only once the child's fate is known, which lets the launcher refuse a
// missing program before it starts a second rank.
#include "tools/launcher/process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace braid::launcher {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// The child inherits the launcher's blocked signals (they feed its
// signalfd) and its ignored SIGPIPE and SIGTTIN; all survive exec, so undo
// them. So do the stop signals the launcher forwards, which a shell ignores
// for a command it starts in the background (SIGINT, SIGQUIT) or nohup
// does (SIGHUP): the launcher still takes them and forwards them, and a
// rank that ignored them was killed after the grace period instead, its
// clean-up never run.
void restore_default_signals() {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signo : {SIGPIPE, SIGTTIN, SIGINT, SIGQUIT, SIGHUP, SIGTERM}) sigaction(signo, &default_action, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

struct ChildSetup {
  char* const* argv;
  char* const* envp;
  int stdin_fd;
  int stdout_fd;
  int stderr_fd;
  int report_fd;
  pid_t launcher_pid;
};

[[noreturn]] void exec_child(const ChildSetup& setup) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher may have died before prctl took effect.
  if (getppid() != setup.launcher_pid) _exit(127);
  dup2(setup.stdin_fd, 0);
  dup2(setup.stdout_fd, 1);
  dup2(setup.stderr_fd, 2);
  restore_default_signals();
  // Libraries in the launcher (Asio's sockets) open descriptors without
  // O_CLOEXEC; a rank has no business holding the store's listening socket.
  close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  execvpe(setup.argv[0], setup.argv, setup.envp);
  int err = errno;
  [[maybe_unused]] ssize_t written = write(setup.report_fd, &err, sizeof err);
  _exit(127);
}

// Returns the errno the child reported, or 0 when exec succeeded.
int read_exec_report(int fd) {
  int err = 0;
  ssize_t n;
  do {
    n = read(fd, &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(sizeof err) ? err : 0;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int UniqueFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Pipe make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw SystemError(errno_message("pipe2", errno));
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

namespace {

// The file exec ran for `program`: itself where it names a path, else the
// first of PATH's directories that holds it.
std::string resolve(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// ENOENT for a script that exists means its #! names an interpreter that
// does not: "No such file or directory" alone named the script.
std::string exec_failure(const std::string& program, int err) {
  const std::string message = errno_message("cannot execute '" + program + "'", err);
  if (err != ENOENT) return message;
  const std::string file = resolve(program);
  std::ifstream in(file);
  std::string first;
  if (file.empty() || !in || !std::getline(in, first) || first.rfind("#!", 0) != 0) return message;
  const bool crlf = !first.empty() && first.back() == '\r';  // "#!/bin/sh\r" names "/bin/sh\r"
  if (crlf) first.pop_back();
  std::istringstream words(first.substr(2));
  std::string interpreter;
  words >> interpreter;
  if (!crlf && ::access(interpreter.c_str(), F_OK) == 0)  // a script of a missing one, or missing its loader
    return message + ": its #! line names the interpreter '" + interpreter +
           "', which exists but names in turn something that does not (its own #! line, or its loader)";
  if (crlf)
    return message + ": its #! line ends in \"\\r\\n\" (the file has Windows line ends), so it names the "
                     "interpreter '" + interpreter + "\\r', which does not exist";
  return message + ": its #! line names the interpreter '" + interpreter + "', which does not exist";
}

}  // namespace

CannotExecute::CannotExecute(const std::string& program, int err)
    : SystemError(exec_failure(program, err)), err_(err) {}

pid_t spawn(const ProcessSpec& spec) {
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  UniqueFd dev_null;
  if (spec.stdin_fd < 0) {
    dev_null.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!dev_null.valid()) throw SystemError(errno_message("open /dev/null", errno));
  }
  Pipe report = make_pipe();
  ChildSetup setup{argv.data(), envp.data(), spec.stdin_fd < 0 ? dev_null.get() : spec.stdin_fd, spec.stdout_fd,
                   spec.stderr_fd, report.write_end.get(), getpid()};
  pid_t pid = fork();
  if (pid < 0) throw SystemError(errno_message("fork", errno));
  if (pid == 0) exec_child(setup);
  // Also set in the parent, so the group exists before anyone signals it
  // (EACCES once the child has exec'ed is harmless: it set it itself).
  setpgid(pid, pid);
  if (spec.watcher) spec.watcher->watch(pid);
  report.write_end.reset();
  if (int err = read_exec_report(report.read_end.get()); err != 0) {
    waitpid(pid, nullptr, 0);
    if (spec.watcher) spec.watcher->forget(pid);
    throw CannotExecute(spec.argv.at(0), err);
  }
  return pid;
}

void signal_group(pid_t pid, int signo) {
  if (::kill(-pid, signo) != 0 && errno != ESRCH)
    throw SystemError(errno_message("kill(-" + std::to_string(pid) + ")", errno));
}

namespace {

// Calls fn(pid, state, ppid, pgrp) for every process /proc lists.
template <typename Fn>
void each_process(Fn fn) {
  std::error_code ec;
  // Incremented with an error code: a range-for's ++ throws on a failed
  // read of the directory, and nothing here may end the supervisor.
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const auto& entry = *it;
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(close_paren + 1));
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (rest >> state >> ppid >> pgrp) fn(static_cast<pid_t>(std::stol(name)), state, ppid, pgrp);
  }
}

}  // namespace

int others_in_group(pid_t pid) {
  int count = 0;
  each_process([&](pid_t other, char state, long, long pgrp) { count += other != pid && pgrp == pid && state != 'Z'; });
  return count;
}

std::vector<ChildProcess> children_of(pid_t parent) {
  std::vector<ChildProcess> children;
  each_process([&](pid_t pid, char state, long ppid, long) {
    if (ppid == parent) children.push_back({pid, state});
  });
  return children;
}

ExitStatus decode_wait_status(int status) {
  ExitStatus decoded;
  if (WIFSIGNALED(status)) {
    decoded.signaled = true;
    decoded.signo = WTERMSIG(status);
  } else {
    decoded.code = WEXITSTATUS(status);
  }
  return decoded;
}

std::string describe(const ExitStatus& status) {
  if (!status.signaled) return "exited with status " + std::to_string(status.code);
  return "was killed by signal " + std::to_string(status.signo) + " (" +
         signal_name(status.signo) + ")";
}

std::string signal_name(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

}  // namespace braid::launcher
