#include "comm/transport/shm/memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
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
    const std::string hint = err != EEXIST ? fd_limit_hint(err)
                                           : " (another job on this host runs with the same BRAID_JOB_TOKEN and "
                                             "BRAID_RUN_ID, or a process of an earlier run of this job still runs "
                                             "or left it (where none does, remove /dev/shm" + name + "); "
                                             "give each job its own)";
    throw SystemError(errno_message("creating shared memory " + name, err) + hint);
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


namespace regions {
namespace {

struct Allocation {
  int fd = -1;
  std::size_t bytes = 0;
  std::uint64_t inode = 0;
};

std::mutex registry_mu;
std::map<const std::byte*, Allocation> allocations;  // this process's, by base address
// Read without the lock: every call asks find(), and most processes never
// register memory.
std::atomic<std::size_t> allocation_count{0};
std::atomic<std::uint64_t> allocations_ever{0};

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

void* allocate(std::size_t bytes) {
  constexpr std::size_t kAlign = 2u << 20;
  // Rounded up past SIZE_MAX it wrapped to 0: "mmap of 0 bytes".
  if (bytes > std::numeric_limits<std::size_t>::max() - kAlign)
    throw SystemError("cannot allocate " + std::to_string(bytes) + " bytes of registered memory: more than the "
                      "address space holds");
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  const int fd = static_cast<int>(syscall(SYS_memfd_create, "braid-region", 1u /* MFD_CLOEXEC */));
  if (fd < 0) throw SystemError(errno_text("memfd_create for registered memory"));
  struct stat st {};
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 || fstat(fd, &st) != 0) {
    const std::string why = errno_text("sizing registered memory of " + std::to_string(size) + " bytes");
    close(fd);
    throw SystemError(why);
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = errno_text("mmap of registered memory of " + std::to_string(size) + " bytes");
    close(fd);
    throw SystemError(why);
  }
  std::lock_guard lock(registry_mu);
  allocations[static_cast<const std::byte*>(base)] = {fd, size, static_cast<std::uint64_t>(st.st_ino)};
  allocation_count.store(allocations.size(), std::memory_order_release);
  allocations_ever.fetch_add(1, std::memory_order_relaxed);
  return base;
}

std::uint64_t allocations_made() { return allocations_ever.load(std::memory_order_relaxed); }

void release(void* pointer) {
  if (pointer == nullptr) return;  // as free() and operator delete
  std::lock_guard lock(registry_mu);
  auto it = allocations.find(static_cast<const std::byte*>(pointer));
  if (it == allocations.end()) throw InvalidUsage("deallocate() of a pointer that allocate() did not return");
  munmap(pointer, it->second.bytes);
  close(it->second.fd);
  allocations.erase(it);
  allocation_count.store(allocations.size(), std::memory_order_release);
}

bool find(const void* pointer, std::size_t bytes, RegionRef& ref) {
  if (pointer == nullptr || allocation_count.load(std::memory_order_acquire) == 0) return false;
  const auto* p = static_cast<const std::byte*>(pointer);
  std::lock_guard lock(registry_mu);
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return false;
  --it;
  const std::size_t offset = static_cast<std::size_t>(p - it->first);
  if (offset + bytes > it->second.bytes) return false;
  ref = {{static_cast<std::uint64_t>(it->second.fd), it->second.inode}, offset, bytes};
  return true;
}

bool extent(const void* pointer, Extent& out) {
  if (pointer == nullptr || allocation_count.load(std::memory_order_acquire) == 0) return false;
  const auto* p = static_cast<const std::byte*>(pointer);
  std::lock_guard lock(registry_mu);
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return false;
  --it;
  if (static_cast<std::size_t>(p - it->first) >= it->second.bytes) return false;
  out = {it->first, it->second.bytes, it->second.inode};
  return true;
}

PeerRegions::~PeerRegions() {
  for (auto& [fd, m] : by_fd_) munmap(m.base, m.bytes);
}

// The owner's deallocate() closes its memfd and tells nobody, while our
// mapping kept its pages alive until the communicator ended: a job that
// allocated and freed 512 MiB a cycle held another 512 MiB of shared memory
// per peer and cycle. A cached mapping whose owner's fd number no longer
// holds its file is dropped. One pidfd_getfd and
// fstat per cached region: done before a new region is mapped, and on a
// hit only when a second has passed since the last look.
void PeerRegions::drop_freed(int pidfd) {
  checked_ = std::chrono::steady_clock::now();
  for (auto it = by_fd_.begin(); it != by_fd_.end();) {
    // Freed: the owner's fd number is closed (EBADF) or holds another file.
    // Any other failure (EMFILE here, the owner gone) proves nothing, and
    // the mapping stays: dropping it failed the next call on live memory.
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, static_cast<int>(it->first), 0));
    const int err = errno;
    struct stat st {};
    const bool held = fd >= 0 ? fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_ino) == it->second.inode
                              : err != EBADF;
    if (fd >= 0) close(fd);
    if (held) {
      ++it;
      continue;
    }
    munmap(it->second.base, it->second.bytes);
    it = by_fd_.erase(it);
  }
}

std::span<std::byte> PeerRegions::map(int pidfd, int peer, const RegionRef& ref) {
  const std::string whose = "the registered memory of rank " + std::to_string(peer);
  auto it = by_fd_.find(ref.key[0]);
  const bool miss = it == by_fd_.end() || it->second.inode != ref.key[1];
  if (!by_fd_.empty() && (miss || std::chrono::steady_clock::now() - checked_ > std::chrono::seconds(1))) {
    drop_freed(pidfd);
    it = by_fd_.find(ref.key[0]);
  }
  if (it == by_fd_.end() || it->second.inode != ref.key[1]) {
    if (it != by_fd_.end()) {  // a reused fd number: another allocation, mapped afresh
      munmap(it->second.base, it->second.bytes);
      by_fd_.erase(it);
    }
    if (ref.key[0] > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
      throw RemoteError("rank " + std::to_string(peer) + " named a region with an impossible key", peer);
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, static_cast<int>(ref.key[0]), 0));
    if (fd < 0) throw SystemError(errno_text("pidfd_getfd of " + whose + " (has it exited? ptrace rules must allow it)"));
    struct stat st {};
    const bool ok = fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_ino) == ref.key[1];
    const auto size = static_cast<std::size_t>(st.st_size);
    void* base = ok ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (!ok) throw RemoteError("rank " + std::to_string(peer) + " named a region it does not hold (freed, or not registered memory)", peer);
    if (base == MAP_FAILED) throw SystemError(errno_text("mmap of " + whose));
    it = by_fd_.emplace(ref.key[0], Mapped{static_cast<std::byte*>(base), size, ref.key[1]}).first;
  }
  if (ref.offset > it->second.bytes || ref.bytes > it->second.bytes - ref.offset)
    throw RemoteError("rank " + std::to_string(peer) + " named bytes [" + std::to_string(ref.offset) + ", +" +
                          std::to_string(ref.bytes) + ") of a region of " + std::to_string(it->second.bytes) +
                          " bytes; a peer's offsets are checked against what it registered",
                      peer);
  return {it->second.base + ref.offset, static_cast<std::size_t>(ref.bytes)};
}

}  // namespace regions

std::string farewell_of(const SegmentHeader& header) {
  const std::uint32_t bytes = header.farewell_bytes.load(std::memory_order_acquire);
  return std::string(header.farewell, std::min<std::size_t>(bytes, sizeof header.farewell));
}

bool has_exited(int pidfd) {
  if (pidfd < 0) return false;
  pollfd pfd{pidfd, POLLIN, 0};
  return ::poll(&pfd, 1, 0) > 0;
}

}  // namespace braid::comm::shm
