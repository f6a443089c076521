// A run's hold on its checkpoint directory (DirectoryHold, DirectoryLock,
// through_hold) and the error text of corrupt files (printable). The
// atomic writes themselves (AtomicFile, write_file_atomically,
// sync_directory) are runtime/atomic_file.h's, shared with braid-bench.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "runtime/atomic_file.h"

namespace braid::trainer {

// A directory this process reaches through a descriptor of its own
// (O_PATH) rather than by its name, whatever the name comes to mean: rank
// 0's in its DirectoryLock, each other rank's taken where it checks that it
// sees rank 0's directory (braid-train). Saves into `dir` go through it while
// it lives (through_hold).
class DirectoryHold {
 public:
  // Null where `dir` cannot be opened or /proc/self/fd does not reach it:
  // the run then saves by name.
  static std::unique_ptr<DirectoryHold> open(const std::filesystem::path& dir);
  ~DirectoryHold();
  DirectoryHold(const DirectoryHold&) = delete;
  DirectoryHold& operator=(const DirectoryHold&) = delete;

  // /proc/self/fd/N: the directory held.
  std::filesystem::path path() const;
  const std::filesystem::path& dir() const { return dir_; }

  // The directory this process holds as `dir` (path()), or empty.
  static std::filesystem::path held(const std::filesystem::path& dir);
  // Whether `dir` still names the directory this process holds as `dir`
  // (true where it holds none).
  static bool still_named(const std::filesystem::path& dir);
  // `text` with the path of every hold (/proc/self/fd/N) written as the
  // directory's name, for messages (through_hold does it for errors).
  static std::string named(std::string text);

 private:
  friend class DirectoryLock;
  // Takes `fd` (an O_PATH of `dir`); closes it and returns null where /proc
  // does not reach it.
  static std::unique_ptr<DirectoryHold> adopt(int fd, std::filesystem::path dir);
  DirectoryHold(int fd, std::filesystem::path dir);
  int fd_;
  std::filesystem::path dir_;
};

// A run's hold on its checkpoint directory, for as long as the run lives:
// an flock on DIR/.braid-train.lock, which names the holder. Two runs
// writing one directory at once staged a step in one place and published
// the shards of both as one step, which then loaded without a word. take()
// creates the directory if need be; another process's hold makes it throw
// InvalidUsage naming that holder. Where the file system has no flock (some
// NFS) or the lock file cannot be made, it warns and returns null: the run
// goes on unguarded (a directory that cannot be written is refused later,
// with the reason). It holds the directory itself too (DirectoryHold).
class DirectoryLock {
 public:
  static std::unique_ptr<DirectoryLock> take(const std::filesystem::path& dir, const std::string& holder);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  // Before each save. A directory removed (or its lock file) while the run
  // held it was made again by the next save, unheld: a second run could
  // then take it and both wrote their steps there. When the lock file this
  // run holds is no longer DIR/.braid-train.lock, takes the directory again
  // as take() does, warning that the steps saved there before are gone, and
  // returns true; or throws InvalidUsage naming the run that holds it now.
  bool reclaim();
  // False once taking the directory again could not make the lock file:
  // the run goes on unguarded, saving by name.
  bool guarded() const { return fd_ >= 0; }
  // What DIR/.braid-train.lock says while this run holds it (a line
  // naming the run), and its path.
  std::string text() const { return holder_ + "\n"; }
  static std::filesystem::path path_in(const std::filesystem::path& dir) { return dir / ".braid-train.lock"; }
  // For a run that failed or saved nothing: where the directory still
  // holds this run's lock file and nothing else, removes the lock file if
  // take() made it, and the directories take() made. A refused
  // run (a typo in a flag, a missing --data file) left a new, empty
  // checkpoint directory behind, holding only its lock.
  void abandon();

 private:
  DirectoryLock(int fd, std::unique_ptr<DirectoryHold> hold, std::filesystem::path dir, std::string holder);
  int fd_;
  std::unique_ptr<DirectoryHold> hold_;  // null where /proc does not reach the directory
  std::filesystem::path dir_;
  std::string holder_;
  std::filesystem::path made_;  // the outermost directory take() made; empty where `dir_` was there
  bool lock_made_ = false;      // take() made the lock file (an earlier run's stays)
};

// Runs a save into `dir` as save(at), `at` being the path through which
// this process reaches it: the directory it holds (DirectoryHold::held),
// first checked to be what `dir` still names, or `dir` itself. The save's
// staging, its publishing and its clean-up after a failure then stay in
// the run's own directory even where `dir` is renamed away or replaced by
// another run's during the save: by name they wiped that run's staging of
// the same step, put this run's `latest` there and pruned its steps. Errors
// and the path returned name `dir`.
std::filesystem::path through_hold(const std::filesystem::path& dir,
                                   const std::function<std::filesystem::path(const std::filesystem::path&)>& save);

// `text` (a parser's message, which quotes the bytes it read last) with
// every byte outside printable ASCII written \xHH: a corrupt file's binary
// went to the terminal in its error (a review helper's case).
std::string printable(std::string_view text);

}  // namespace braid::trainer
