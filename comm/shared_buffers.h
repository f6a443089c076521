// Host buffers that the ranks of one host can map into each other
// (Communicator::allocate): anonymous shared memory (memfd), handed to a
// peer as (pid, fd) and opened there with pidfd_getfd, so nothing is ever
// named in /dev/shm and nothing is left behind when a process dies.
//
// A collective whose buffers all lie in such memory on every rank of one
// host can skip the transport rings: each rank reads its peers' inputs and
// writes their outputs directly (algorithms/all_reduce_direct.cc), every
// byte read once and written once, as MPI's shared-memory windows and
// NCCL's registered buffers allow.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace braid::comm {

// Where a registered buffer lives, as a peer needs it to map the buffer.
struct SharedBufferRef {
  std::int32_t pid = 0;  // the owning process
  std::int32_t fd = -1;  // its memfd there
  std::uint64_t id = 0;  // the memfd's inode: tells a reused fd number from the allocation it had
  std::uint64_t offset = 0;
};

namespace shared_buffers {

// Zeroed, 2 MiB-aligned within its memfd; throws SystemError when memory runs out.
void* allocate(std::size_t bytes);
// Frees an allocation; InvalidUsage for a pointer allocate() did not return.
void release(void* pointer);
// Whether [pointer, pointer + bytes) lies in one allocation of this process;
// fills `ref` if so.
bool find(const void* pointer, std::size_t bytes, SharedBufferRef& ref);
// A peer's buffer mapped into this process (cached per (pid, fd)); throws
// SystemError naming the peer's pid when it cannot be opened (the peer is
// gone, or ptrace rules forbid pidfd_getfd).
std::byte* map(const SharedBufferRef& ref, std::size_t bytes);

}  // namespace shared_buffers
}  // namespace braid::comm
