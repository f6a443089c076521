// Element-wise reductions on device memory: the CUDA twin of
// kernels/cpu/reduce.h, with the same semantics (the CPU version is the spec,
// tests/kernels/test_cuda_kernels.cc compares the two):
//   - integer sums and products wrap; signed min/max compare as signed;
//   - f16 and bf16 are reduced through f32 and rounded back to nearest even
//     (NaN stays NaN; its payload may differ from the CPU's);
//   - ReduceOp::avg reduces as sum; call divide() on the final result.
// Every call is asynchronous on `stream` (nullptr: the legacy default stream).
// Pointers are device pointers (or managed / mapped host memory). A bad
// launch throws std::runtime_error; faults during the kernel surface at the
// caller's next synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "kernels/dtype.h"

namespace braid::kernels::cuda {

// dst[i] = op(a[i], b[i]) for i < count. dst may alias a or b. Uses 16-byte
// vector loads when dst, a and b are all 16-byte aligned.
void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dtype,
            ReduceOp op, cudaStream_t stream = nullptr);

// The fused step of an all-reduce among ranks that map each other's buffers
// (CUDA IPC): r = op(srcs[0][i], ..., srcs[n_src-1][i]), divided by
// `divisor` unless it is 0 (avg), written to every dsts[k][i], for i < count.
// 1..kMaxMulti sources and destinations, on any devices the calling one can
// reach; a destination may alias a source. The sources are reduced in their
// order, as the CPU's reduce applied left to right would.
inline constexpr int kMaxMulti = 8;
void reduce_multi(void* const* dsts, int n_dst, const void* const* srcs, int n_src, std::size_t count,
                  DataType dtype, ReduceOp op, int divisor, cudaStream_t stream = nullptr);

// data[i] /= divisor (integer types truncate toward zero; the divisor is
// converted to the element type first, as on the CPU). divisor must be
// nonzero: a device does not trap on integer division by zero.
void divide(void* data, std::size_t count, DataType dtype, int divisor,
            cudaStream_t stream = nullptr);

// Launches every kernel of this file once (one element of each dtype and
// operator, on a scratch block) and waits for them. With lazy loading (the
// default since CUDA 12.2) a kernel's first launch loads it, and loading may
// synchronize the whole context: while another stream of the context is held
// by a kernel that waits for this one's result (comm/'s stream gate waits for
// the host, which waits for the collective's kernels), that first launch
// deadlocks. Call it on the current device before any such wait exists.
// Allocates and frees (cudaMalloc, cudaFree: both may synchronize).
void preload(cudaStream_t stream);

// True when the CUDA runtime sees at least one device. Otherwise false, with
// the reason (no driver, driver too old, no device visible) in *why when why
// is not null. Never throws: tests and runtime/ use it to choose a path.
bool cuda_device_available(std::string* why = nullptr);

}  // namespace braid::kernels::cuda
