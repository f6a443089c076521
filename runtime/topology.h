// Where this process runs: the host identity that decides which peers share
// memory, and (through hwloc) the NUMA node and cores it is bound to, for
// the logs.
#pragma once

#include <string>
#include <vector>

#include "runtime/config.h"

namespace braid::runtime {

// BRAID_HOST_ID if set, else "<hostname>/<boot id>/shm<device>:<inode>"
// (two containers with the same hostname on different machines still
// differ by boot id; two on one machine with /dev/shm each, as Docker gives
// them, by /dev/shm: ranks there cannot share memory, and tried to, failing
// with "opening a peer's shared memory ...: No such file or directory").
std::string local_host_id(const Config& config);
// What messages call a host: a host identity up to its first '/' (the
// hostname of the default identity).
std::string host_name(const std::string& host_id);

// "NUMA node 0, cores 0-1" from hwloc, or a note that it could not tell.
std::string describe_placement();

// Cores this process may run on.
int available_cores();

// This process's CPU affinity as a list, "0-3,6" (every CPU where it
// cannot be read), for the other ranks of its host.
std::string allowed_cpus();

// How many distinct CPUs the allowed_cpus() lists of several processes name
// together (ranks bound one per core name one each, unbound ones the whole
// machine); 0 where a list does not parse.
int distinct_cpus(const std::vector<std::string>& lists);

}  // namespace braid::runtime
