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
// Gpt::scratch_float_count), and ZeRO-2/3's communication buffers, which
// hold whole units (a transformer block): ZeRO-2 stages the two largest
// gradient buckets in flight and the embedding's, ZeRO-3 gathers a unit
// and prefetches the next while two units' gradients are staged. Padding,
// the mappings of peers' registered memory and the corpus are left out: the
// check refuses what surely cannot fit; a configuration at the edge may
// still fail later.
//
// Available: the tightest of runtime::memory_limits (MemAvailable, the
// cgroup's memory.max less memory.current, shared by the ranks of this host;
// the address-space limit less what the process maps, per rank). With --device cuda the buffers live
// in GPU memory, which the check leaves to the device's allocator (its
// errors name the bytes asked for).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/memory_limits.h"
#include "trainer/train/options.h"

namespace braid::trainer {

struct MemoryNeed {
  double params = 0.0;  // bytes
  double grads = 0.0;
  double optimizer = 0.0;
  double activations = 0.0;
  double communication = 0.0;

  double total() const { return params + grads + optimizer + activations + communication; }
};

// Per rank in a world of `world_size` ranks (see above).
MemoryNeed memory_need(const TrainOptions& options, int world_size);

using runtime::format_bytes;
using runtime::MemoryLimit;

// Every limit that applies to this process (runtime/memory_limits.h), for a
// run of `blas_threads` BLAS threads.
std::vector<MemoryLimit> memory_limits(int blas_threads);

// Throws InvalidUsage with the need, its parts and the limit when the need
// of the `local_ranks` ranks of this host exceeds a limit; "2.3 TiB".
void check_memory(const MemoryNeed& need, const std::vector<MemoryLimit>& limits, int local_ranks);
void check_memory(const TrainOptions& options, int world_size, int local_ranks);

}  // namespace braid::trainer
