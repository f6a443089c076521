// The entry point of libbraid_comm_ibverbs.so (plugin.h): the table through
// which libbraid_comm reaches this transport.
#include "comm/transport/ibverbs/plugin.h"

#include <vector>

#include "comm/transport/ibverbs/device.h"
#include "comm/transport/ibverbs/transport.h"
#include "runtime/errors.h"

namespace braid::comm::ibverbs {
namespace {

std::string reason_here(const GidRequest& request, int rank, std::string& chosen) {
  std::vector<GidEntry> table = probe_gid_table();
  if (table.empty()) return "no RDMA device (ibv_devices lists none, or no GID is set)";
  try {
    GidChoice choice = choose_gid(table, request, rank);
    chosen = choice.entry.device + " port " + std::to_string(choice.entry.port) + " GID index " +
             std::to_string(choice.entry.index);
    return "";
  } catch (const InvalidUsage& e) {
    return e.what();
  }
}

std::unique_ptr<Transport> open_here(runtime::Store& store, const std::string& key_prefix,
                                     const IbOptions& options) {
  return connect_ibverbs(store, key_prefix, options);
}

}  // namespace
}  // namespace braid::comm::ibverbs

extern "C" [[gnu::visibility("default")]] const braid::comm::ibverbs::Plugin* braid_comm_ibverbs_plugin() {
  static const braid::comm::ibverbs::Plugin plugin{&braid::comm::ibverbs::reason_here,
                                                   &braid::comm::ibverbs::open_here};
  return &plugin;
}
