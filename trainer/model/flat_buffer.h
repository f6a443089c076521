// Flat float buffers and the trainer's own memory accounting.
//
// Parameters, gradients, optimizer state and activations each live in a few
// large contiguous buffers. A Range names a sub-range of one of them: a
// parameter view, a DDP bucket, a ZeRO shard are all Ranges, so the code that
// moves or updates them never needs to know which tensors they cover.
//
// Every buffer is charged to a MemoryCategory of a MemoryAccount when it is
// allocated and released when it is freed; the account keeps the current and
// the peak bytes of each category (DESIGN.md invariant 4 is checked on it).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "trainer/model/backend.h"

namespace braid::trainer {

// A half-open range of elements [offset, offset + count) of a flat buffer.
struct Range {
  std::size_t offset = 0;
  std::size_t count = 0;

  std::size_t end() const { return offset + count; }
  bool operator==(const Range&) const = default;
};

// The intersection of two ranges (count 0 when they do not overlap).
Range intersect(Range a, Range b);

// kCommunication holds what a strategy keeps only to move data: DDP and ZeRO
// staging buckets, ZeRO-3's gathered units. It is the working set on top of
// the persistent state that the ZeRO table (DESIGN.md invariant 4) speaks of.
enum class MemoryCategory { kParameters, kGradients, kOptimizerState, kActivations, kCommunication };
inline constexpr std::size_t kMemoryCategoryCount = 5;

// "parameters", "gradients", "optimizer_state", "activations",
// "communication_buffers".
std::string_view category_name(MemoryCategory category);

class MemoryAccount {
 public:
  void allocate(MemoryCategory category, std::size_t bytes);
  void release(MemoryCategory category, std::size_t bytes);

  std::size_t current_bytes(MemoryCategory category) const;
  std::size_t peak_bytes(MemoryCategory category) const;
  // Peak of the sum over all categories (not the sum of the peaks).
  std::size_t peak_total_bytes() const { return peak_total_; }

 private:
  std::array<std::size_t, kMemoryCategoryCount> current_{};
  std::array<std::size_t, kMemoryCategoryCount> peak_{};
  std::size_t current_total_ = 0;
  std::size_t peak_total_ = 0;
};

// Host memory from outside the backend: in practice a communicator's
// registered memory (comm::Communicator::allocate / deallocate), whose
// buffers the ranks of one host map into each other so that a collective
// on them can run the direct algorithm. `allocate` returns zeroed memory or
// throws; it may round the size up (registered memory comes in 2 MiB units).
struct RegisteredMemory {
  void* (*allocate)(std::size_t bytes) = nullptr;
  void (*deallocate)(void* pointer) = nullptr;
};

// A zero-initialised float buffer on one Device (64-byte aligned on the
// CPU), charged to an account. Movable, not copyable; releases its charge
// when destroyed. data() points into the device's memory: host code reads
// and writes a CUDA buffer only through backend() (span() and view() are
// for CPU buffers).
//
// A CPU buffer may come from RegisteredMemory instead of the backend. The
// account is charged count() floats either way: what the buffer holds, not
// what its allocator rounded up to (the backend's alignment is not counted
// either), so the ZeRO table holds whichever memory a buffer came from.
class FlatBuffer {
 public:
  FlatBuffer() = default;
  FlatBuffer(std::size_t count, MemoryCategory category, MemoryAccount* account, Device device = Device::kCpu);
  // A CPU buffer from `memory`; throws what memory.allocate throws.
  FlatBuffer(std::size_t count, MemoryCategory category, MemoryAccount* account, RegisteredMemory memory);
  FlatBuffer(FlatBuffer&& other) noexcept;
  FlatBuffer& operator=(FlatBuffer&& other) noexcept;
  FlatBuffer(const FlatBuffer&) = delete;
  FlatBuffer& operator=(const FlatBuffer&) = delete;
  ~FlatBuffer();

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  std::size_t count() const { return count_; }
  std::span<float> span() { return {data_.get(), count_}; }
  std::span<const float> span() const { return {data_.get(), count_}; }
  std::span<float> view(Range r);
  std::span<const float> view(Range r) const;
  void zero();
  Device device() const { return device_; }
  MemoryCategory category() const { return category_; }
  const Backend& backend() const { return trainer::backend(device_); }
  // Whether the memory came from RegisteredMemory.
  bool registered() const { return data_.get_deleter().deallocate != nullptr; }
  // Move the contents of registered memory into the backend's and free it;
  // the count and the account's charge stay. A no-op for backend memory.
  void move_to_backend();

 private:
  struct Free {
    Device device;
    void (*deallocate)(void*) = nullptr;  // set: RegisteredMemory's
    void operator()(float* p) const;
  };
  void release();

  std::unique_ptr<float[], Free> data_{nullptr, Free{Device::kCpu}};
  std::size_t count_ = 0;
  MemoryCategory category_ = MemoryCategory::kActivations;
  MemoryAccount* account_ = nullptr;
  Device device_ = Device::kCpu;
};

}  // namespace braid::trainer
