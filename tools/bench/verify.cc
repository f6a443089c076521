#include "tools/bench/verify.h"

#include <cstdint>
#include <algorithm>
#include <cstring>

#include "kernels/cpu/reduce.h"

namespace braid::verify {

// Every input is a function of a hash of the rank and of the index within
// one period (kPeriod, a prime): neighbouring elements, and the slices of
// a reduce_scatter or all_to_all, hold values that differ, and so do the
// ranks' values at one index, so an element or a slice put in the wrong
// place, or a rank's part left out, shows. (The inputs were a function of
// (rank + index) % 7: at a count that is a multiple of 7 every slice of a
// reduce_scatter had the same expected values, and a result that swapped
// them passed; at 7 ranks every sum was 28 at every index. Found by a
// review helper.)
//
// sum, avg: 1 + h % m, with m = min(31, 160 / size), so that a sum of
// every rank stays at most 160: exact in bf16 whatever the order, and never
// braid-bench's marker byte (0xa5, 165) in u8 or i8. min, max: 1 + h % 100,
// whatever the size (no sum to bound), so that the extremes still vary from
// index to index among many ranks.
// prod: ranks 1 to 6 give 2 where the index's own hash % 7 is below their
// number, so the product is 2^k for k up to min(size - 1, 6) (exact in i8).
// band, bor, bxor: a rank holds one bit, h % 7, at about 4 / (size + 4)
// of the indices and none elsewhere (band: every bit of 0..6 but that one),
// so that about 4 bits of the 7 are held at an index, whatever the size.
// (avg of an integer type of many ranks is near 1 at every index: a sum of
// values up to 160 / size, divided by the size, truncated.)
namespace {

constexpr std::size_t kPeriod = 8191;  // 2^13 - 1

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t index_hash(std::size_t index) {
  return mix(static_cast<std::uint64_t>(index % kPeriod) * 0x9E3779B97F4A7C15ull);
}

}  // namespace

std::size_t input_period() { return kPeriod; }

double input_value(int rank, std::size_t index, int size, ReduceOp op) {
  const std::uint64_t of_index = index_hash(index);
  if (op == ReduceOp::prod) return rank < 7 && static_cast<int>(of_index % 7) < rank ? 2.0 : 1.0;
  const std::uint64_t h = mix(of_index + static_cast<std::uint64_t>(rank + 1) * 0x632BE59BD9B4E019ull);
  if (is_bitwise(op)) {
    const bool holds = (h / 7) % static_cast<std::uint64_t>(std::max(size, 1) + 4) < 4;
    const int bit = holds ? 1 << static_cast<int>(h % 7) : 0;
    return op == ReduceOp::band ? 127 ^ bit : bit;
  }
  const bool extreme = op == ReduceOp::min || op == ReduceOp::max;
  const auto m = static_cast<std::uint64_t>(extreme ? 100 : std::clamp(160 / std::max(size, 1), 1, 31));
  return static_cast<double>(1 + h % m);
}

void store_value(void* buf, std::size_t i, DataType dtype, double v) {
  switch (dtype) {
    case DataType::f32: static_cast<float*>(buf)[i] = float(v); break;
    case DataType::f64: static_cast<double*>(buf)[i] = v; break;
    case DataType::f16: static_cast<std::uint16_t*>(buf)[i] = kernels::cpu::f32_to_f16(float(v)); break;
    case DataType::bf16: static_cast<std::uint16_t*>(buf)[i] = kernels::cpu::f32_to_bf16(float(v)); break;
    case DataType::i8: static_cast<std::int8_t*>(buf)[i] = std::int8_t(v); break;
    case DataType::u8: static_cast<std::uint8_t*>(buf)[i] = std::uint8_t(v); break;
    case DataType::i32: static_cast<std::int32_t*>(buf)[i] = std::int32_t(v); break;
    case DataType::i64: static_cast<std::int64_t*>(buf)[i] = std::int64_t(v); break;
  }
}

void fill_input(void* buf, std::size_t count, std::size_t first, int rank, int size, DataType dtype, ReduceOp op) {
  for (std::size_t j = 0; j < count; ++j) store_value(buf, j, dtype, input_value(rank, first + j, size, op));
}

// Reduced with the kernels themselves on single elements; the inputs are
// exact, so the order does not matter.
std::vector<std::byte> expected_reduction(std::size_t index, int size, DataType dtype, ReduceOp op) {
  std::vector<std::byte> acc(8), next(8);
  store_value(acc.data(), 0, dtype, input_value(0, index, size, op));
  for (int r = 1; r < size; ++r) {
    store_value(next.data(), 0, dtype, input_value(r, index, size, op));
    kernels::cpu::reduce(acc.data(), acc.data(), next.data(), 1, dtype, op);
  }
  if (op == ReduceOp::avg) kernels::cpu::divide(acc.data(), 1, dtype, size);
  acc.resize(dtype_bytes(dtype));
  return acc;
}

std::vector<std::byte> expected_input(int rank, std::size_t index, int size, DataType dtype, ReduceOp op) {
  std::vector<std::byte> value(8);
  store_value(value.data(), 0, dtype, input_value(rank, index, size, op));
  value.resize(dtype_bytes(dtype));
  return value;
}

ExpectedTable::ExpectedTable(int size, DataType dtype, ReduceOp op)
    : period_(input_period()), es_(dtype_bytes(dtype)) {
  reduced_.resize(period_ * es_);
  inputs_.resize(period_ * es_ * size);
  for (std::size_t i = 0; i < period_; ++i) {
    auto value = expected_reduction(i, size, dtype, op);
    std::copy(value.begin(), value.end(), reduced_.begin() + i * es_);
    for (int r = 0; r < size; ++r) {
      auto in = expected_input(r, i, size, dtype, op);
      std::copy(in.begin(), in.end(), inputs_.begin() + (r * period_ + i) * es_);
    }
  }
}

void ExpectedTable::fill_input(void* buf, std::size_t count, int rank) const {
  const std::byte* period = &inputs_[static_cast<std::size_t>(rank) * period_ * es_];
  auto* out = static_cast<std::byte*>(buf);
  for (std::size_t done = 0; done < count; done += period_)
    std::memcpy(out + done * es_, period, std::min(period_, count - done) * es_);
}

}  // namespace braid::verify
