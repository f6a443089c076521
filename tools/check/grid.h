// braid-check's cases: one collective call with its dtype, op, count, root
// and placement, run on the world communicator and checked element by
// element against tools/check/values.h. Every rank runs the same list of
// cases in the same order (the list depends only on the options and the
// number of ranks), so the calls match across ranks.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace braid::check {

enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, send_recv, barrier };

struct Case {
  Kind kind = Kind::all_reduce;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  std::size_t count = 0;  // as the call takes it (NCCL's meaning: per rank for reduce_scatter, all_gather, all_to_all)
  bool in_place = false;
  int root = 0;           // broadcast and reduce
};

std::string name(Kind kind);
bool parse_kind(const std::string& text, Kind& kind);
bool reduces(Kind kind);
// "all_reduce bf16 max count 97 in place"
std::string describe(const Case& c);

// The grid: every kind x dtype x (op, for kinds that reduce) x count x
// (out of place, in place where the kind has it), roots taking turns; then,
// when large_count > 0, each kind once out of place and once in place at
// large_count, the dtype and op taking turns across kinds (large buffers
// cost emulated CPUs seconds each).
struct GridSpec {
  std::vector<Kind> kinds;
  std::vector<DataType> dtypes;
  std::vector<ReduceOp> ops;
  std::vector<std::size_t> counts;
  std::size_t large_count = 0;
};
std::vector<Case> make_grid(const GridSpec& spec, int ranks);

struct Outcome {
  std::size_t wrong = 0;              // elements that differ from the expectation
  std::vector<std::string> examples;  // the first few, "recv[5]: expected 7, got 6"
  bool checked = true;                // false: the call ran, nothing could be compared (a barrier without a folder)
};

class Checker {
 public:
  // registered: buffers from Communicator::allocate instead of the heap.
  // barrier_dir: a folder every rank sees (may be empty: the barrier then
  // runs without its ordering check). A collective: every rank constructs
  // its Checker at the same point.
  Checker(comm::Communicator& comm, bool registered, std::string barrier_dir);
  // Runs one case; a failed call throws braid's error.
  Outcome run(const Case& c);
  // After the last case, on every rank: removes this rank's barrier marks.
  void tidy();

 private:
  Outcome all_reduce(const Case& c);
  Outcome reduce_scatter(const Case& c);
  Outcome all_gather(const Case& c);
  Outcome broadcast(const Case& c);
  Outcome reduce(const Case& c);
  Outcome all_to_all(const Case& c);
  Outcome send_recv(const Case& c);
  Outcome barrier();
  // This run's mark of `rank` for barrier `round` in barrier_dir_.
  std::filesystem::path mark(int round, int rank) const;

  comm::Communicator& comm_;
  int rank_, ranks_;
  bool registered_;
  std::string barrier_dir_;
  std::string mark_prefix_;  // "barrier.<rank 0's draw>": this run's marks in barrier_dir_
  int barrier_round_ = 0;
};

}  // namespace braid::check
