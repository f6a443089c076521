#include "trainer/strategy/comm_memory.h"

#include <spdlog/spdlog.h>

#include <cstdint>

#include "runtime/errors.h"

namespace braid::trainer {

namespace {

bool every_peer_through_shm(const comm::Communicator& comm) {
  for (int peer = 0; peer < comm.size(); ++peer) {
    if (peer != comm.rank() && comm.transport_of(peer) != "shm") return false;
  }
  return true;
}

}  // namespace

RegisteredMemory communicator_memory() {
  return {&comm::Communicator::allocate, &comm::Communicator::deallocate};
}

CommMemory::CommMemory(comm::Communicator* comm, Device device, RegisteredMemory memory)
    : comm_(comm), device_(device), memory_(memory) {
  registers_ = device == Device::kCpu && comm != nullptr && comm->size() > 1 && every_peer_through_shm(*comm);
}

FlatBuffer CommMemory::allocate(std::size_t count, MemoryCategory category, MemoryAccount* account) const {
  if (registers_) {
    try {
      return FlatBuffer(count, category, account, memory_);
    } catch (const SystemError& e) {
      spdlog::warn("rank {}: {} of {} bytes in ordinary memory, collectives on it run through the transport: {}",
                   comm_->rank(), category_name(category), count * sizeof(float), e.what());
    }
  }
  return FlatBuffer(count, category, account, device_);
}

bool CommMemory::agree(std::initializer_list<FlatBuffer*> buffers) {
  if (!registers_) return false;
  std::int32_t all = 1;
  for (const FlatBuffer* b : buffers) all = all && b->registered();
  comm_->all_reduce(&all, &all, 1, DataType::i32, ReduceOp::min).wait();
  if (all == 0) {
    if (comm_->rank() == 0) {
      spdlog::warn("registered memory failed on some rank: every rank's communication buffers are in ordinary "
                   "memory, collectives run through the transport");
    }
    for (FlatBuffer* b : buffers) b->move_to_backend();
    registers_ = false;
  }
  return registers_;
}

}  // namespace braid::trainer
