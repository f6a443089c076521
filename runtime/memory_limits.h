// What memory this process may still take, for the checks that refuse a
// configuration up front rather than under the OOM killer: braid-train's
// memory plan (trainer/train/memory_plan.h) and braid-bench's sweep.
//
// The limits: MemAvailable (/proc/meminfo) and, for this process's cgroup
// and each ancestor (cgroup v2), memory.max less memory.current, all shared
// by the ranks of this host; and the address-space limit (RLIMIT_AS,
// `ulimit -v`) less what the process maps already (and `reserved` bytes
// more), which each rank has alone.
#pragma once

#include <string>
#include <vector>

namespace braid::runtime {

struct MemoryLimit {
  double bytes = 0.0;
  std::string source;    // "MemAvailable in /proc/meminfo", ...
  bool per_host = true;  // shared by the host's ranks (else per process)
};

// Every limit that applies to this process (empty where none can be read).
// `reserved`: bytes the address-space limit must also leave, for what
// `reserved_for` names ("OpenBLAS's buffers and threads"); 0 for none.
std::vector<MemoryLimit> memory_limits(double reserved = 0.0, const std::string& reserved_for = "");

// What one rank of `local_ranks` on this host may take under `limit`.
double per_rank(const MemoryLimit& limit, int local_ranks);
// The limit that leaves a rank the least, or nullptr where there is none.
const MemoryLimit* tightest(const std::vector<MemoryLimit>& limits, int local_ranks);

// "2.3 TiB", "512 bytes".
std::string format_bytes(double bytes);

}  // namespace braid::runtime
