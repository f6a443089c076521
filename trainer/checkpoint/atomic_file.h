// Writing a file so that readers see the old file or the complete new one,
// never a torn one: write a temporary file in the same directory, fsync it,
// rename it over the target, fsync the directory (so the rename survives a
// crash). If anything fails before commit(), the temporary file is removed
// and the target is untouched. The file gets 0666 less the umask, as
// open(2) would give it (mkstemp's own 0600 would hide checkpoints from
// colleagues).
#pragma once

#include <filesystem>
#include <span>
#include <string>

namespace braid::trainer {

class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary file unless committed

  void write(const void* data, std::size_t bytes);
  void commit();

 private:
  std::filesystem::path target_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `bytes` to `target` atomically (AtomicFile).
void write_file_atomically(const std::filesystem::path& target, std::string_view bytes);

// fsync of a directory, after renames inside it.
void sync_directory(const std::filesystem::path& dir);

}  // namespace braid::trainer
