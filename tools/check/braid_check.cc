// braid-check: runs the collective grid on the job's ranks and checks every
// element of every result against an expectation computed without braid.
//
//   braid-launch --nproc-per-node 2 -- braid-check --counts 0,1,97,1025 --large 1000000
//
// The grid is every collective x dtype (f32, bf16, i64) x op (sum, max, avg,
// for those that reduce) x count x out of place and in place, roots taking
// turns (tools/check/grid.h); inputs are small numbers exact in their
// dtype (tools/check/values.h), so results compare bit for bit, and each
// buffer's guard bytes show a write past either end. Each rank prints
// the cases it found wrong, with examples, and a summary; the exit status
// is 0 only when every case on this rank was right.
//
// --expect-transport checks which transport reaches each peer before the grid
// runs (ibverbs: every peer; auto: shm within this host, ibverbs to other
// hosts). --expect-mismatch runs one call that differs across ranks (rank 0
// against the others: count, or collective) and succeeds only if the call
// fails with braid's "mismatched collectives" error (or this rank's set-up
// does, told by a peer that already found it): never wrong data, never a
// hang.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/errors.h"
#include "tools/check/grid.h"
#include "tools/check/values.h"
#include "tools/decimal_flag.h"

using namespace braid;

namespace {

struct Options {
  std::vector<std::string> kinds{"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                 "reduce",     "all_to_all",     "send_recv",  "barrier"};
  std::vector<std::string> dtypes{"f32", "bf16", "i64"};
  std::vector<std::string> ops{"sum", "max", "avg"};
  std::vector<std::size_t> counts{0, 1, 97, 1025};
  std::size_t large_count = 0;
  bool registered = false, verbose = false;
  std::string barrier_dir, expect_transport = "any", expect_mismatch;
  std::size_t mismatch_count = 1000;
};

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--colls", o.kinds, "collectives (comma list)")->delimiter(',')->capture_default_str();
  app.add_option("--dtypes", o.dtypes, "f32,bf16,i64 (the ones the value model is exact for)")->delimiter(',')
      ->capture_default_str();
  app.add_option("--ops", o.ops, "sum,max,avg")->delimiter(',')->capture_default_str();
  app.add_option("--counts", o.counts, "element counts of the full grid")->delimiter(',')
      ->transform(braid::tools::decimal(std::size_t{}))->capture_default_str();
  app.add_option("--large", o.large_count, "one large case per collective, in and out of place (0: none)")
      ->transform(braid::tools::decimal(o.large_count))
      ->capture_default_str();
  app.add_flag("--registered", o.registered, "buffers from Communicator::allocate instead of the heap");
  app.add_option("--barrier-dir", o.barrier_dir, "a folder every rank sees: the barrier's ordering check uses it")
      ->check(CLI::ExistingDirectory);
  app.add_option("--expect-transport", o.expect_transport, "any | ibverbs (every peer) | auto (shm on this host, "
                 "ibverbs to other hosts)")->check(CLI::IsMember({"any", "ibverbs", "auto"}))->capture_default_str();
  app.add_option("--expect-mismatch", o.expect_mismatch, "count | kind: run one mismatched call instead of the grid")
      ->check(CLI::IsMember({"count", "kind"}));
  app.add_option("--mismatch-count", o.mismatch_count, "count of the mismatched call (rank 0; the others +1)")
      ->transform(braid::tools::decimal(o.mismatch_count))
      ->capture_default_str();
  app.add_flag("-v,--verbose", o.verbose, "print every case, not only the wrong ones");
}

check::GridSpec grid_spec(const Options& o, int ranks) {
  check::GridSpec spec;
  for (const auto& text : o.kinds) {
    check::Kind kind;
    if (!check::parse_kind(text, kind)) throw InvalidUsage("unknown collective '" + text + "'");
    spec.kinds.push_back(kind);
  }
  for (const auto& text : o.dtypes) {
    auto dtype = parse_dtype(text);
    if (!dtype || !check::supported(*dtype)) throw InvalidUsage("dtype '" + text + "': braid-check knows f32, bf16, i64");
    spec.dtypes.push_back(*dtype);
  }
  for (const auto& text : o.ops) {
    auto op = parse_reduce_op(text);
    if (!op || !check::supported(*op)) throw InvalidUsage("op '" + text + "': braid-check knows sum, max, avg");
    spec.ops.push_back(*op);
  }
  if (spec.kinds.empty() || spec.dtypes.empty() || spec.ops.empty())
    throw InvalidUsage("--colls, --dtypes and --ops must each name at least one");
  // bf16 holds integers exactly up to 256: the largest sum is ranks * (6 + 2 (ranks - 1)).
  // f32's 24 bits hold that sum with 8 bits of fraction (values.h) up to 128 ranks.
  for (DataType dtype : spec.dtypes) {
    if (dtype == DataType::bf16 && ranks > 10)
      throw InvalidUsage("bf16 sums of " + std::to_string(ranks) + " ranks are not exact; at most 10 ranks with bf16");
    if (dtype == DataType::f32 && ranks > 128)
      throw InvalidUsage("f32 sums of " + std::to_string(ranks) + " ranks are not exact; at most 128 ranks with "
                         "f32 (--dtypes i64 checks any number)");
  }
  // Counts whose buffers (ranks x count x 8 bytes) would wrap a 64-bit
  // size: --large 2^62 allocated 64 bytes and wrote past them.
  constexpr std::size_t kLargest = std::size_t{1} << 45;
  for (std::size_t count : o.counts)
    if (count > kLargest) throw InvalidUsage("--counts must not exceed 2^45 (" + std::to_string(kLargest) + ")");
  if (o.large_count > kLargest || o.mismatch_count > kLargest)
    throw InvalidUsage("--large and --mismatch-count must not exceed 2^45 (" + std::to_string(kLargest) + ")");
  spec.counts = o.counts;
  spec.large_count = o.large_count;
  return spec;
}

// Which transport reaches each peer; false (and why, printed) when it is not
// the one expected.
bool transports_as_expected(const comm::Communicator& comm, const std::string& expected) {
  const int me = comm.rank();
  std::string seen;
  bool ok = true;
  for (int peer = 0; peer < comm.size(); ++peer) {
    if (peer == me) continue;
    const std::string actual = comm.transport_of(peer);
    const bool same_host = comm.host_index(peer) == comm.host_index(me);
    const std::string wanted = expected == "ibverbs" ? "ibverbs" : same_host ? "shm" : "ibverbs";
    seen += " " + std::to_string(peer) + (same_host ? "(this host):" : "(host " + std::to_string(comm.host_index(peer)) + "):") + actual;
    if (expected != "any" && actual != wanted) {
      std::printf("braid-check: rank %d: WRONG transport to rank %d: %s, expected %s (--expect-transport %s)\n", me,
                  peer, actual.c_str(), wanted.c_str(), expected.c_str());
      ok = false;
    }
  }
  std::printf("braid-check: rank %d/%d on host %d, transports to ranks:%s\n", me, comm.size(), comm.host_index(me),
              seen.c_str());
  return ok;
}

int run_grid(comm::Communicator& comm, const Options& o, bool transports_ok) {
  const auto grid = check::make_grid(grid_spec(o, comm.size()), comm.size());
  check::Checker checker(comm, o.registered, o.barrier_dir);
  std::size_t wrong_cases = 0, wrong_elements = 0, unchecked = 0;
  for (const auto& c : grid) {
    check::Outcome outcome;
    try {
      outcome = checker.run(c);
    } catch (const Error&) {
      std::fprintf(stderr, "braid-check: rank %d: %s failed:\n", comm.rank(), check::describe(c).c_str());
      throw;
    }
    if (!outcome.checked) {
      ++unchecked;
      if (o.verbose)
        std::printf("braid-check: rank %d: ran %s, not checked (give --barrier-dir)\n", comm.rank(),
                    check::describe(c).c_str());
      continue;
    }
    if (outcome.wrong == 0) {
      if (o.verbose) std::printf("braid-check: rank %d: ok %s\n", comm.rank(), check::describe(c).c_str());
      continue;
    }
    ++wrong_cases;
    wrong_elements += outcome.wrong;
    std::string examples;
    for (const auto& e : outcome.examples) examples += "; " + e;
    std::printf("braid-check: rank %d: WRONG %s: %zu element(s)%s\n", comm.rank(), check::describe(c).c_str(),
                outcome.wrong, examples.c_str());
  }
  checker.tidy();
  // A barrier without --barrier-dir ran but proved nothing: it printed
  // "ok barrier" and counted as checked (a review helper's case).
  const std::string not_checked =
      unchecked ? "; " + std::to_string(unchecked) + " barrier round(s) ran unchecked (give --barrier-dir)" : "";
  std::printf("braid-check: rank %d: %zu cases, %zu wrong (%zu wrong elements)%s%s\n", comm.rank(),
              grid.size() - unchecked, wrong_cases, wrong_elements, not_checked.c_str(),
              transports_ok ? "" : "; transports not as expected");
  std::fflush(stdout);
  return wrong_cases == 0 && transports_ok ? 0 : 1;
}

// Whether `e` is braid's error for ranks whose calls differ.
bool names_mismatch(const Error& e) { return std::string(e.what()).find("mismatched collectives") != std::string::npos; }

// Rank 0 calls one thing, the others another; both sides must fail naming
// the mismatch.
int run_mismatch(comm::Communicator& comm, const Options& o) {
  const std::size_t n = o.mismatch_count, ranks = comm.size();
  std::vector<float> send((n + 1) * ranks, 1.0f), recv((n + 1) * ranks);
  const bool first = comm.rank() == 0;
  const std::string call = o.expect_mismatch == "count"
                               ? "all_reduce f32 sum count " + std::to_string(first ? n : n + 1)
                               : first ? "all_reduce f32 sum count " + std::to_string(n)
                                       : "all_gather f32 count " + std::to_string(n);
  try {
    if (o.expect_mismatch == "count")
      comm.all_reduce(send.data(), recv.data(), first ? n : n + 1, DataType::f32, ReduceOp::sum).wait();
    else if (first)
      comm.all_reduce(send.data(), recv.data(), n, DataType::f32, ReduceOp::sum).wait();
    else
      comm.all_gather(send.data(), recv.data(), n, DataType::f32).wait();
  } catch (const Error& e) {
    const bool named = names_mismatch(e);
    std::printf("braid-check: rank %d: %s failed%s: %s\n", comm.rank(), call.c_str(),
                named ? " as expected" : ", but not naming the mismatch", e.what());
    return named ? 0 : 1;
  }
  std::printf("braid-check: rank %d: WRONG: %s completed although the ranks' calls differ\n", comm.rank(),
              call.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"braid-check: the collective grid, every element checked against an independent expectation"};
  add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  int rank = -1;
  try {
    const auto info = runtime::rank_info_from_env();
    rank = info.rank;
    auto comm = comm::Communicator::create_world(info);
    const bool transports_ok = transports_as_expected(*comm, o.expect_transport);
    std::fflush(stdout);
    // A wrong transport fails the run in either mode (the mismatch mode
    // dropped it and exited 0).
    // One rank has no peer to differ from: its call completed and was
    // reported as braid's fault (a review helper's case).
    if (!o.expect_mismatch.empty() && comm->size() < 2)
      throw InvalidUsage("--expect-mismatch needs at least 2 ranks (start braid-check under braid-launch "
                         "--nproc-per-node 2 or more)");
    if (!o.expect_mismatch.empty()) return std::max(run_mismatch(*comm, o), transports_ok ? 0 : 1);
    return run_grid(*comm, o, transports_ok);
  } catch (const InvalidUsage& e) {
    std::fprintf(stderr, "braid-check: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    // Set-up is no barrier: a rank still connecting may hear from a peer
    // that already made its call, found the mismatch and stopped; its
    // set-up then fails naming that, which is as expected too.
    if (!o.expect_mismatch.empty() && names_mismatch(e)) {
      std::printf("braid-check: rank %d: set-up, before its own call, failed as expected: %s\n", rank, e.what());
      return 0;
    }
    std::fprintf(stderr, "braid-check: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // --counts or --large past what this machine holds (an uncaught
    // bad_alloc aborted).
    std::fprintf(stderr, "braid-check: rank %d: out of memory for the buffers of the grid; lower --counts or --large\n",
                 rank);
    return 2;
  }
}
