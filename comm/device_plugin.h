// Private: the one entry point of braid's CUDA plugin, libbraid_comm_cuda.so
// (comm/device_loader.cc loads it; comm/device_plugin.cc defines it).
#pragma once

#include <cstdint>

namespace braid::comm {

class DeviceStaging;

inline constexpr const char* kDevicePluginFile = "libbraid_comm_cuda.so";
inline constexpr const char* kDevicePluginEntry = "braid_comm_cuda_make_device_staging";
// make_device_staging of device_cuda.cc; a new object the caller owns.
using DevicePluginFactory = DeviceStaging* (*)(int device, std::int64_t timeout_ms, const char* gate);

}  // namespace braid::comm
