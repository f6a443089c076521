// The guardian's two sides: the launcher's (watch, forget, goodbye) and the
// forked guardian's loop.
//
// The wire format is a stream of pid_t records on a pipe, each written in
// one write(2) (smaller than PIPE_BUF, so whole): a positive record is a
// group to watch, a negative one a group that is gone, kGoodbye the
// launcher's orderly exit, kSegments followed by kPrefixBytes of the
// attempt's shared-memory prefix (NUL-padded) in the same write. The
// launcher's end is non-blocking: a guardian that stopped reading costs the
// job its safety net, never its progress.
//
// After the fork the guardian makes only async-signal-safe calls (the
// launcher may have threads, whose locks the child would inherit held): its
// table of groups is allocated before the fork, and its note on stderr is
// put together by hand instead of with snprintf.
#include "tools/launcher/guardian.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "tools/launcher/output.h"

namespace braid::launcher {
namespace {

constexpr pid_t kGoodbye = 0;
constexpr pid_t kSegments = INT_MIN;  // no group's negated id
constexpr std::size_t kPrefixBytes = 28;  // "braid-" + 16 hex digits + "-", NUL-padded
// The descriptor the guardian reads its records from.
constexpr int kChannelFd = 3;
// How often the guardian checks, during the grace period, whether the
// groups it sent SIGTERM have emptied.
constexpr int kCheckIntervalMs = 50;
// How long the launcher waits for a guardian it said goodbye to.
constexpr std::chrono::milliseconds kGoodbyeTime{1000};

// Everything the guardian needs, prepared before the fork.
struct GuardianSetup {
  int channel;    // the read end
  int write_end;  // the launcher's end, closed in the guardian
  pid_t launcher;
  pid_t* groups;  // capacity slots, 0 where empty
  std::size_t capacity;
  long long grace_ms;
};

// ---- The guardian, after the fork ---------------------------------------

bool group_exists(pid_t pgid) { return ::kill(-pgid, 0) == 0 || errno == EPERM; }

// The groups the guardian watches, in the table allocated before the fork.
class GroupTable {
 public:
  GroupTable(pid_t* slots, std::size_t capacity) : slots_(slots), capacity_(capacity) {}

  // With the table full, slots of groups that have emptied since are
  // reused; with none such, the group goes unwatched (the table holds
  // twice the ranks of one node, so it takes ranks left unreaped by many
  // restarts to get there).
  void add(pid_t pgid) {
    pid_t* slot = find(0);
    if (!slot) {
      drop_empty();
      slot = find(0);
    }
    if (slot) *slot = pgid;
  }
  void remove(pid_t pgid) {
    if (pid_t* slot = find(pgid)) *slot = 0;
  }
  void drop_empty() {
    for (std::size_t i = 0; i < capacity_; ++i)
      if (slots_[i] != 0 && !group_exists(slots_[i])) slots_[i] = 0;
  }
  int count() const {
    int used = 0;
    for (std::size_t i = 0; i < capacity_; ++i) used += slots_[i] != 0 ? 1 : 0;
    return used;
  }
  // Sends signo to every group; forgets those already gone. Returns how
  // many groups it reached.
  int signal_all(int signo) {
    int reached = 0;
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i] == 0) continue;
      if (::kill(-slots_[i], signo) == 0)
        ++reached;
      else if (errno == ESRCH)
        slots_[i] = 0;
    }
    return reached;
  }

 private:
  pid_t* find(pid_t pgid) const {
    for (std::size_t i = 0; i < capacity_; ++i)
      if (slots_[i] == pgid) return &slots_[i];
    return nullptr;
  }

  pid_t* slots_;
  std::size_t capacity_;
};

// Out of the job's way: its own process group (a signal to the launcher's
// group does not reach it), the job's signals ignored, no descriptor held
// but the channel and stderr (a guardian holding stdout would keep
// `$(braid-launch ...)` waiting), no directory kept busy.
void detach(const GuardianSetup& setup) {
  ::close(setup.write_end);
  setpgid(0, 0);
  prctl(PR_SET_NAME, "braid-guardian");
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int signo : {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGPIPE, SIGTTOU}) sigaction(signo, &ignore, nullptr);
  // The launcher blocks the signals its signalfd takes; nothing here needs them blocked.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (setup.channel != kChannelFd) dup2(setup.channel, kChannelFd);
  close_range(kChannelFd + 1, ~0U, 0);
  ::close(STDIN_FILENO);
  ::close(STDOUT_FILENO);
  [[maybe_unused]] int ignored = chdir("/");
}

// Exactly `size` bytes; false at end-of-file, when the launcher is gone.
bool read_exactly(void* into, std::size_t size) {
  char* bytes = static_cast<char*>(into);
  std::size_t got = 0;
  while (got < size) {
    ssize_t n = ::read(kChannelFd, bytes + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

bool read_record(pid_t& record) { return read_exactly(&record, sizeof record); }

// Unlinks the entries of /dev/shm whose names start with `prefix`, by
// getdents64 and unlinkat (opendir allocates); passes again while a pass
// removed something, since unlinking during a listing may skip entries.
// Returns how many it removed.
long long remove_segments(const char* prefix) {
  const std::size_t length = ::strnlen(prefix, kPrefixBytes);
  if (length == 0) return 0;
  const int dir = ::open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  long long removed = 0;
  for (int pass = 0; pass < 8; ++pass) {
    long long this_pass = 0;
    ::lseek(dir, 0, SEEK_SET);
    alignas(8) char listing[4096];
    long n;
    while ((n = ::syscall(SYS_getdents64, dir, listing, sizeof listing)) > 0) {
      for (long at = 0; at < n;) {
        const auto* entry = reinterpret_cast<const dirent64*>(listing + at);
        at += entry->d_reclen;
        if (std::strncmp(entry->d_name, prefix, length) == 0 && ::unlinkat(dir, entry->d_name, 0) == 0) ++this_pass;
      }
    }
    removed += this_pass;
    if (this_pass == 0) break;
  }
  ::close(dir);
  return removed;
}

long long monotonic_ms() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
}

// Waits until every group has emptied (true) or the grace period is over.
bool wait_for_groups(GroupTable& groups, long long grace_ms) {
  const long long give_up = monotonic_ms() + grace_ms;
  for (;;) {
    groups.drop_empty();
    if (groups.count() == 0) return true;
    if (monotonic_ms() >= give_up) return false;
    ::poll(nullptr, 0, kCheckIntervalMs);
  }
}

// A line put together without the allocating, locking stdio functions.
class Note {
 public:
  Note& operator<<(const char* piece) {
    while (*piece && length_ < sizeof text_) text_[length_++] = *piece++;
    return *this;
  }
  Note& operator<<(long long value) {
    char digits[24];
    int count = 0;
    do {
      digits[count++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value > 0);
    while (count > 0 && length_ < sizeof text_) text_[length_++] = digits[--count];
    return *this;
  }
  // Only if stderr takes it now (a pipe that polls writable has room for
  // a line this short): the launcher's reader may be what stalled.
  void write_to_stderr() const {
    pollfd ready{STDERR_FILENO, POLLOUT, 0};
    if (::poll(&ready, 1, 0) == 1 && (ready.revents & POLLOUT)) {
      [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, text_, length_);
    }
  }

 private:
  char text_[256];
  std::size_t length_ = 0;
};

// SIGTERM, the grace period, SIGKILL, then the attempt's shared memory;
// the note comes last so that a slow stderr cannot hold up the stopping.
void stop_groups(GroupTable& groups, const GuardianSetup& setup, const char* segments) {
  const int terminated = groups.signal_all(SIGTERM);
  int killed = 0;
  if (terminated > 0 && !wait_for_groups(groups, setup.grace_ms)) {
    killed = groups.signal_all(SIGKILL);
    wait_for_groups(groups, 1000);  // SIGKILL takes a moment too
  }
  const long long removed = remove_segments(segments);
  if (terminated == 0 && removed == 0) return;
  Note note;
  note << "braid-launch: the launcher (pid " << static_cast<long long>(setup.launcher) << ") ended without "
       << "stopping its ranks; its guardian sent SIGTERM to " << static_cast<long long>(terminated)
       << " process group(s)";
  if (killed > 0)
    note << ", then SIGKILL to the " << static_cast<long long>(killed) << " still not empty after "
         << setup.grace_ms << " ms";
  if (removed > 0) note << ", and removed " << removed << " shared-memory segment(s)";
  (note << "\n").write_to_stderr();
}

[[noreturn]] void run_guardian(const GuardianSetup& setup) {
  detach(setup);
  GroupTable groups(setup.groups, setup.capacity);
  char segments[kPrefixBytes + 1] = {};  // the attempt's, NUL-terminated
  pid_t record = 0;
  while (read_record(record)) {
    if (record == kGoodbye) _exit(0);
    if (record == kSegments) {
      if (!read_exactly(segments, kPrefixBytes)) break;
      segments[kPrefixBytes] = 0;
    } else if (record > 0) {
      groups.add(record);
    } else {
      groups.remove(-record);
    }
  }
  stop_groups(groups, setup, segments);
  _exit(0);
}

}  // namespace

// ---- The launcher's side ------------------------------------------------

Guardian::Guardian(std::size_t capacity, std::chrono::milliseconds grace_period) {
  std::vector<pid_t> groups(capacity, 0);
  Pipe pipe = make_pipe();
  int flags = fcntl(pipe.write_end.get(), F_GETFL);
  if (flags < 0 || fcntl(pipe.write_end.get(), F_SETFL, flags | O_NONBLOCK) != 0)
    throw SystemError(errno_message("cannot set up the guardian's pipe: fcntl", errno));
  const GuardianSetup setup{pipe.read_end.get(), pipe.write_end.get(), getpid(), groups.data(),
                            groups.size(), static_cast<long long>(grace_period.count())};
  pid_t pid = fork();
  if (pid < 0) throw SystemError(errno_message("cannot start the launcher's guardian: fork", errno));
  if (pid == 0) run_guardian(setup);
  // Also set here, so that the guardian is out of the launcher's group
  // before a Ctrl-C can reach it (EACCES is harmless, as in spawn()).
  setpgid(pid, pid);
  pid_ = pid;
  channel_ = std::move(pipe.write_end);
}

Guardian::~Guardian() {
  if (pid_ < 0) return;
  if (watched_ > 0) {
    // End-of-file without a goodbye: the guardian stops what is left.
    channel_.reset();
    return;
  }
  // A guardian that did not get the goodbye would take end-of-file for
  // the launcher's death; it has nothing to stop, but it is ours to end.
  if (!send(kGoodbye)) ::kill(pid_, SIGKILL);
  channel_.reset();
  reap();
}

void Guardian::watch(pid_t pgid) noexcept {
  ++watched_;
  send(pgid);
}

void Guardian::forget(pid_t pgid) noexcept {
  if (watched_ > 0) --watched_;
  send(-pgid);
}

void Guardian::watch_segments(const std::string& prefix) noexcept {
  struct {
    pid_t tag = kSegments;
    char prefix[kPrefixBytes] = {};
  } record;
  static_assert(sizeof record == sizeof(pid_t) + kPrefixBytes, "one write, no padding");
  std::memcpy(record.prefix, prefix.data(), std::min(prefix.size(), kPrefixBytes));
  ssize_t n;
  do {
    n = ::write(channel_.get(), &record, sizeof record);
  } while (n < 0 && errno == EINTR);
  // Like a lost group record (send()): the job goes on without it.
  if (n != static_cast<ssize_t>(sizeof record)) lost_ = true;
}

bool Guardian::send(pid_t record) noexcept {
  ssize_t n;
  do {
    n = ::write(channel_.get(), &record, sizeof record);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof record)) return true;
  if (!lost_ && record != kGoodbye) {
    const int err = n < 0 ? errno : EAGAIN;
    try {
      say(errno_message("cannot reach the launcher's guardian (pid " + std::to_string(pid_) + ")", err) +
          "; if braid-launch is killed, processes its ranks started may keep running");
    } catch (...) {
      // Called from destructors: never throw.
    }
  }
  lost_ = true;
  return false;
}

// Bounded: a guardian stopped with SIGSTOP does not read its goodbye, and
// must not keep the launcher from exiting.
void Guardian::reap() noexcept {
  const auto give_up = Clock::now() + kGoodbyeTime;
  while (waitpid(pid_, nullptr, WNOHANG) == 0) {
    if (Clock::now() >= give_up) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
}

}  // namespace braid::launcher
