// Registered memory for the buffers a data-parallel strategy's collectives
// run on (DESIGN.md "Registered regions", issue 14).
//
// comm::Communicator::allocate hands out host memory that the ranks of one
// host map into each other through the shm transport. An all-reduce of at
// least 64 KiB whose send and receive buffers come from there on every rank
// runs the direct algorithm (comm/algorithms/select.cc): each rank reduces
// its chunk straight out of its peers' buffers into theirs, no ring through
// the transport. So DDP's gradient buffer comes from there. So do ZeRO's
// buffers (full gradients and parameters of stages 1 and 2, the gradient
// and parameter shards, the staging and gather buffers): select.cc gives
// host reduce_scatter and all_gather the ring whether or not their buffers
// are registered, unless the communicator's config forces algo "direct",
// which then runs every ZeRO collective directly.
//
// The ranks must agree. A rank whose buffers are registered takes the
// direct collective and one whose are not the ring; the direct algorithm
// then fails both with a header mismatch (never wrong data). The policy
// (CPU buffers, more than one rank, shm to every peer) comes out the same
// on every rank; only a registered allocation that fails on some rank could
// split them, so a strategy agrees on its persistent buffers once, at
// construction (agree()). Pooled buffers allocated later (ZeRO's staging
// and gather buffers) fall back on their own rank only, with a warning: by
// default their collectives do not depend on registration; under a forced
// "direct" such a fallback fails the run by name.
#pragma once

#include <functional>
#include <initializer_list>

#include "comm/communicator.h"
#include "trainer/model/flat_buffer.h"

namespace braid::trainer {

// comm::Communicator::allocate / deallocate.
RegisteredMemory communicator_memory();

class CommMemory {
 public:
  // Registers when `device` is the CPU and every peer of `comm` (more than
  // one rank) is reached through shm, the transport that maps
  // Communicator::allocate's memory. `memory` is where registered buffers
  // come from (another allocator only in tests).
  CommMemory(comm::Communicator* comm, Device device, RegisteredMemory memory = communicator_memory());

  bool registers() const { return registers_; }
  // `count` floats of `category`: registered memory when registers() (the
  // backend's, with a warning, when that allocation fails), else the
  // backend's.
  FlatBuffer allocate(std::size_t count, MemoryCategory category, MemoryAccount* account) const;
  // allocate() as a model's ModelStorage takes it (this CommMemory must outlive the model's construction).
  std::function<FlatBuffer(std::size_t, MemoryCategory, MemoryAccount*)> allocator() const {
    return [this](std::size_t count, MemoryCategory category, MemoryAccount* account) {
      return allocate(count, category, account);
    };
  }
  // Collective over the communicator when registers(), after every rank
  // has allocated the same persistent buffers: keeps them registered only
  // when every rank's are, else moves this rank's into backend memory.
  // Returns whether they stay registered.
  bool agree(std::initializer_list<FlatBuffer*> buffers);

 private:
  comm::Communicator* comm_;
  Device device_;
  RegisteredMemory memory_;
  bool registers_ = false;
};

}  // namespace braid::trainer
