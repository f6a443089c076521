// The ibverbs transport is a library of its own, libbraid_comm_ibverbs.so,
// installed beside libbraid_comm.so, which loads it (loader.cc) the first
// time a communicator looks for RDMA: a rank with peers on other hosts
// under BRAID_TRANSPORT=auto, or any under BRAID_TRANSPORT=ibverbs. So
// libbraid_comm.so names no libibverbs: a program on a machine without
// rdma-core (libibverbs.so.1) loads and runs over shm and tcp, and a job
// across hosts there uses tcp, saying why (h47's finding: every program
// needed libibverbs.so.1 to start). This is the table the two share.
#pragma once

#include <memory>
#include <string>

#include "comm/transport/ibverbs/connect.h"

namespace braid::comm::ibverbs {

struct Plugin {
  // unusable_reason() and open_ibverbs() of connect.h, as the library has them.
  std::string (*unusable_reason)(const GidRequest& request, int rank, std::string& chosen);
  std::unique_ptr<Transport> (*open)(runtime::Store& store, const std::string& key_prefix, const IbOptions& options);
};

inline constexpr char kPluginFile[] = "libbraid_comm_ibverbs.so";
inline constexpr char kPluginEntry[] = "braid_comm_ibverbs_plugin";
using PluginEntry = const Plugin* (*)();

}  // namespace braid::comm::ibverbs
