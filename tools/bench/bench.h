// The machinery of braid-bench (tools/braid_bench.cc is its thin main):
// verifiable inputs, expected results, timing and the nccl-tests table.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace braid::comm {

// The flags follow nccl-tests (tools/braid_bench.cc lists them with their defaults).
struct BenchOptions {
  std::string collective = "all_reduce";
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
  std::size_t step_bytes = 0;  // -i: sizes grow by this many bytes instead of by -f
  int factor = 2;
  int iters = 20, warmup = 5, check = 1, root = 0;
  int agg_iters = 1;      // -m: calls issued back to back per timed iteration
  int cycles = 1;         // -N: the whole sweep this many times (0: until stopped)
  int average = 1;        // -a: time over ranks: 0 rank 0, 1 mean, 2 min, 3 max
  bool blocking = false;  // -z: wait for each call before issuing the next
  bool cpu_time = false;  // -C: time until the calls are issued, not until they complete
  bool null_stream = false;  // -y: --device cuda calls on the default stream
  double timeout_s = 0;   // -T: BRAID_TIMEOUT for this run, 0.001 s or more (0: as configured)
  std::vector<DataType> dtypes{DataType::f32};  // -d (all: every dtype, one sweep each)
  std::vector<ReduceOp> ops{ReduceOp::sum};     // -o (all: every op)
  // The sweep being run: one of dtypes and one of ops.
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  std::string json_path, csv_path;
  bool cuda = false;  // --device cuda: buffers in GPU memory, calls on a CUDA stream
  bool registered = false;  // -R 1: host buffers from Communicator::allocate
  // --memcpy_bytes: the size of the copies that measure the memcpy baseline
  // (0: none measured; the /mcpy columns read N/A).
  std::size_t memcpy_bytes = 256u << 20;
};

// Runs the sweep on the world communicator; returns the exit status (1 when
// any result was wrong).
int run_bench(const BenchOptions& options);

// Single-core memcpy bandwidth of this machine in GB/s (bytes copied / s),
// over copies of `bytes` (the default, 256 MiB, is far larger than the
// caches), or of a quarter of what the tightest memory limit leaves this
// rank where that is less (at least 1 MiB): `bytes` is lowered to it.
double measure_memcpy_gbps(std::size_t& bytes);

}  // namespace braid::comm
