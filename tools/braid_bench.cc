// braid-bench: collective benchmark in the spirit of nccl-tests.
//
//   braid-launch --nproc-per-node 2 -- braid-bench --coll all_reduce -b 8 -e 256M -f 2
//
// For every size from -b to -e (times -f, or plus -i) it runs the collective
// out of place and in place, checks the result against verifiable inputs
// (-c 1, exact small integers), times -n iterations after -w warm-up ones,
// and prints time, algbw and busbw as nccl-tests defines them, plus busbw as
// a fraction of this machine's single-core memcpy bandwidth measured at
// start. With --device cuda the buffers are in GPU memory, the calls go on a
// CUDA stream, and the reference is the GPU's device-to-device cudaMemcpy
// bandwidth. nccl-tests' flags keep their meanings; the few that have none
// here (threads per process, several GPUs per rank, CUDA graphs) are refused
// by name unless given their neutral value.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <new>
#include <utility>

#include "runtime/config.h"
#include "runtime/errors.h"
#include "tools/bench/bench.h"
#include "tools/decimal_flag.h"

using namespace braid;

namespace {

struct Flags {
  std::string min_bytes = "8", max_bytes = "64M", step_bytes = "0", dtype = "f32", op = "sum", device = "cpu";
  std::string memcpy_bytes = "256M";
  int registered = 0, threads = 1, gpus = 1, parallel_init = 0, cuda_graphs = 0, blocking = 0, cpu_time = 0;
  int null_stream = 0;
};

// CLI11's PositiveNumber and NonNegativeNumber said "Value 0 not in range
// 0.000000 to 1797693134862315708...", the largest double in 310 digits.
const CLI::Range kAtLeastOne(1, std::numeric_limits<int>::max());
const CLI::Range kAtLeastZero(0, std::numeric_limits<int>::max());

void add_flags(CLI::App& app, comm::BenchOptions& o, Flags& f) {
  // A flag given twice takes the last value, as nccl-tests' getopt does
  // (scripts append overrides to a base list); CLI11 refused it.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("-b,--minbytes", f.min_bytes, "smallest message (bytes, K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", f.max_bytes, "largest message")->capture_default_str();
  app.add_option("-i,--stepbytes", f.step_bytes, "grow sizes by this many bytes instead of by -f (0: use -f)")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "size multiplier between rows")->transform(braid::tools::decimal(o.factor))
      ->check(CLI::Range(2, 1024))
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->transform(braid::tools::decimal(o.iters))->check(kAtLeastOne)->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations per size")->transform(braid::tools::decimal(o.warmup))->check(kAtLeastZero)
      ->capture_default_str();
  app.add_option("-m,--agg_iters", o.agg_iters, "calls issued back to back in each timed iteration")->transform(braid::tools::decimal(o.agg_iters))
      ->check(kAtLeastOne)->capture_default_str();
  app.add_option("-N,--run_cycles", o.cycles, "run the whole sweep this many times (0: until stopped)")->transform(braid::tools::decimal(o.cycles))
      ->check(kAtLeastZero)->capture_default_str();
  app.add_option("-c,--check", o.check, "verify results (0 or 1)")->transform(braid::tools::decimal(o.check))->check(CLI::Range(0, 1))->capture_default_str();
  app.add_option("-o,--op", f.op, "sum|prod|min|max|avg|band|bor|bxor|all (band, bor and bxor: integer types only)")->capture_default_str();
  app.add_option("-d,--datatype", f.dtype, "f32|f64|f16|bf16|i8|u8|i32|i64|all")->capture_default_str();
  app.add_option("-r,--root", o.root, "root of broadcast and reduce")->transform(braid::tools::decimal(o.root))->check(kAtLeastZero)
      ->capture_default_str();
  app.add_option("-a,--average", o.average, "time over ranks: 0 rank 0, 1 mean, 2 min, 3 max")->transform(braid::tools::decimal(o.average))
      ->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("-z,--blocking", f.blocking, "1: wait for each call before issuing the next")->transform(braid::tools::decimal(f.blocking))
      ->check(CLI::Range(0, 1))->capture_default_str();
  app.add_option("-C,--report_cputime", f.cpu_time, "1: time until the calls are issued, not until they complete")->transform(braid::tools::decimal(f.cpu_time))
      ->check(CLI::Range(0, 1))->capture_default_str();
  // BRAID_TIMEOUT's own range: -T 0.0001 ran with a timeout of 1 ms, without a word.
  app.add_option("-T,--timeout", o.timeout_s, "seconds any wait may take (BRAID_TIMEOUT for this run; 0: as set)")
      ->check(CLI::Number)
      ->check(CLI::Validator(
          [](std::string& value) {
            const double seconds = std::strtod(value.c_str(), nullptr);
            return seconds == 0 || (seconds >= 0.001 && seconds <= 1e7)
                       ? std::string()
                       : "must be 0 (BRAID_TIMEOUT as set) or seconds from 0.001 to 1e7, not " + value;
          },
          "SECONDS"))
      ->capture_default_str();
  app.add_option("-y,--stream_null", f.null_stream, "1: --device cuda calls on the default (null) stream")->transform(braid::tools::decimal(f.null_stream))
      ->check(CLI::Range(0, 1))->capture_default_str();
  app.add_option("-t,--nthreads", f.threads, "threads per process (braid: one rank per process, so 1)")->transform(braid::tools::decimal(f.threads))
      ->capture_default_str();
  app.add_option("-g,--ngpus", f.gpus, "GPUs per thread (braid: one device per rank, so 1)")->transform(braid::tools::decimal(f.gpus))->capture_default_str();
  app.add_option("-p,--parallel_init", f.parallel_init, "0 (with one rank per process there is nothing to parallelize)")->transform(braid::tools::decimal(f.parallel_init))
      ->capture_default_str();
  app.add_option("-G,--cudagraph", f.cuda_graphs, "0 (CUDA graph capture is not built into braid)")->transform(braid::tools::decimal(f.cuda_graphs))
      ->capture_default_str();
  app.add_option("--coll", o.collective, "all_reduce|reduce_scatter|all_gather|broadcast|reduce|all_to_all|send_recv")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
                             "send_recv"}))
      ->capture_default_str();
  app.add_option("-R,--registered", f.registered,
                 "1: host buffers from Communicator::allocate, which the local ranks map into each other "
                 "(all_reduce then runs the direct algorithm on one host)")
      ->transform(braid::tools::decimal(f.registered))
      ->check(CLI::Range(0, 1))->capture_default_str();
  app.add_option("--device", f.device, "cpu: host buffers; cuda: GPU buffers on a CUDA stream (GPU local_rank mod GPUs)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--memcpy_bytes", f.memcpy_bytes,
                 "size of the copies that measure the memcpy baseline of the /mcpy columns (0: none, /mcpy reads "
                 "N/A; in an emulated VM the default's page faults take seconds)")
      ->capture_default_str();
  app.add_option("-J,--json,--output_file", o.json_path, "write the run's parameters and every row as JSON to this file");
  app.add_option("--csv", o.csv_path, "write every row, every column, as CSV to this file");
}

// nccl-tests flags whose meaning braid has no counterpart for: only their
// neutral value is accepted.
void refuse_meaningless(const Flags& f) {
  if (f.threads != 1)
    throw InvalidUsage("-t " + std::to_string(f.threads) + ": braid runs one rank per process; start more ranks "
                       "with braid-launch --nproc-per-node instead of threads");
  if (f.gpus != 1)
    throw InvalidUsage("-g " + std::to_string(f.gpus) + ": each braid rank drives one device; start one rank "
                       "per GPU with braid-launch --nproc-per-node");
  if (f.parallel_init != 0) throw InvalidUsage("-p 1: with one rank per process there is nothing to initialize in parallel");
  if (f.cuda_graphs != 0) throw InvalidUsage("-G " + std::to_string(f.cuda_graphs) + ": CUDA graph capture of braid calls is not supported");
  if (f.null_stream && f.device != "cuda") throw InvalidUsage("-y 1 chooses a CUDA stream; it needs --device cuda");
}

template <typename T, typename Parse>
std::vector<T> parse_list(const std::string& text, const std::vector<std::string>& all, Parse parse, const char* what) {
  std::vector<T> values;
  for (const std::string& each : text == "all" ? all : std::vector<std::string>{text}) {
    auto value = parse(each);
    if (!value) throw InvalidUsage("unknown " + std::string(what) + " '" + each + "'");
    values.push_back(*value);
  }
  return values;
}

void fill_options(comm::BenchOptions& o, const Flags& f, const CLI::App& app) {
  refuse_meaningless(f);
  const bool factor_given = app.get_option("-f")->count() > 0;
  // `-J "$OUT"` with OUT unset wrote no file, without a word.
  for (const auto& [flag, path] : {std::pair{"--json", &o.json_path}, std::pair{"--csv", &o.csv_path}})
    if (app.get_option(flag)->count() > 0 && path->empty())
      throw InvalidUsage(std::string(flag) + " is empty (an unset shell variable?): give a file, or leave it out");
  // Both written to one file: the CSV over the JSON's start, exit 0.
  if (!o.json_path.empty() && !o.csv_path.empty()) {
    std::error_code ec_json, ec_csv;
    const auto json = std::filesystem::weakly_canonical(o.json_path, ec_json);
    const auto csv = std::filesystem::weakly_canonical(o.csv_path, ec_csv);
    if (o.json_path == o.csv_path || (!ec_json && !ec_csv && json == csv))
      throw InvalidUsage("--json and --csv both name " + o.csv_path + ": give each a file of its own");
  }
  o.min_bytes = runtime::parse_bytes(f.min_bytes);
  o.max_bytes = runtime::parse_bytes(f.max_bytes);
  o.step_bytes = runtime::parse_bytes(f.step_bytes);
  o.memcpy_bytes = runtime::parse_bytes(f.memcpy_bytes);
  if (o.memcpy_bytes > 0 && o.memcpy_bytes < 4096)
    throw InvalidUsage("--memcpy_bytes " + f.memcpy_bytes + ": give 0 (no baseline) or at least 4K; copies of "
                       "fewer bytes time the call, not the memory");
  o.dtypes = parse_list<DataType>(f.dtype, {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"},
                                  [](const std::string& s) { return parse_dtype(s); }, "datatype");
  o.ops = parse_list<ReduceOp>(f.op, {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"},
                               [](const std::string& s) { return parse_reduce_op(s); }, "op");
  if (o.min_bytes > o.max_bytes) throw InvalidUsage("-b must not exceed -e");
  // nccl-tests steps by -f where both are given; braid's -f has a default
  // (2), so -i wins over it, and an -f given beside -i was dropped without
  // a word.
  if (o.step_bytes > 0 && factor_given)
    throw InvalidUsage("-i " + f.step_bytes + " and -f " + std::to_string(o.factor) +
                       " both set the step between sizes: give one (-i adds bytes, -f multiplies)");
  // -N 0 runs until stopped, so the files, written at the end, stayed empty.
  if (o.cycles == 0 && (!o.json_path.empty() || !o.csv_path.empty()))
    throw InvalidUsage("-N 0 runs the sweep until stopped, and --json and --csv are written at the end: give -N a "
                       "number of cycles to write them");
  // Sizes whose buffers (up to ranks x -e bytes, rounded up to 2 MiB) would
  // wrap a 64-bit size: -e 2^64 - 1 allocated 0 bytes and wrote past them.
  constexpr std::size_t kLargest = std::size_t{1} << 48;
  if (o.max_bytes > kLargest || o.step_bytes > kLargest)
    throw InvalidUsage("-e and -i must not exceed 256 TiB (" + std::to_string(kLargest) + " bytes)");
  // -i 1 up to -e 1G listed 2^30 sizes (8 GiB of them, twice) before any
  // other check, and ended in std::bad_alloc (a review helper's case).
  constexpr std::size_t kMostSizes = 100000;
  if (o.step_bytes > 0 && (o.max_bytes - o.min_bytes) / o.step_bytes >= kMostSizes)
    throw InvalidUsage("-i " + f.step_bytes + " from -b " + f.min_bytes + " to -e " + f.max_bytes + " is " +
                       std::to_string((o.max_bytes - o.min_bytes) / o.step_bytes + 1) + " sizes, more than " +
                       std::to_string(kMostSizes) + ": give a larger -i, or -f to multiply");
  o.blocking = f.blocking == 1;
  o.cpu_time = f.cpu_time == 1;
  o.null_stream = f.null_stream == 1;
  o.cuda = f.device == "cuda";
  o.registered = f.registered == 1;
  if (o.registered && o.cuda) throw InvalidUsage("-R 1 registers host buffers; it does not combine with --device cuda");
}

}  // namespace

int main(int argc, char** argv) {
  comm::BenchOptions o;
  Flags f;
  CLI::App app{"braid-bench: collective bandwidth and latency, nccl-tests style"};
  add_flags(app, o, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; every argument error is 2, as in the other tools
  }
  try {
    fill_options(o, f, app);
    return comm::run_bench(o);
  } catch (const InvalidUsage& e) {
    std::fprintf(stderr, "braid-bench: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "braid-bench: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {  // aborted with a core dump
    std::fprintf(stderr, "braid-bench: failed: out of memory (lower -e, or start fewer ranks on this host)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-bench: failed: %s\n", e.what());
    return 1;
  }
}
