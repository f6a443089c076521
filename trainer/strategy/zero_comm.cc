#include "trainer/strategy/zero_comm.h"

#include <algorithm>

#include "runtime/errors.h"

namespace braid::trainer {

ZeroPartition::ZeroPartition(std::vector<Range> groups, int world_size, int rank)
    : groups_(std::move(groups)), world_size_(world_size), rank_(rank) {
  std::size_t offset = 0;
  for (const Range& g : groups_) {
    if (g.count % static_cast<std::size_t>(world_size_) != 0) {
      throw InvalidUsage("a ZeRO group of " + std::to_string(g.count) + " elements does not split into " +
                         std::to_string(world_size_) + " equal chunks; pad the units to a multiple of N");
    }
    shard_offsets_.push_back(offset);
    offset += g.count / world_size_;
  }
  shard_offsets_.push_back(offset);
}

Range ZeroPartition::chunk(std::size_t group) const {
  const std::size_t c = groups_[group].count / world_size_;
  return Range{groups_[group].offset + rank_ * c, c};
}

std::vector<Range> ZeroPartition::chunks() const {
  std::vector<Range> all;
  for (std::size_t g = 0; g < groups_.size(); ++g) all.push_back(chunk(g));
  return all;
}

float* BufferPool::acquire(std::size_t count) {
  std::size_t best = all_.size();
  for (std::size_t i = 0; i < all_.size(); ++i) {
    if (in_use_[i] || all_[i].count() < count) continue;
    if (best == all_.size() || all_[i].count() < all_[best].count()) best = i;
  }
  if (best == all_.size()) {
    all_.push_back(memory_->allocate(count, MemoryCategory::kCommunication, account_));
    in_use_.push_back(false);
  }
  in_use_[best] = true;
  return all_[best].data();
}

void BufferPool::release(float* buffer) {
  for (std::size_t i = 0; i < all_.size(); ++i) {
    if (all_[i].data() == buffer) in_use_[i] = false;
  }
}

// ---------------------------------------------------------------------------
// ShardedGradients

ShardedGradients::ShardedGradients(const ZeroPartition& partition, const ParamTable& table, CommMeter& meter,
                                   MemoryAccount* account, const CommMemory& memory)
    : partition_(partition),
      table_(table),
      meter_(meter),
      tracker_(table, partition.groups()),
      shard_(memory.allocate(partition.shard_count(), MemoryCategory::kGradients, account)),
      pool_(account, memory) {}

float* ShardedGradients::lend(int unit) {
  const int g = tracker_.bucket_of(unit);
  auto it = std::find_if(open_.begin(), open_.end(), [&](const Staged& s) { return s.group == g; });
  Staged& staged = it != open_.end() ? *it : open(g);
  return staged.staging + (table_.units()[unit].range.offset - partition_.groups()[g].offset);
}

ShardedGradients::Staged& ShardedGradients::open(int group) {
  // Harvest what has already arrived, then bound what is in flight so that
  // staging stays a few buckets.
  while (!issued_.empty() && issued_.front().work.test()) harvest_oldest();
  while (issued_.size() >= kMaxInFlight) harvest_oldest();
  const std::size_t count = partition_.groups()[group].count;
  float* staging = pool_.acquire(count);
  shard_.backend().zero(staging, count * sizeof(float));
  open_.push_back(Staged{group, staging, {}});
  return open_.back();
}

void ShardedGradients::unit_finished(int unit) {
  const int g = tracker_.finish(unit);
  if (g < 0) return;
  auto it = std::find_if(open_.begin(), open_.end(), [&](const Staged& s) { return s.group == g; });
  if (it == open_.end()) {  // no gradient written: it reduces zeros
    open(g);
    it = open_.end() - 1;
  }
  Staged staged = *it;
  open_.erase(it);
  const Range chunk = partition_.chunk(g);
  const std::size_t mine = chunk.offset - partition_.groups()[g].offset;
  staged.work = meter_.issue_on_device([&](CommMeter::Calls& c, comm::Stream s) {
    return c.reduce_scatter(staged.staging, staged.staging + mine, chunk.count, DataType::f32, ReduceOp::sum, s);
  });
  issued_.push_back(std::move(staged));
}

void ShardedGradients::harvest_oldest() {
  Staged& staged = issued_.front();
  meter_.wait(staged.work);
  const Range chunk = partition_.chunk(staged.group);
  const float* reduced = staged.staging + (chunk.offset - partition_.groups()[staged.group].offset);
  float* into = shard_.data() + partition_.shard_offset(staged.group);
  shard_.backend().add(into, into, reduced, chunk.count);
  pool_.release(staged.staging);
  issued_.pop_front();
}

void ShardedGradients::drain() {
  if (!open_.empty()) {
    throw Error("ZeRO: backward left the gradients of " + std::to_string(open_.size()) +
                " bucket(s) unfinished; every unit must fire grads_ready");
  }
  while (!issued_.empty()) harvest_oldest();
}

// ---------------------------------------------------------------------------
// UnitGatherer

namespace {

// Uses of units by one forward pass, or one backward pass, in call order.
template <typename Use>
std::vector<Use> pass_schedule(const ParamTable& table, Pass pass) {
  const int e = table.embedding_unit(), head = table.head_unit();
  std::vector<int> blocks;
  for (int u = 0; u < static_cast<int>(table.units().size()); ++u) {
    if (u != e && u != head) blocks.push_back(u);
  }
  std::vector<Use> uses;
  auto add = [&](int u) {
    if (u >= 0) uses.push_back(Use{u, pass});
  };
  auto head_with_tied_wte = [&] {
    add(head);
    if (head >= 0) add(e);
  };
  if (pass == Pass::kForward) {
    add(e);
    for (int u : blocks) add(u);
    head_with_tied_wte();
  } else {
    head_with_tied_wte();
    for (auto u = blocks.rbegin(); u != blocks.rend(); ++u) add(*u);
    add(e);
  }
  return uses;
}

}  // namespace

UnitGatherer::UnitGatherer(const ZeroPartition& partition, const ParamTable& table, CommMeter& meter,
                           MemoryAccount* account, const CommMemory& memory)
    : partition_(partition),
      meter_(meter),
      shard_(memory.allocate(partition.shard_count(), MemoryCategory::kParameters, account)),
      pool_(account, memory),
      units_(table.units().size()),
      group_of_unit_(table.units().size(), -1) {
  for (std::size_t g = 0; g < partition.groups().size(); ++g) {
    for (std::size_t u = 0; u < table.units().size(); ++u) {
      if (table.units()[u].range == partition.groups()[g]) group_of_unit_[u] = static_cast<int>(g);
    }
  }
  forward_schedule_ = pass_schedule<Use>(table, Pass::kForward);
  train_schedule_ = forward_schedule_;
  for (const Use& use : pass_schedule<Use>(table, Pass::kBackward)) train_schedule_.push_back(use);
}

void UnitGatherer::begin_training(bool last) {
  // What forward-only passes (an evaluation between steps) left gathered,
  // the next window's first unit prefetched, is dropped: reused by the next
  // step, its gather was counted in no step, and that step's traffic fell
  // short of its theory (0.892 of it at --eval-interval 1; a review
  // helper's case).
  if (schedule_ == &forward_schedule_) release_all();
  schedule_ = &train_schedule_;
  wraps_ = !last;  // the next micro-batch's forward follows this backward
  next_ = 0;
}

void UnitGatherer::begin_forward_only() {
  schedule_ = &forward_schedule_;
  wraps_ = true;
  next_ = 0;
}

const UnitGatherer::Use* UnitGatherer::upcoming(std::size_t ahead) const {
  const std::size_t i = next_ + ahead, n = schedule_->size();
  if (i < n) return &(*schedule_)[i];
  return wraps_ && n > 0 ? &(*schedule_)[i % n] : nullptr;
}

void UnitGatherer::follow(int unit, Pass pass) {
  const std::size_t n = schedule_->size();
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = next_ + k;
    if (i >= n && !wraps_) return;
    const Use& use = (*schedule_)[i % n];
    if (use.unit == unit && use.pass == pass) {
      next_ = wraps_ ? (i + 1) % n : i + 1;
      return;
    }
  }
}

void UnitGatherer::gather(int unit) {
  const int g = group_of_unit_[unit];
  Gathered& gathered = units_[unit];
  gathered.buffer = pool_.acquire(partition_.groups()[g].count);
  const float* mine = shard_.data() + partition_.shard_offset(g);
  const std::size_t count = partition_.chunk(g).count;
  gathered.work = meter_.issue_on_device([&](CommMeter::Calls& c, comm::Stream s) {
    return c.all_gather(mine, gathered.buffer, count, DataType::f32, s);
  });
}

void UnitGatherer::before_unit(int unit, Pass pass) {
  follow(unit, pass);
  Gathered& gathered = units_[unit];
  if (gathered.buffer == nullptr) gather(unit);
  if (gathered.work.valid()) {
    meter_.wait(gathered.work);
    gathered.work = comm::Work();
  }
  ++gathered.users;
  // Prefetch: the next unit's gather runs while this one computes.
  const Use* next = upcoming(0);
  if (next != nullptr && units_[next->unit].buffer == nullptr) gather(next->unit);
}

bool UnitGatherer::used_soon(int unit) const {
  for (std::size_t ahead = 0; ahead < 2; ++ahead) {
    const Use* use = upcoming(ahead);
    if (use != nullptr && use->unit == unit) return true;
  }
  return false;
}

void UnitGatherer::after_unit(int unit, Pass) {
  Gathered& gathered = units_[unit];
  if (--gathered.users > 0 || used_soon(unit)) return;
  pool_.release(gathered.buffer);
  gathered.buffer = nullptr;
}

void UnitGatherer::release_all() {
  for (Gathered& gathered : units_) {
    if (gathered.work.valid()) meter_.wait(gathered.work);
    gathered.work = comm::Work();
    if (gathered.buffer != nullptr) pool_.release(gathered.buffer);
    gathered.buffer = nullptr;
    gathered.users = 0;
  }
}

}  // namespace braid::trainer
