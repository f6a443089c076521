// Private (CUDA builds): the gate kernel of comm/device.h, launched from
// host code that g++ compiles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace braid::comm {

// Queues on `stream` one thread that returns once *gate >= ticket, or after
// `timeout_ns` of waiting, then writing 1 to *timed_out.
cudaError_t launch_gate(cudaStream_t stream, const volatile std::uint64_t* gate, std::uint64_t ticket,
                        std::uint64_t timeout_ns, std::uint32_t* timed_out);

}  // namespace braid::comm
