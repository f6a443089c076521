// The machinery of braid-bench (tools/braid_bench.cc is its thin main):
// verifiable inputs, expected results, timing and the nccl-tests table.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/dtype.h"

namespace braid::comm {

struct BenchOptions {
  std::string collective = "all_reduce";
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
  int factor = 2;
  int iters = 20, warmup = 5, check = 1, root = 0;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  std::string json_path, csv_path;
  bool cuda = false;  // --device cuda: buffers in GPU memory, calls on a CUDA stream
  bool registered = false;  // -R 1: host buffers from Communicator::allocate
};

// Runs the sweep on the world communicator; returns the exit status (1 when
// any result was wrong).
int run_bench(const BenchOptions& options);

// Single-core memcpy bandwidth of this machine in GB/s (bytes copied / s),
// over a buffer far larger than the caches.
double measure_memcpy_gbps();

}  // namespace braid::comm
