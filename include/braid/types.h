// The public vocabulary of braid's collectives: element types and reduction
// operators (braid/dtype.h), collective kinds, and the CUDA stream a call on
// device memory is ordered on.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "braid/dtype.h"

namespace braid::comm {

using braid::DataType;
using braid::ReduceOp;
using Clock = std::chrono::steady_clock;

enum class OpKind : std::uint8_t {
  all_reduce, reduce_scatter, all_gather, broadcast, reduce,
  send, recv, all_to_all, barrier,
};
std::string_view name(OpKind kind);

// A CUDA stream (a cudaStream_t) for calls on device memory; the default,
// null, is the device's legacy default stream, as stream 0 is in NCCL. A
// call on device buffers is ordered after the work already queued on its
// stream, and work queued there after the call waits for its result.
struct Stream {
  void* cuda = nullptr;
};

}  // namespace braid::comm
