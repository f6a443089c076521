// braid-bench: collective benchmark in the spirit of nccl-tests.
//
//   braid-launch --nproc-per-node 2 -- braid-bench --coll all_reduce -b 8 -e 256M -f 2
//
// For every size from -b to -e (times -f) it runs the collective out of place
// and in place, checks the result against verifiable inputs (-c 1, exact
// small integers), times -n iterations after -w warm-up ones, and prints
// time, algbw and busbw as nccl-tests defines them, plus busbw as a fraction
// of this machine's single-core memcpy bandwidth measured at start. With
// --device cuda the buffers are in GPU memory, the calls go on a CUDA stream,
// and the reference is the GPU's device-to-device cudaMemcpy bandwidth.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#include "tools/bench/bench.h"
#include "runtime/config.h"
#include "runtime/errors.h"

using namespace braid;

int main(int argc, char** argv) {
  comm::BenchOptions o;
  std::string min_bytes = "8", max_bytes = "64M", dtype = "f32", op = "sum";
  CLI::App app{"braid-bench: collective bandwidth and latency, nccl-tests style"};
  app.add_option("-b,--minbytes", min_bytes, "smallest message (bytes, K/M/G suffixes)");
  app.add_option("-e,--maxbytes", max_bytes, "largest message");
  app.add_option("-f,--stepfactor", o.factor, "size multiplier between rows")->check(CLI::Range(2, 1024));
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations per size")->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", o.check, "verify results (0 or 1)")->check(CLI::Range(0, 1));
  app.add_option("-o,--op", op, "sum|prod|min|max|avg");
  app.add_option("-d,--datatype", dtype, "f32|f64|f16|bf16|i8|u8|i32|i64");
  app.add_option("-r,--root", o.root, "root of broadcast and reduce")->check(CLI::NonNegativeNumber);
  app.add_option("--coll", o.collective,
                 "all_reduce|reduce_scatter|all_gather|broadcast|reduce|all_to_all|send_recv")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
                             "all_to_all", "send_recv"}));
  int registered = 0;
  app.add_option("-R,--registered", registered,
                 "1: host buffers from Communicator::allocate, which the local ranks map into each other "
                 "(all_reduce then runs the direct algorithm on one host)")
      ->check(CLI::Range(0, 1));
  std::string device = "cpu";
  app.add_option("--device", device, "cpu: host buffers; cuda: GPU buffers on a CUDA stream (GPU local_rank mod GPUs)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--json", o.json_path, "write every row as JSON to this file");
  app.add_option("--csv", o.csv_path, "write every row as CSV to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; every argument error is 2, as in the other tools
  }
  try {
    o.min_bytes = runtime::parse_bytes(min_bytes);
    o.max_bytes = runtime::parse_bytes(max_bytes);
    auto parsed_dtype = parse_dtype(dtype);
    auto parsed_op = parse_reduce_op(op);
    if (!parsed_dtype) throw InvalidUsage("unknown datatype '" + dtype + "'");
    if (!parsed_op) throw InvalidUsage("unknown op '" + op + "'");
    if (o.min_bytes > o.max_bytes) throw InvalidUsage("-b must not exceed -e");
    o.dtype = *parsed_dtype;
    o.op = *parsed_op;
    o.cuda = device == "cuda";
    o.registered = registered == 1;
    if (o.registered && o.cuda) throw InvalidUsage("-R 1 registers host buffers; it does not combine with --device cuda");
    return comm::run_bench(o);
  } catch (const InvalidUsage& e) {
    std::fprintf(stderr, "braid-bench: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "braid-bench: %s\n", e.what());
    return 1;
  }
}
