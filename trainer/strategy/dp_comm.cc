#include "trainer/strategy/dp_comm.h"

#include <algorithm>

#include "runtime/errors.h"

namespace braid::trainer {

void all_reduce_sum(CommMeter& meter, std::span<double> values) {
  comm::Work work = meter.issue([&](CommMeter::Calls& c) {
    return c.all_reduce(values.data(), values.data(), values.size(), DataType::f64, ReduceOp::sum);
  });
  meter.wait(work);
}

Range even_part(Range whole, int parts, int index) {
  const std::size_t n = static_cast<std::size_t>(parts), i = static_cast<std::size_t>(index);
  const std::size_t base = whole.count / n, longer = whole.count % n;
  return Range{whole.offset + i * base + std::min(i, longer), base + (i < longer ? 1 : 0)};
}

std::vector<Range> plan_buckets(const ParamTable& table, std::size_t bucket_bytes) {
  std::vector<Range> buckets;
  const auto& units = table.units();
  std::size_t end = table.count(), begin = end;
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    if (u == table.embedding_unit()) continue;
    begin = units[u].range.offset;
    if ((end - begin) * sizeof(float) >= bucket_bytes) {
      buckets.push_back(Range{begin, end - begin});
      end = begin;
    }
  }
  if (end > begin) buckets.push_back(Range{begin, end - begin});
  if (table.embedding_unit() >= 0) buckets.push_back(units[table.embedding_unit()].range);
  return buckets;
}

std::vector<Range> unit_buckets(const ParamTable& table) { return plan_buckets(table, 0); }

std::string describe_buckets(const std::vector<Range>& buckets, std::size_t bucket_bytes) {
  std::size_t largest = 0;
  for (const Range& b : buckets) largest = std::max(largest, b.count * sizeof(float));
  return std::to_string(buckets.size()) + " bucket(s), the largest " + std::to_string(largest) +
         " bytes (--bucket-mb: buckets of " + std::to_string(bucket_bytes) + " bytes)";
}

BucketTracker::BucketTracker(const ParamTable& table, std::vector<Range> buckets)
    : buckets_(std::move(buckets)), bucket_of_unit_(table.units().size(), -1), units_per_bucket_(buckets_.size(), 0) {
  for (std::size_t u = 0; u < table.units().size(); ++u) {
    const Range unit = table.units()[u].range;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (unit.offset >= buckets_[b].offset && unit.end() <= buckets_[b].end()) {
        bucket_of_unit_[u] = static_cast<int>(b);
        ++units_per_bucket_[b];
      }
    }
    if (bucket_of_unit_[u] < 0) throw InvalidUsage("unit " + table.units()[u].name + " is in no gradient bucket");
  }
  held_back_.assign(buckets_.size(), false);
  reset(true);
}

int BucketTracker::finish(int unit) {
  const int b = bucket_of_unit_[unit];
  return --remaining_[b] == 0 && !held_back_[static_cast<std::size_t>(b)] ? b : -1;
}

void BucketTracker::reset(bool new_step) {
  remaining_ = units_per_bucket_;
  if (new_step) launched_.assign(buckets_.size(), false);
}

std::vector<int> BucketTracker::unlaunched() const {
  std::vector<int> pending;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (!launched_[b]) pending.push_back(static_cast<int>(b));
  return pending;
}

}  // namespace braid::trainer
