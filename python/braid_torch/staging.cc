// Reused staging tensors (staging.h).
#include "staging.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <utility>

namespace braid::torch_backend {

namespace {

// Blocks are whole, aligned huge pages: each maps in one fault where the
// kernel has one to give (transparent_hugepage "madvise" or "always").
constexpr std::size_t kAlign = std::size_t{2} << 20;

}  // namespace

struct StagingPool::Shelf {
  std::mutex mutex;
  std::multimap<std::size_t, void*> free;  // by size
  std::size_t kept = 0;
  std::atomic<std::size_t> mapped{0};

  ~Shelf() {
    for (auto& [size, block] : free) std::free(block);
  }

  // A free block of `size` bytes or more, but not over twice that (a small
  // call does not take, and hold, a large call's block), and its size;
  // nullptr if none.
  std::pair<void*, std::size_t> take(std::size_t size) {
    std::lock_guard lock(mutex);
    auto it = free.lower_bound(size);
    if (it == free.end() || it->first / 2 > size) return {nullptr, 0};
    std::pair<void*, std::size_t> block{it->second, it->first};
    kept -= it->first;
    free.erase(it);
    return block;
  }

  void give_back(void* block, std::size_t size) {
    {
      std::lock_guard lock(mutex);
      if (kept + size <= kMaxKeptBytes) {
        free.emplace(size, block);
        kept += size;
        return;
      }
    }
    std::free(block);
  }
};

StagingPool::StagingPool() : shelf_(std::make_shared<Shelf>()) {}

StagingPool::Lease StagingPool::take(int64_t numel, const at::TensorOptions& options) {
  const std::size_t bytes = static_cast<std::size_t>(numel) * options.dtype().itemsize();
  if (!options.device().is_cpu() || bytes < kMinBytes) return {at::empty({numel}, options), [] {}};
  // A kept block may be larger than asked: it goes back as its own size.
  const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  auto [block, size] = shelf_->take(rounded);
  if (!block) {
    size = rounded;
    block = std::aligned_alloc(kAlign, size);
    if (!block) throw std::bad_alloc();
    shelf_->mapped.fetch_add(1, std::memory_order_relaxed);
    madvise(block, size, MADV_HUGEPAGE);  // a hint: without it, 4 KiB pages
  }
  auto succeeded = std::make_shared<std::atomic<bool>>(false);
  at::Tensor tensor = at::from_blob(
      block, {numel},
      [shelf = shelf_, succeeded, block_size = size](void* data) {
        if (succeeded->load(std::memory_order_acquire))
          shelf->give_back(data, block_size);
        else
          std::free(data);
      },
      options);
  return {tensor, [succeeded] { succeeded->store(true, std::memory_order_release); }};
}

std::size_t StagingPool::blocks_mapped() const { return shelf_->mapped.load(std::memory_order_relaxed); }

}  // namespace braid::torch_backend
