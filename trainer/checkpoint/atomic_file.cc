#include "trainer/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/errors.h"

namespace braid::trainer {

namespace fs = std::filesystem;

namespace {

// The process's umask, read without changing it (umask(2) sets it, which
// would race with other threads creating files): Linux reports it in
// /proc/self/status; elsewhere the conservative 022.
mode_t current_umask() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  }
  return 022;
}

}  // namespace

AtomicFile::AtomicFile(fs::path target) : target_(std::move(target)) {
  fs::path dir = target_.parent_path().empty() ? fs::path(".") : target_.parent_path();
  std::string pattern = (dir / ("." + target_.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) throw SystemError(errno_message("cannot create a temporary file next to " + target_.string(), errno));
  temp_ = name.data();
  // mkstemp makes 0600; the file gets the mode open(2) would give it.
  if (::fchmod(fd_, 0666 & ~current_umask()) != 0) {
    const int err = errno;
    ::close(fd_);  // the destructor does not run for a constructor that throws
    ::unlink(temp_.c_str());
    throw SystemError(errno_message("setting the mode of " + temp_, err));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SystemError(errno_message("writing " + target_.string() + " (via " + temp_ + ")", errno));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) throw SystemError(errno_message("fsync of " + temp_, errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw SystemError(errno_message("closing " + temp_, errno));
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    throw SystemError(errno_message("renaming " + temp_ + " to " + target_.string(), errno));
  }
  committed_ = true;
  sync_directory(target_.parent_path().empty() ? fs::path(".") : target_.parent_path());
}

void write_file_atomically(const fs::path& target, std::string_view bytes) {
  AtomicFile file(target);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

void sync_directory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw SystemError(errno_message("opening directory " + dir.string() + " to fsync it", errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw SystemError(errno_message("fsync of directory " + dir.string(), err));
}

}  // namespace braid::trainer
