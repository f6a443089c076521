// comm/device.h in a build without CUDA: validation refuses device buffers
// before they get here (comm/communicator.cc); this says why if one does.
#include "comm/device.h"
#include "runtime/errors.h"

namespace braid::comm {

std::unique_ptr<DeviceStaging> make_device_staging(int device, std::chrono::milliseconds, const std::string&) {
  throw InvalidUsage("CUDA device " + std::to_string(device) +
                     " memory was passed, but this braid was built without CUDA");
}

}  // namespace braid::comm
