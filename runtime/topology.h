// Where this process runs: the host identity that decides which peers share
// memory, and (through hwloc) the NUMA node and cores it is bound to, for
// the logs.
#pragma once

#include <string>

#include "runtime/config.h"

namespace braid::runtime {

// BRAID_HOST_ID if set, else "<hostname>/<boot id>" (two containers with the
// same hostname on different machines still differ by boot id).
std::string local_host_id(const Config& config);

// "NUMA node 0, cores 0-1" from hwloc, or a note that it could not tell.
std::string describe_placement();

// Cores this process may run on.
int available_cores();

}  // namespace braid::runtime
