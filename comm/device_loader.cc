// comm/device.h in a CUDA build: the device path (device_cuda.cc,
// device_gate.cu and the CUDA kernels) is a plugin of its own,
// libbraid_comm_cuda.so, installed beside libbraid_comm.so and loaded the
// first time a call on device memory arrives. So libbraid_comm.so names no
// CUDA library, and a host-only client of a CUDA build links and loads
// without the CUDA runtime (issue 16); only a process that passes device
// memory, and so already has CUDA loaded, loads the plugin.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

#include "comm/device.h"
#include "comm/device_plugin.h"
#include "comm/plugin_file.h"
#include "runtime/errors.h"

namespace braid::comm {

namespace {

// CUDA's lazy module loading (its default from 12.2) loads a kernel at its
// first launch, and the load waits for every kernel of the context to end.
// A kernel first launched while a collective holds a stream at its gate
// then waits for the gate, and the collective's own kernels, queued by the
// engine after it, wait behind that load: two ranks sharing an H200 hung so
// until BRAID_TIMEOUT (issue 19; scripts/cuda_gate_probe.cu, mode 'lazy').
// So a process that loads braid asks for eager loading before CUDA starts,
// unless CUDA_MODULE_LOADING is set already (device_cuda.cc warns if LAZY).
[[gnu::constructor]] void prefer_eager_module_loading() { ::setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

struct Plugin {
  DevicePluginFactory factory = nullptr;
  std::string error;
};

Plugin load_plugin() {
  Plugin plugin;
  const auto path = beside_libbraid_comm(kDevicePluginFile, plugin.error);
  if (path.empty()) return plugin;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    plugin.error = dlerror();
    return plugin;
  }
  plugin.factory = reinterpret_cast<DevicePluginFactory>(dlsym(handle, kDevicePluginEntry));
  if (plugin.factory == nullptr) plugin.error = path.string() + " has no " + kDevicePluginEntry;
  return plugin;
}

}  // namespace

std::unique_ptr<DeviceStaging> make_device_staging(int device, std::chrono::milliseconds timeout,
                                                   const std::string& gate) {
  static std::once_flag once;
  static Plugin plugin;
  std::call_once(once, [] { plugin = load_plugin(); });
  if (plugin.factory == nullptr)
    throw SystemError("CUDA device " + std::to_string(device) + " memory was passed, but braid's CUDA part (" +
                      kDevicePluginFile + ") could not be loaded: " + plugin.error +
                      ". Install it beside libbraid_comm and make the CUDA runtime (libcudart) loadable");
  return std::unique_ptr<DeviceStaging>(plugin.factory(device, timeout.count(), gate.c_str()));
}

}  // namespace braid::comm
