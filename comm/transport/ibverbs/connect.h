// What setup.cc needs of the ibverbs transport, in a build with or without
// libibverbs: the options, and open_ibverbs(), which connects through
// libbraid_comm_ibverbs.so, loaded at the first use (loader.cc, plugin.h),
// or, in a build without libibverbs, refuses by name (unavailable.cc).
#pragma once

#include "comm/transport/transport_only.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport/ibverbs/device.h"
#include "comm/transport/transport.h"

namespace braid::runtime {
class Store;
}

namespace braid::comm::ibverbs {

struct IbOptions : ConnectOptions {
  GidRequest device;  // BRAID_IB_HCA, BRAID_IB_GID_INDEX
  std::size_t slot_bytes = (256u << 10) + 4096;  // a default segment and its header fit one slot
  int slots = 8;                                 // ring slots per peer and direction
  int qps = 1;  // queue pairs per peer (BRAID_IB_QPS_PER_PEER); large messages stripe over them
  std::vector<bool> peers;  // which ranks to connect; empty means all
};

// Why this rank cannot use RDMA under BRAID_TRANSPORT=auto (no libibverbs in
// this build, no device, no active port with a GID that fits `request`), or
// "" when it can: then the chosen device and GID are in `chosen`.
std::string unusable_reason(const GidRequest& request, int rank, std::string& chosen);

// connect_ibverbs() (transport.h) as a plain Transport.
std::unique_ptr<Transport> open_ibverbs(runtime::Store& store, const std::string& key_prefix,
                                        const IbOptions& options);

}  // namespace braid::comm::ibverbs
