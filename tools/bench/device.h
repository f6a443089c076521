// braid-bench --device cuda: benchmark buffers in GPU memory. Built on the
// CUDA runtime where CUDA is (device_cuda.cc), refusing with a clear error
// where it is not (device_none.cc).
#pragma once

#include <cstddef>

namespace braid::comm::bench_device {

// Uses GPU local_rank mod the GPU count, and a stream of its own for the
// collectives. Throws InvalidUsage without CUDA, SystemError without a GPU.
void init(int local_rank);
void* stream();  // a cudaStream_t
std::byte* allocate(std::size_t bytes);
void release(std::byte* device);
void upload(std::byte* device, const std::byte* host, std::size_t bytes);
void download(std::byte* host, const std::byte* device, std::size_t bytes);
// Until the stream the timed calls went on (the default stream with -y) has
// run all it holds: how nccl-tests ends its timing. Work::wait polls with
// sleeps of up to 100 us (comm/poll_pause.h), which would count in the time.
void synchronize(bool null_stream);
// Device-to-device cudaMemcpy bandwidth of this GPU in GB/s (bytes copied /
// s), over copies of `bytes`.
double measure_copy_gbps(std::size_t bytes);

}  // namespace braid::comm::bench_device
