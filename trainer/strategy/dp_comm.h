// Communication helpers of the data-parallel family (dp, ddp, zero): small
// sums over ranks through the strategy's meter (comm_meter.h), and gradient
// buckets with the bookkeeping that says when one is complete.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "trainer/strategy/comm_meter.h"
#include "trainer/model/flat_buffer.h"
#include "trainer/model/param_table.h"

namespace braid::trainer {

// Sums `values` over the ranks, in place, and waits.
void all_reduce_sum(CommMeter& meter, std::span<double> values);

// Part `index` of `whole` cut into `parts` near-equal pieces (the first
// whole.count % parts pieces one element longer): which rank answers for
// which part of a buffer every rank holds (checkpoints, whole-tensor reads).
Range even_part(Range whole, int parts, int index);

// Gradient buckets: consecutive whole units, taken from the last unit
// backwards (the order backward finishes them) until a bucket holds at least
// `bucket_bytes`. Index 0 is the bucket backward completes first. A unit
// larger than the target is a bucket of its own; units are never cut, so a
// bucket is ready exactly when its units have all fired grads_ready. The
// embedding unit is always a bucket of its own: the head's backward writes
// its tied wte first thing, so it is open for the whole backward, and
// bucketing it with blocks would hold their gradients back (DDP) or keep
// them staged (ZeRO-2) until the very end.
std::vector<Range> plan_buckets(const ParamTable& table, std::size_t bucket_bytes);

// One bucket per unit, in backward order (ZeRO-3's groups).
std::vector<Range> unit_buckets(const ParamTable& table);

// "2 bucket(s), the largest 2359296 bytes (--bucket-mb: 26214400)": what a
// start line says of `buckets` of f32 gradients. It said "of >= 26214400
// bytes" of buckets that a small model cannot fill.
std::string describe_buckets(const std::vector<Range>& buckets, std::size_t bucket_bytes);

// Counts, per micro-batch, the units of each bucket whose gradients backward
// has finished, and which buckets the step has launched. A bucket holding a
// held-back unit (the pipeline's tied embedding, final only after the sum
// over the stages) is never reported complete: the strategy launches it with
// the rest of unlaunched() after the backward.
class BucketTracker {
 public:
  BucketTracker(const ParamTable& table, std::vector<Range> buckets);

  const std::vector<Range>& buckets() const { return buckets_; }
  int bucket_of(int unit) const { return bucket_of_unit_[unit]; }
  void hold_back(int unit) { held_back_.at(static_cast<std::size_t>(bucket_of_unit_.at(unit))) = true; }
  // Marks `unit` finished; returns the bucket this completes (unless held
  // back), or -1.
  int finish(int unit);
  // Starts the next micro-batch; the first of a step also forgets launches.
  void reset(bool new_step);
  void launched(int bucket) { launched_[static_cast<std::size_t>(bucket)] = true; }
  // The buckets not launched yet this step.
  std::vector<int> unlaunched() const;

 private:
  std::vector<Range> buckets_;
  std::vector<int> bucket_of_unit_;
  std::vector<int> units_per_bucket_;
  std::vector<int> remaining_;
  std::vector<bool> held_back_, launched_;
};

}  // namespace braid::trainer
