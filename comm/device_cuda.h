// Private (CUDA builds): what the device path's pieces share: CUDA errors
// as braid errors, a scope that makes a device current, the bounded wait
// for an event (comm/device_cuda.cc, comm/device_reducer_cuda.cc,
// comm/transport/cuda_ipc/), and the device Reducer's factory.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>

#include "comm/algorithms/reducer.h"
#include "comm/types.h"

namespace braid::comm {

// Throws SystemError("CUDA: <what>: <CUDA's text>") unless `status` is success.
void check_cuda(cudaError_t status, const std::string& what);

// Makes `device` current for a scope and restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// Waits until `event` (null: nothing to wait for) has completed, polling
// with a sleep that grows from 5 us to 100 us: the waiting thread must not
// spin on a shared core, and a collective on device memory waits so for
// its inputs, so a longer sleep would add to every call (its kernels are
// waited for with a wake-up besides: comm/device_reducer_cuda.cc).
// TimeoutError "<what> within BRAID_TIMEOUT" at `deadline`; SystemError on
// a CUDA error.
void wait_for_event(cudaEvent_t event, Clock::time_point deadline, const char* what);

// DeviceStaging::make_reducer's (comm/device_reducer_cuda.cc).
std::unique_ptr<Reducer> make_device_reducer(int device);

}  // namespace braid::comm
