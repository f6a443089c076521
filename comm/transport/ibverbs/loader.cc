// connect.h in a build with libibverbs: the transport itself is
// libbraid_comm_ibverbs.so (plugin.h), loaded from beside libbraid_comm.so
// once, the first time a communicator looks for RDMA. Where it cannot be
// loaded (no libibverbs.so.1 on this machine, most often), RDMA is unusable
// with dlopen's reason: auto takes tcp, saying so, and
// BRAID_TRANSPORT=ibverbs is refused by name.
#include <dlfcn.h>

#include <filesystem>
#include <string>

#include "comm/plugin_file.h"
#include "comm/transport/ibverbs/connect.h"
#include "comm/transport/ibverbs/plugin.h"
#include "runtime/errors.h"

namespace braid::comm::ibverbs {
namespace {

struct Loaded {
  const Plugin* plugin = nullptr;
  std::string path;   // where it was looked for
  std::string error;  // why it could not be loaded
};

Loaded load() {
  Loaded loaded;
  const auto path = beside_libbraid_comm(kPluginFile, loaded.error);
  if (path.empty()) return loaded;
  loaded.path = path.string();
  // RTLD_GLOBAL, as libibverbs was when libbraid_comm named it: a library
  // preloaded to wrap verbs calls (a tracer, the VM tests' fault library)
  // finds the real ones with dlsym(RTLD_NEXT), which searches the global
  // scope only; loaded locally, each such wrapper called a null pointer.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    loaded.error = why ? why : path.string() + " could not be loaded";
    return loaded;
  }
  auto entry = reinterpret_cast<PluginEntry>(dlsym(handle, kPluginEntry));
  if (entry == nullptr) {
    loaded.error = path.string() + " has no " + kPluginEntry;
    return loaded;
  }
  loaded.plugin = entry();
  return loaded;
}

const Loaded& plugin() {
  static const Loaded loaded = load();  // once per process; a failed load is not retried
  return loaded;
}

std::string cannot_load() {
  const std::string& path = plugin().path.empty() ? std::string(kPluginFile) : plugin().path;
  return "the RDMA transport (" + path + ") cannot be loaded: " + plugin().error +
         "; install libibverbs1 (rdma-core) where this machine has RDMA devices";
}

}  // namespace

std::string unusable_reason(const GidRequest& request, int rank, std::string& chosen) {
  if (const Plugin* p = plugin().plugin) return p->unusable_reason(request, rank, chosen);
  return cannot_load();
}

std::unique_ptr<Transport> open_ibverbs(runtime::Store& store, const std::string& key_prefix,
                                        const IbOptions& options) {
  if (const Plugin* p = plugin().plugin) return p->open(store, key_prefix, options);
  throw InvalidUsage("rank " + std::to_string(options.rank) + ": BRAID_TRANSPORT=ibverbs, but " + cannot_load() +
                     ", or use BRAID_TRANSPORT=auto (tcp between hosts without RDMA)");
}

}  // namespace braid::comm::ibverbs
