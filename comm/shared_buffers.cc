#include "comm/shared_buffers.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/errors.h"

namespace braid::comm::shared_buffers {
namespace {

struct Allocation {
  int fd = -1;
  std::size_t bytes = 0;
  std::uint64_t id = 0;
};

struct Mapped {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t id = 0;
};

std::mutex mu;
std::map<const std::byte*, Allocation> allocations;             // by base address
std::map<std::pair<std::int32_t, std::int32_t>, Mapped> mapped;  // peers' memfds, by (pid, fd)

std::string errno_text(const std::string& what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

void* allocate(std::size_t bytes) {
  constexpr std::size_t kAlign = 2u << 20;
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  const int fd = static_cast<int>(syscall(SYS_memfd_create, "braid-shared-buffer", 1u /* MFD_CLOEXEC */));
  if (fd < 0) throw SystemError(errno_text("memfd_create for a shared buffer"));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const std::string why = errno_text("ftruncate of a shared buffer to " + std::to_string(size) + " bytes");
    close(fd);
    throw SystemError(why);
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = errno_text("mmap of a shared buffer");
    close(fd);
    throw SystemError(why);
  }
  struct stat st {};
  fstat(fd, &st);
  std::lock_guard lock(mu);
  allocations[static_cast<const std::byte*>(base)] = {fd, size, static_cast<std::uint64_t>(st.st_ino)};
  return base;
}

void release(void* pointer) {
  std::lock_guard lock(mu);
  auto it = allocations.find(static_cast<const std::byte*>(pointer));
  if (it == allocations.end()) throw InvalidUsage("release() of a pointer that allocate() did not return");
  munmap(pointer, it->second.bytes);
  close(it->second.fd);
  allocations.erase(it);
}

bool find(const void* pointer, std::size_t bytes, SharedBufferRef& ref) {
  if (pointer == nullptr) return false;
  const auto* p = static_cast<const std::byte*>(pointer);
  std::lock_guard lock(mu);
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return false;
  --it;
  const std::size_t offset = static_cast<std::size_t>(p - it->first);
  if (offset + bytes > it->second.bytes) return false;
  ref = {static_cast<std::int32_t>(getpid()), it->second.fd, it->second.id, offset};
  return true;
}

std::byte* map(const SharedBufferRef& ref, std::size_t bytes) {
  std::lock_guard lock(mu);
  const auto key = std::make_pair(ref.pid, ref.fd);
  auto it = mapped.find(key);
  if (it == mapped.end() || it->second.id != ref.id || it->second.bytes < ref.offset + bytes) {
    if (it != mapped.end()) {  // another allocation behind a reused fd number: map it afresh
      munmap(it->second.base, it->second.bytes);
      mapped.erase(it);
    }
    const std::string whose = "the shared buffer of process " + std::to_string(ref.pid);
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, ref.pid, 0));
    if (pidfd < 0) throw SystemError(errno_text("pidfd_open for " + whose + " (has it exited?)"));
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, ref.fd, 0));
    close(pidfd);
    if (fd < 0) throw SystemError(errno_text("pidfd_getfd of " + whose + " (ptrace rules must allow it)"));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      close(fd);
      throw SystemError(errno_text("fstat of " + whose));
    }
    if (static_cast<std::uint64_t>(st.st_ino) != ref.id) {
      close(fd);
      throw SystemError(whose + " was freed while this rank was mapping it");
    }
    const auto size = static_cast<std::size_t>(st.st_size);
    void* base = size >= ref.offset + bytes ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                                            : MAP_FAILED;
    close(fd);
    if (base == MAP_FAILED)
      throw SystemError("cannot map " + whose + " (" + std::to_string(size) + " bytes, need " +
                        std::to_string(ref.offset + bytes) + ")");
    it = mapped.emplace(key, Mapped{static_cast<std::byte*>(base), size, ref.id}).first;
  }
  return it->second.base + ref.offset;
}

}  // namespace braid::comm::shared_buffers
