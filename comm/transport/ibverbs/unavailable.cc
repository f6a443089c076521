// The ibverbs transport in a build without libibverbs: BRAID_TRANSPORT=ibverbs
// is refused by name.
#include "comm/transport/ibverbs/connect.h"
#include "runtime/errors.h"

namespace braid::comm::ibverbs {

std::unique_ptr<Transport> open_ibverbs(runtime::Store&, const std::string&, const IbOptions& options) {
  throw InvalidUsage("rank " + std::to_string(options.rank) +
                     ": BRAID_TRANSPORT=ibverbs, but this braid was built without libibverbs; install "
                     "libibverbs-dev (rdma-core) and rebuild with -Dibverbs=enabled, or use BRAID_TRANSPORT=auto");
}

std::string unusable_reason(const GidRequest&, int, std::string&) {
  return "this braid was built without libibverbs";
}

}  // namespace braid::comm::ibverbs
