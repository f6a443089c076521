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

// A zero-initialised float buffer on one Device (64-byte aligned on the
// CPU), charged to an account. Movable, not copyable; releases its charge
// when destroyed. data() points into the device's memory: host code reads
// and writes a CUDA buffer only through backend() (span() and view() are
// for CPU buffers).
class FlatBuffer {
 public:
  FlatBuffer() = default;
  FlatBuffer(std::size_t count, MemoryCategory category, MemoryAccount* account, Device device = Device::kCpu);
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
  const Backend& backend() const { return trainer::backend(device_); }

 private:
  struct Free {
    Device device;
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
