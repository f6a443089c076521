// What a communicator costs the process, and the limits it runs into.
//
// Each communicator keeps file descriptors (TCP sockets, pidfds on its shm
// peers), starts threads (its status board, its progress thread) and maps
// shared memory. Set-up checks the descriptors and threads it is about to
// take against the process's limits before it takes any, so that creating
// one communicator too many fails with an error naming the resource, the
// limit and the remedy rather than with a raw EMFILE halfway through. Shared
// memory is reserved where it is created (transport/shm/memory.cc).
#pragma once

#include <string>

namespace braid::comm {

// What set-up is about to take.
struct ResourceNeeds {
  int fds = 0;      // descriptors kept, plus those set-up holds for a while
  int threads = 0;  // threads the communicator starts
};

// Throws SystemError naming this rank, the first resource that `needs`
// exceeds, its limit and what to do.
void check_resources(int rank, const ResourceNeeds& needs);

// The sentence to append to the message of a call that failed with `err`:
// for EMFILE / ENFILE it names the descriptor limit, the descriptors in use
// and the remedy; for EAGAIN from starting a thread, the thread limits;
// empty otherwise.
std::string fd_limit_hint(int err);
std::string thread_limit_hint();

}  // namespace braid::comm
