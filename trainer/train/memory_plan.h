// braid-train's memory check: what a configuration needs per rank, from the
// trainer's own accounting, against what the machine has, before anything
// is allocated, so that a configuration that cannot fit fails at once with
// the numbers instead of under the OOM killer a minute later.
//
// Need, for the rank that needs most (the pipeline stage with the most
// blocks; under dp rank 0, which holds the optimizer state): parameters,
// gradients and AdamW's m and v from the ZeRO table (strategy.h,
// memory_theory) of the parameters its layout holds
// (ParamTable::gpt_param_count), and activations: one Activations per
// micro-batch the rank holds at once (one; under --pp all M for gpipe, up
// to P for 1f1b) plus backward's scratch (Activations::float_count,
// Gpt::scratch_float_count). Padding, communication buffers and the corpus
// are left out: the check refuses what surely cannot fit; a configuration
// at the edge may still fail later.
//
// Available: the tightest of MemAvailable (/proc/meminfo) and, for this
// process's cgroup and each ancestor (cgroup v2), memory.max less
// memory.current, all shared by the ranks of this host; and the
// address-space limit (RLIMIT_AS, `ulimit -v`) less what the process maps
// already, which each rank has alone. With --device cuda the buffers live
// in GPU memory, which the check leaves to the device's allocator (its
// errors name the bytes asked for).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trainer/train/options.h"

namespace braid::trainer {

struct MemoryNeed {
  double params = 0.0;  // bytes
  double grads = 0.0;
  double optimizer = 0.0;
  double activations = 0.0;

  double total() const { return params + grads + optimizer + activations; }
};

// Per rank in a world of `world_size` ranks (see above).
MemoryNeed memory_need(const TrainOptions& options, int world_size);

struct MemoryLimit {
  double bytes = 0.0;
  std::string source;        // "MemAvailable in /proc/meminfo", ...
  bool per_host = true;      // shared by the host's ranks (else per process)
};

// Every limit that applies to this process (empty where none can be read),
// for a run of `blas_threads` BLAS threads.
std::vector<MemoryLimit> memory_limits(int blas_threads);

// Throws InvalidUsage with the need, its parts and the limit when the need
// of the `local_ranks` ranks of this host exceeds a limit; "2.3 TiB".
void check_memory(const MemoryNeed& need, const std::vector<MemoryLimit>& limits, int local_ranks);
void check_memory(const TrainOptions& options, int world_size, int local_ranks);
std::string format_bytes(double bytes);

}  // namespace braid::trainer
