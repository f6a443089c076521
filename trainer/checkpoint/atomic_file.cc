#include "trainer/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "runtime/errors.h"

namespace braid::trainer {

namespace fs = std::filesystem;

namespace {

// The temporary files of AtomicFiles (".NAME.tmp.XXXXXX") in the top of a
// checkpoint directory, left by a run killed mid-write (`.latest.tmp.*`):
// the run that now holds the directory writes no other, so they are stale.
void remove_stale_temporaries(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::size_t mark = name.rfind(".tmp.");
    if (name.size() < 2 || name[0] != '.' || mark == std::string::npos || mark == 0 || name.size() - mark != 11 ||
        !entry.is_regular_file(ec))
      continue;
    std::error_code ignored;
    if (fs::remove(entry.path(), ignored)) spdlog::debug("removed {}, left by a write that never finished", name);
  }
}

// The directories this process holds (DirectoryHold::held).
std::mutex held_mutex;
std::vector<const DirectoryHold*> holds;

// "ckpt/" and "ckpt" name one directory.
std::string directory_key(const fs::path& dir) {
  std::string key = dir.lexically_normal().string();
  while (key.size() > 1 && key.back() == '/') key.pop_back();
  return key;
}

// Whether two stat results are of one file or directory.
bool same_node(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// `text` with the hold's path `from` (/proc/self/fd/N) written `to`, where
// it is that path and not the start of another's (fd 31's, not fd 3's).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
    const std::size_t end = at + from.size();
    if (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) {
      at = end;
      continue;
    }
    text.replace(at, from.size(), to);
    at += to.size();
  }
  return text;
}

// The exception in flight, with `from` in its message named `to`, of the
// same braid type (the exit code and the callers' catches go by it).
[[noreturn]] void rethrow_renamed(const std::string& from, const std::string& to) {
  try {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.find(from) == std::string::npos) throw;
    const std::string text = replaced(what, from, to);
    if (const auto* remote = dynamic_cast<const RemoteError*>(&e)) throw RemoteError(text, remote->peer());
    if (dynamic_cast<const InvalidUsage*>(&e)) throw InvalidUsage(text);
    if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(text);
    if (dynamic_cast<const AbortedError*>(&e)) throw AbortedError(text);
    throw SystemError(text);
  }
}

}  // namespace

DirectoryHold::DirectoryHold(int fd, fs::path dir) : fd_(fd), dir_(std::move(dir)) {
  std::lock_guard<std::mutex> lock(held_mutex);
  holds.push_back(this);
}

DirectoryHold::~DirectoryHold() {
  {
    std::lock_guard<std::mutex> lock(held_mutex);
    std::erase(holds, this);
  }
  ::close(fd_);
}

std::unique_ptr<DirectoryHold> DirectoryHold::adopt(int fd, fs::path dir) {
  struct stat by_fd {}, by_proc {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::fstat(fd, &by_fd) == 0 && ::stat(path.c_str(), &by_proc) == 0 && same_node(by_fd, by_proc))
    return std::unique_ptr<DirectoryHold>(new DirectoryHold(fd, std::move(dir)));
  spdlog::debug("{} does not reach the checkpoint directory {}; it is saved to by name", path, dir.string());
  ::close(fd);
  return nullptr;
}

std::unique_ptr<DirectoryHold> DirectoryHold::open(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  return adopt(fd, dir);
}

fs::path DirectoryHold::path() const { return "/proc/self/fd/" + std::to_string(fd_); }

fs::path DirectoryHold::held(const fs::path& dir) {
  const std::string key = directory_key(dir);
  std::lock_guard<std::mutex> lock(held_mutex);
  for (const DirectoryHold* h : holds)
    if (directory_key(h->dir_) == key) return h->path();
  return {};
}

std::string DirectoryHold::named(std::string text) {
  std::lock_guard<std::mutex> lock(held_mutex);
  for (const DirectoryHold* h : holds) text = replaced(text, h->path().string(), h->dir_.string());
  return text;
}

DirectoryLock::DirectoryLock(int fd, std::unique_ptr<DirectoryHold> hold, fs::path dir, std::string holder)
    : fd_(fd), hold_(std::move(hold)), dir_(std::move(dir)), holder_(std::move(holder)) {}

bool DirectoryHold::still_named(const fs::path& dir) {
  const fs::path held = DirectoryHold::held(dir);
  struct stat named {}, holds {};
  return held.empty() ||
         (::stat(dir.c_str(), &named) == 0 && ::stat(held.c_str(), &holds) == 0 && same_node(named, holds));
}

fs::path through_hold(const fs::path& dir, const std::function<fs::path(const fs::path&)>& save) {
  const fs::path held = DirectoryHold::held(dir);
  if (held.empty()) return save(dir);
  if (!DirectoryHold::still_named(dir))
    throw SystemError(dir.string() + " is no longer the directory this run holds (it was removed, renamed or "
                      "replaced since the run checked its hold, and may be another run's now); nothing is saved "
                      "there");
  try {
    return dir / save(held).lexically_relative(held);
  } catch (...) {
    rethrow_renamed(held.string(), dir.string());
  }
}

namespace {
// "ck/" and "a/./ck" as "ck" and "a/ck": the form in which take() and
// abandon() walk up a directory's parents.
fs::path without_trailing_slash(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}
}  // namespace

std::unique_ptr<DirectoryLock> DirectoryLock::take(const fs::path& dir, const std::string& holder) {
  std::error_code ec;
  fs::path missing;  // the outermost of `dir` and its parents not there yet
  for (fs::path p = without_trailing_slash(dir); !p.empty() && p.has_filename() && !fs::exists(p, ec);
       p = p.parent_path())
    missing = p;
  fs::create_directories(dir, ec);
  // A file where the directory should be is refused, saying so, by the
  // trainer's own check: warning here first that a lock file could not be
  // made only confused that.
  if (!fs::is_directory(dir, ec)) return nullptr;
  // So is a directory this process cannot write (a read-only file system,
  // another user's), which cannot hold checkpoints either.
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return nullptr;
  const fs::path path = dir / ".braid-train.lock";
  // The lock file is opened in the directory held, so that the two are one
  // directory whatever renames it meanwhile.
  const int dir_fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  // Made here, or an earlier run's (which abandon() leaves).
  int fd = dir_fd < 0 ? -1 : ::openat(dir_fd, ".braid-train.lock", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  const bool lock_made = fd >= 0;
  if (fd < 0 && dir_fd >= 0 && errno == EEXIST)
    fd = ::openat(dir_fd, ".braid-train.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    spdlog::warn("cannot create {} ({}): another run writing checkpoints into {} at the same time goes unnoticed",
                 path.string(), std::strerror(errno), dir.string());
    if (dir_fd >= 0) ::close(dir_fd);
    return nullptr;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(dir_fd);
    if (err == EWOULDBLOCK) {
      char text[512] = {};
      const ssize_t got = ::pread(fd, text, sizeof text - 1, 0);
      ::close(fd);
      std::string held(text, got > 0 ? static_cast<std::size_t>(got) : 0);
      while (!held.empty() && (held.back() == '\n' || held.back() == '\0')) held.pop_back();
      throw InvalidUsage("--checkpoint-dir " + dir.string() + " is in use by another run (" +
                         (held.empty() ? std::string("holder unknown") : held) +
                         "): two runs writing one directory mix their checkpoints; wait for that run to end, "
                         "or pass another --checkpoint-dir");
    }
    ::close(fd);
    spdlog::warn("cannot lock {} ({}): another run writing checkpoints into {} at the same time goes unnoticed",
                 path.string(), std::strerror(err), dir.string());
    return nullptr;
  }
  remove_stale_temporaries(dir);
  const std::string text = holder + "\n";
  // Synced: the other ranks read it before training (braid-train's check
  // that they share the directory), and on NFS the text would stay in this
  // node's cache until written back, leaving them an empty file.
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) ||
      ::fsync(fd) != 0)
    spdlog::debug("cannot record the holder in {}: {}", path.string(), std::strerror(errno));
  std::unique_ptr<DirectoryLock> lock(new DirectoryLock(fd, DirectoryHold::adopt(dir_fd, dir), dir, holder));
  lock->made_ = std::move(missing);
  lock->lock_made_ = lock_made;
  return lock;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);
}

void DirectoryLock::abandon() {
  if ((made_.empty() && !lock_made_) || fd_ < 0) return;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, ec))
    if (entry.path().filename() != ".braid-train.lock") return;  // a step, a shard: the run wrote there
  if (ec) return;
  // Still this run's lock file: the directory may have been replaced by
  // another run's meanwhile, holding that run's lock file alone.
  struct stat held {}, named {};
  if (::fstat(fd_, &held) != 0 || ::stat(path_in(dir_).c_str(), &named) != 0 || !same_node(held, named)) return;
  // Unlinked while still locked: a second run that opened the file meanwhile
  // is refused by the lock; one that comes after finds no directory, or
  // makes its own, which the rmdir below then leaves alone.
  if (::unlink(path_in(dir_).c_str()) != 0) return;
  lock_made_ = false;
  // A directory that was there stays, as it was: a refused run left its
  // lock file, naming a process long gone (a review helper's case).
  if (made_.empty()) return;
  for (fs::path p = without_trailing_slash(dir_); !p.empty() && p.has_filename(); p = p.parent_path()) {
    if (::rmdir(p.c_str()) != 0 || p == made_) break;
  }
  made_.clear();
}

bool DirectoryLock::reclaim() {
  if (fd_ < 0) return false;  // taking it again failed once, and said so
  struct stat held {}, named {};
  const fs::path path = dir_ / ".braid-train.lock";
  if (::fstat(fd_, &held) == 0 && ::stat(path.c_str(), &named) == 0 && same_node(held, named)) return false;
  std::unique_ptr<DirectoryLock> again = take(dir_, holder_);  // throws when another run holds it
  spdlog::warn("--checkpoint-dir {} lost this run's hold: the directory or its lock file was removed (steps saved "
               "there before may be gone with it); {}",
               dir_.string(), again ? "holding it again" : "it goes on unguarded (see above)");
  ::close(fd_);
  fd_ = -1;
  hold_.reset();
  if (again) {
    std::swap(fd_, again->fd_);
    std::swap(hold_, again->hold_);
  }
  return true;
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", byte);
      out += hex;
    }
  }
  return out;
}

}  // namespace braid::trainer
