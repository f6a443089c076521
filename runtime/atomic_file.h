// Writing a file so that readers see the old file or the complete new one,
// never a torn one: write a temporary file in the same directory, fsync it,
// rename it over the target, fsync the directory (so the rename survives a
// crash). If anything fails before commit(), the temporary file is removed
// and the target is untouched. Used by the trainer's checkpoints and by
// braid-bench's --json/--csv.
//
// The file ends as open(2) with O_TRUNC would leave it: a new file gets
// 0666 less the umask (mkstemp's own 0600 would hide checkpoints from
// colleagues), a file replaced keeps its permissions, and a symbolic link to
// a regular file stays a link, its target replaced.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace braid {

// What a long write shows another thread (the sharded saves,
// trainer/train/write_together.h): the bytes on disk so far, and a request
// to give up. A file written with one is written `chunk` bytes at a time,
// each counted once the disk has taken it (sync_file_range), so that the
// count moves as the disk does; page-cache writes would count gigabytes at
// once and leave the whole wait in the final fsync.
struct WriteProgress {
  std::atomic<std::uint64_t> bytes{0};  // on disk so far
  std::atomic<bool> cancel{false};      // set by the other thread: the write throws before its next chunk
  std::size_t chunk = std::size_t{64} << 20;
  // Set by the writer once what it wrote is in place (a checkpoint step
  // published, `latest` naming it): what it does after, removing what the
  // new files replace, loses nothing if it stalls. `removed` counts the
  // files and directories gone since, so a slow removal is not a stuck one.
  std::atomic<bool> published{false};
  std::atomic<std::uint64_t> removed{0};
};

class AtomicFile {
 public:
  // Creates the temporary file; throws InvalidUsage where `target` is not a
  // regular file (require_file_target), SystemError where its directory
  // cannot take the temporary file.
  explicit AtomicFile(std::filesystem::path target, WriteProgress* progress = nullptr);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary file unless committed

  void write(const void* data, std::size_t bytes);
  void commit();

 private:
  std::filesystem::path target_;  // a link's target where the path named a link
  std::string temp_;
  void chunk_written(std::size_t chunk);

  WriteProgress* progress_ = nullptr;
  std::uint64_t offset_ = 0;   // bytes written
  std::uint64_t counted_ = 0;  // of which counted in progress_
  int fd_ = -1;
  bool committed_ = false;
};

// Throws InvalidUsage when `target` exists and is not a regular file (a
// directory, a device such as /dev/null, a FIFO, a socket): renaming over
// it would replace the node itself, which as root broke the machine's
// /dev/null. `what` names the target in the message ("--out").
void require_file_target(const std::filesystem::path& target, const std::string& what);

// "a directory", "a FIFO", ... for a st_mode that is not a regular file's.
const char* file_kind(unsigned mode);

// Writes `bytes` to `target` atomically (AtomicFile).
void write_file_atomically(const std::filesystem::path& target, std::string_view bytes);

// fsync of a directory, after renames inside it.
void sync_directory(const std::filesystem::path& dir);

}  // namespace braid
