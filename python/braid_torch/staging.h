// Staging tensors for the calls whose torch layout is not braid's (a list of
// per-rank tensors, a coalesced list): one contiguous tensor the braid call
// reads or writes, copied from or to the list.
//
// Host ones are reused from call to call. A fresh tensor per call (as gloo
// takes one) is memory the kernel maps page by page on first touch: a
// 2-rank all_gather of 16 MiB into a list took 212 ms where the flat form
// took 10.5 ms, nearly all of it in page faults of the 32 MiB staging
// tensor. Kept blocks are 2 MiB-aligned and marked for transparent huge
// pages, so even a new one maps in a few faults.
//
// A block goes back on the shelf only once the call that used it has
// succeeded (`Lease::reusable`): after a failed call nothing promises that
// a transport is done with it, so it is freed as before, never handed to
// another call.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace braid::torch_backend {

class StagingPool {
 public:
  // Host blocks smaller than this come from torch's allocator (malloc keeps
  // those mapped); free blocks kept past this many bytes are freed.
  static constexpr std::size_t kMinBytes = std::size_t{64} << 10;
  static constexpr std::size_t kMaxKeptBytes = std::size_t{512} << 20;

  struct Lease {
    at::Tensor tensor;
    // Call once the braid call that used `tensor` has succeeded: the block
    // then returns to the pool when the tensor's last reference goes.
    std::function<void()> reusable;
  };

  StagingPool();
  // A contiguous 1-D tensor of `numel` elements of `options`' dtype and
  // device (CUDA ones from torch's caching allocator).
  Lease take(int64_t numel, const at::TensorOptions& options);
  // Host blocks mapped since the pool was made (kept ones are not counted
  // again when reused): a diagnostic, and what the tests hold reuse to.
  std::size_t blocks_mapped() const;

 private:
  struct Shelf;
  std::shared_ptr<Shelf> shelf_;
};

}  // namespace braid::torch_backend
