#include "runtime/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/errors.h"

namespace braid {

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

const char* file_kind(unsigned mode) {
  return S_ISDIR(mode)    ? "a directory"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISSOCK(mode) ? "a socket"
                          : "not a regular file";
}

void require_file_target(const fs::path& target, const std::string& what) {
  struct stat info {};
  if (::stat(target.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return;
  throw InvalidUsage(what + " " + target.string() + " is " + file_kind(info.st_mode) +
                     "; it is written as a new file put in its place, so name a regular file (or a new one)");
}

// Where a write to `target` lands: `target`, or where the symbolic links it
// names lead (a link's own directory is not resolved: a path through
// /proc/self/fd/N stays one, see trainer/checkpoint/atomic_file.h's
// through_hold). A link that leads nowhere yet is followed too, as open(2)
// would create its target.
fs::path followed(fs::path target) {
  for (int hops = 0;; ++hops) {
    struct stat info {};
    if (::lstat(target.c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) return target;
    if (hops == 40) throw SystemError(errno_message("following the links of " + target.string(), ELOOP));
    std::error_code ec;
    const fs::path next = fs::read_symlink(target, ec);
    if (ec) throw SystemError(errno_message("reading the link " + target.string(), ec.value()));
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
}

AtomicFile::AtomicFile(fs::path target, WriteProgress* progress) : progress_(progress) {
  require_file_target(target, "the file to write,");
  target_ = followed(std::move(target));
  fs::path dir = target_.parent_path().empty() ? fs::path(".") : target_.parent_path();
  std::string pattern = (dir / ("." + target_.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) throw SystemError(errno_message("cannot create a temporary file next to " + target_.string(), errno));
  temp_ = name.data();
  // mkstemp makes 0600; the file gets the mode open(2) would leave: the
  // replaced file's, or 0666 less the umask.
  struct stat old {};
  const mode_t mode = ::stat(target_.c_str(), &old) == 0 ? old.st_mode & 07777 : 0666 & ~current_umask();
  if (::fchmod(fd_, mode) != 0) {
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
  const std::size_t chunk = progress_ ? std::max<std::size_t>(progress_->chunk, 1) : 0;
  while (bytes > 0) {
    if (progress_ && progress_->cancel.load(std::memory_order_relaxed)) {
      throw SystemError("writing " + target_.string() + " was given up: the save failed elsewhere");
    }
    // With progress, up to the end of the current chunk.
    const std::size_t piece = chunk ? std::min(bytes, chunk - offset_ % chunk) : bytes;
    for (std::size_t left = piece; left > 0;) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw SystemError(errno_message("writing " + target_.string() + " (via " + temp_ + ")", errno));
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    bytes -= piece;
    offset_ += piece;
    if (chunk && offset_ % chunk == 0) chunk_written(chunk);
  }
}

// With progress, once a whole chunk is written: starts the disk on it and
// waits for the one before, which then counts. Writing one chunk while the
// disk takes the previous keeps the pace of a single fsync at the end (a
// sync per chunk halved it on this machine's disk), and the count moves as
// the disk does. commit()'s fsync counts the rest.
void AtomicFile::chunk_written(std::size_t chunk) {
  const off_t start = static_cast<off_t>(offset_ - chunk);
  auto check = [&](int rc, const char* what) {
    if (rc != 0) throw SystemError(errno_message(std::string(what) + " of " + temp_, errno));
  };
  if (::sync_file_range(fd_, start, static_cast<off_t>(chunk), SYNC_FILE_RANGE_WRITE) != 0) {
    check(::fdatasync(fd_), "fdatasync");  // a file system without it: a sync per chunk
    progress_->bytes.fetch_add(offset_ - counted_, std::memory_order_relaxed);
    counted_ = offset_;
    return;
  }
  if (static_cast<std::uint64_t>(start) > counted_) {
    check(::sync_file_range(fd_, static_cast<off_t>(counted_), start - static_cast<off_t>(counted_),
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER),
          "sync_file_range");
    progress_->bytes.fetch_add(static_cast<std::uint64_t>(start) - counted_, std::memory_order_relaxed);
    counted_ = static_cast<std::uint64_t>(start);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) throw SystemError(errno_message("fsync of " + temp_, errno));
  if (progress_) {
    progress_->bytes.fetch_add(offset_ - counted_, std::memory_order_relaxed);
    counted_ = offset_;
  }
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

}  // namespace braid
