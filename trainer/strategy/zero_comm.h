// ZeRO's partition and its two communication patterns (Rajbhandari et al.,
// "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// SC 2020): the reduce-scatter of gradient buckets into shards, and the
// all-gather of a unit's parameters just before it is used.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

#include "comm/communicator.h"
#include "trainer/model/flat_buffer.h"
#include "trainer/model/hooks.h"
#include "trainer/model/param_table.h"
#include "trainer/strategy/comm_memory.h"
#include "trainer/strategy/dp_comm.h"

namespace braid::trainer {

// The partition. A group is a Range of whole units (a gradient bucket for
// stages 1 and 2, a single unit for stage 3) whose count is a multiple of N
// (the table pads every unit to a multiple of N). Rank r owns chunk r of
// every group, [offset + r * count / N, + count / N): equal chunks, so every
// reduce-scatter and all-gather has one count on all ranks. This rank's
// shard is its chunks back to back, in group order.
class ZeroPartition {
 public:
  ZeroPartition(std::vector<Range> groups, int world_size, int rank);

  const std::vector<Range>& groups() const { return groups_; }
  Range chunk(std::size_t group) const;
  std::vector<Range> chunks() const;
  // Where chunk(g) starts in the shard.
  std::size_t shard_offset(std::size_t group) const { return shard_offsets_[group]; }
  std::size_t shard_count() const { return shard_offsets_.back(); }

 private:
  std::vector<Range> groups_;
  int world_size_, rank_;
  std::vector<std::size_t> shard_offsets_;
};

// Buffers charged to kCommunication and reused rather than freed: the
// staging buckets and gathered units. acquire() hands out the smallest free
// buffer that is large enough, or allocates one of exactly `count`; as the
// same groups ask for the same sizes every step, the pool settles after
// the first. The buffers come from `memory` (registered where it can).
class BufferPool {
 public:
  BufferPool(MemoryAccount* account, const CommMemory& memory) : account_(account), memory_(&memory) {}
  float* acquire(std::size_t count);
  void release(float* buffer);

 private:
  MemoryAccount* account_;
  const CommMemory* memory_;
  std::vector<FlatBuffer> all_;
  std::vector<bool> in_use_;
};

// ZeRO-2/3 gradients: this rank keeps only its shard of them. Backward
// writes each group's gradients into a staging buffer lent through
// unit_grads(); once all the group's units are finished its reduce-scatter
// is issued in place, and once that has completed, this rank's reduced
// chunk is added into the shard. A staging buffer opens when backward first
// asks for one of the group's units (the head's backward already writes the
// tied wte of the embedding's group) and circulates again after its chunk
// is harvested: about three buckets are live, the one backward writes, one
// or two in flight, and the embedding's.
class ShardedGradients {
 public:
  ShardedGradients(const ZeroPartition& partition, const ParamTable& table, CommMeter& meter,
                   MemoryAccount* account, const CommMemory& memory);

  float* shard() { return shard_.data(); }
  FlatBuffer& shard_buffer() { return shard_; }
  void zero_shard() { shard_.zero(); }
  void begin_micro_batch() { tracker_.reset(false); }
  // For ModelHooks::unit_grads and grads_ready.
  float* lend(int unit);
  void unit_finished(int unit);
  // Waits for every issued reduce-scatter and harvests it: the shard then
  // holds the sum over ranks of every micro-batch so far.
  void drain();

 private:
  struct Staged {
    int group;
    float* staging;
    comm::Work work;  // its reduce-scatter, once issued
  };
  static constexpr std::size_t kMaxInFlight = 2;
  Staged& open(int group);
  void harvest_oldest();

  const ZeroPartition& partition_;
  const ParamTable& table_;
  CommMeter& meter_;
  BucketTracker tracker_;
  FlatBuffer shard_;
  BufferPool pool_;
  std::vector<Staged> open_;     // being written by backward
  std::deque<Staged> issued_;    // reduce-scattering, in issue order
};

// ZeRO-3 parameters: this rank keeps its chunk of every unit (the groups
// are single units); a unit is all-gathered into a pooled buffer before each
// use and freed after it. The order of uses is known in advance (the
// schedule: the forward pass, then the backward pass, with the head
// announcing the tied embedding in both), so while a unit computes, the
// gather of the next one is already issued: the prefetch. A unit used again
// within the next two uses stays gathered: the head and the embedding it
// borrows wte from are not dropped between the end of forward and the
// start of backward. Nothing stays gathered across an optimizer step, nor
// from forward-only passes into training.
class UnitGatherer {
 public:
  UnitGatherer(const ZeroPartition& partition, const ParamTable& table, CommMeter& meter, MemoryAccount* account,
               const CommMemory& memory);

  float* shard() { return shard_.data(); }
  FlatBuffer& shard_buffer() { return shard_; }
  // Training micro-batch (forward then backward; `last`: nothing follows in
  // this step) or forward-only passes (evaluation, generation, repeating).
  void begin_training(bool last);
  void begin_forward_only();
  void before_unit(int unit, Pass pass);
  void after_unit(int unit, Pass pass);
  float* lend(int unit) { return units_[unit].buffer; }
  // Waits for any gather in flight and frees every gathered unit (before
  // the shards change, and at the end of a pass sequence).
  void release_all();

 private:
  struct Use {
    int unit;
    Pass pass;
  };
  struct Gathered {
    float* buffer = nullptr;
    comm::Work work;  // the gather, until waited
    int users = 0;    // nested uses in progress
  };
  void follow(int unit, Pass pass);
  void gather(int unit);
  bool used_soon(int unit) const;
  const Use* upcoming(std::size_t ahead) const;

  const ZeroPartition& partition_;
  CommMeter& meter_;
  FlatBuffer shard_;
  BufferPool pool_;
  std::vector<Gathered> units_;
  std::vector<int> group_of_unit_;
  std::vector<Use> train_schedule_, forward_schedule_;
  const std::vector<Use>* schedule_ = &train_schedule_;
  bool wraps_ = false;    // the schedule repeats after its last use
  std::size_t next_ = 0;  // index of the next expected use
};

}  // namespace braid::trainer
