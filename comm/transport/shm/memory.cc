#include "comm/transport/shm/memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "runtime/errors.h"

namespace braid::comm::shm {

Mapping Mapping::create(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw SystemError(errno_message("creating shared memory " + name, errno));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw SystemError(errno_message("sizing shared memory " + name + " to " + std::to_string(bytes) +
                                        " bytes (is /dev/shm full?)", err));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw SystemError(errno_message("mapping shared memory " + name, err));
  }
  Mapping m;
  m.data_ = static_cast<std::byte*>(p);
  m.bytes_ = bytes;
  return m;
}

Mapping Mapping::open(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw SystemError(errno_message("opening a peer's shared memory " + name, errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    close(fd);
    throw RemoteError("a peer's shared memory " + name + " has " + std::to_string(st.st_size) +
                      " bytes, expected " + std::to_string(bytes) +
                      "; do all ranks use the same BRAID_SHM_* settings?");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) throw SystemError(errno_message("mapping a peer's shared memory " + name, err));
  Mapping m;
  m.data_ = static_cast<std::byte*>(p);
  m.bytes_ = bytes;
  return m;
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
