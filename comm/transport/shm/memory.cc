#include "comm/transport/shm/memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "comm/resources.h"
#include "runtime/errors.h"

namespace braid::comm::shm {

namespace {

std::string shm_space() {
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0) return "/dev/shm cannot be inspected";
  return "/dev/shm has " + std::to_string(std::uint64_t(fs.f_bavail) * fs.f_frsize) + " bytes free of " +
         std::to_string(std::uint64_t(fs.f_blocks) * fs.f_frsize);
}

Mapping map_fd(int fd, const std::string& name, std::size_t bytes, const char* whose) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED)
    throw SystemError(errno_message(std::string("mapping ") + whose + "shared memory " + name, err));
  return Mapping::adopt(static_cast<std::byte*>(p), bytes);
}

}  // namespace

Mapping Mapping::adopt(std::byte* data, std::size_t bytes) {
  Mapping m;
  m.data_ = data;
  m.bytes_ = bytes;
  return m;
}

// The pages are reserved here, not at first touch: a tmpfs file sized by
// ftruncate alone is sparse, and with /dev/shm short the first write to a
// page that cannot be had kills the process with SIGBUS in the middle of a
// collective. posix_fallocate returns its error rather than setting errno.
Mapping Mapping::create(const std::string& name, std::size_t bytes, const std::string& purpose) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    int err = errno;
    throw SystemError(errno_message("creating shared memory " + name, err) + fd_limit_hint(err));
  }
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    throw SystemError(purpose + " needs " + std::to_string(bytes) + " bytes of shared memory (" + name +
                      "), but reserving them failed (" + std::strerror(err) + "): " + shm_space() +
                      ". Make /dev/shm larger (mount -o remount,size=... /dev/shm; docker run --shm-size), "
                      "set BRAID_SHM_RING_BYTES or BRAID_SHM_HOST_BYTES smaller, or set BRAID_TRANSPORT=tcp");
  }
  try {
    return map_fd(fd, name, bytes, "");
  } catch (const SystemError&) {
    shm_unlink(name.c_str());
    throw;
  }
}

Mapping Mapping::open(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    int err = errno;
    throw SystemError(errno_message("opening a peer's shared memory " + name, err) + fd_limit_hint(err));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    close(fd);
    throw RemoteError("a peer's shared memory " + name + " has " + std::to_string(st.st_size) +
                      " bytes, expected " + std::to_string(bytes) +
                      "; do all ranks use the same BRAID_SHM_* settings?");
  }
  return map_fd(fd, name, bytes, "a peer's ");
}

Mapping::Mapping(Mapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (data_) munmap(data_, bytes_);
}

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000), static_cast<long>(timeout.count() % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace braid::comm::shm
