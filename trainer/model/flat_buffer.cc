#include "trainer/model/flat_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "runtime/errors.h"

namespace braid::trainer {

Range intersect(Range a, Range b) {
  std::size_t begin = std::max(a.offset, b.offset);
  std::size_t end = std::min(a.end(), b.end());
  return end > begin ? Range{begin, end - begin} : Range{begin, 0};
}

std::string_view category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters: return "parameters";
    case MemoryCategory::kGradients: return "gradients";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kCommunication: return "communication_buffers";
  }
  return "unknown";
}

void MemoryAccount::allocate(MemoryCategory category, std::size_t bytes) {
  auto i = static_cast<std::size_t>(category);
  current_[i] += bytes;
  peak_[i] = std::max(peak_[i], current_[i]);
  current_total_ += bytes;
  peak_total_ = std::max(peak_total_, current_total_);
}

void MemoryAccount::release(MemoryCategory category, std::size_t bytes) {
  auto i = static_cast<std::size_t>(category);
  current_[i] -= std::min(bytes, current_[i]);
  current_total_ -= std::min(bytes, current_total_);
}

std::size_t MemoryAccount::current_bytes(MemoryCategory category) const {
  return current_[static_cast<std::size_t>(category)];
}

std::size_t MemoryAccount::peak_bytes(MemoryCategory category) const {
  return peak_[static_cast<std::size_t>(category)];
}

void FlatBuffer::Free::operator()(float* p) const {
  if (deallocate != nullptr) deallocate(p);
  else trainer::backend(device).release(p);
}

FlatBuffer::FlatBuffer(std::size_t count, MemoryCategory category, MemoryAccount* account, Device device)
    : count_(count), category_(category), account_(account), device_(device) {
  const Backend& b = trainer::backend(device);
  data_ = std::unique_ptr<float[], Free>(
      static_cast<float*>(b.allocate(count * sizeof(float), category_name(category))), Free{device});
  if (account_ != nullptr) account_->allocate(category_, count_ * sizeof(float));
}

namespace {

float* allocate_registered(RegisteredMemory memory, std::size_t count, MemoryCategory category) {
  if (memory.allocate == nullptr || memory.deallocate == nullptr) {
    throw InvalidUsage("FlatBuffer: RegisteredMemory needs both allocate and deallocate");
  }
  void* p = memory.allocate(std::max<std::size_t>(count, 1) * sizeof(float));
  if (p == nullptr) {
    throw SystemError("registered memory of " + std::to_string(count * sizeof(float)) + " bytes for " +
                      std::string(category_name(category)) + " could not be allocated");
  }
  return static_cast<float*>(p);
}

}  // namespace

FlatBuffer::FlatBuffer(std::size_t count, MemoryCategory category, MemoryAccount* account, RegisteredMemory memory)
    : data_(allocate_registered(memory, count, category), Free{Device::kCpu, memory.deallocate}),
      count_(count),
      category_(category),
      account_(account),
      device_(Device::kCpu) {
  if (account_ != nullptr) account_->allocate(category_, count_ * sizeof(float));
}

void FlatBuffer::move_to_backend() {
  if (!registered()) return;
  std::unique_ptr<float[], Free> moved(
      static_cast<float*>(backend().allocate(count_ * sizeof(float), category_name(category_))), Free{device_});
  if (count_ > 0) std::memcpy(moved.get(), data_.get(), count_ * sizeof(float));
  data_ = std::move(moved);
}

FlatBuffer::FlatBuffer(FlatBuffer&& other) noexcept
    : data_(std::move(other.data_)),
      count_(std::exchange(other.count_, 0)),
      category_(other.category_),
      account_(std::exchange(other.account_, nullptr)),
      device_(other.device_) {}

FlatBuffer& FlatBuffer::operator=(FlatBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::move(other.data_);
    count_ = std::exchange(other.count_, 0);
    category_ = other.category_;
    account_ = std::exchange(other.account_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

FlatBuffer::~FlatBuffer() { release(); }

void FlatBuffer::release() {
  if (account_ != nullptr) account_->release(category_, count_ * sizeof(float));
  account_ = nullptr;
  data_.reset();
  count_ = 0;
}

std::span<float> FlatBuffer::view(Range r) { return span().subspan(r.offset, r.count); }
std::span<const float> FlatBuffer::view(Range r) const { return span().subspan(r.offset, r.count); }

void FlatBuffer::zero() {
  if (count_ > 0) backend().zero(data_.get(), count_ * sizeof(float));
}

}  // namespace braid::trainer
