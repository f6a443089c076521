// The entry point of libbraid_comm_cuda.so (comm/device_plugin.h). The
// plugin is linked with -Bsymbolic, so make_device_staging here is
// device_cuda.cc's, not libbraid_comm's loader of the same name.
#include "comm/device.h"
#include "comm/device_plugin.h"

extern "C" braid::comm::DeviceStaging* braid_comm_cuda_make_device_staging(int device, std::int64_t timeout_ms,
                                                                          const char* gate) {
  return braid::comm::make_device_staging(device, std::chrono::milliseconds(timeout_ms), gate).release();
}
