#include "tools/bench/verify.h"

#include <cstdint>
#include <algorithm>
#include <cstring>

#include "kernels/cpu/reduce.h"

namespace braid::verify {

// prod: ranks 1 to 6 give 2 where index % 7 is below their number, so the
// product is 2^k for k from 0 to min(size - 1, 6) as index % 7 goes (exact
// in i8). It was 2 at every index (one rank gave 2 at each), and a result
// moved by any offset passed the check.
// band, bor, bxor: one bit per rank, (rank + index) % 7 (bor, bxor), or
// every bit of 0..6 but that one (band), so that each rank's part shows in
// the result and a result moved by an offset does not pass.
double input_value(int rank, std::size_t index, int size, ReduceOp op) {
  (void)size;
  if (op == ReduceOp::prod) return rank < 7 && static_cast<int>(index % 7) < rank ? 2.0 : 1.0;
  if (is_bitwise(op)) {
    const int bit = 1 << static_cast<int>((static_cast<std::size_t>(rank) + index) % 7);
    return op == ReduceOp::band ? 127 ^ bit : bit;
  }
  return static_cast<double>((rank + index) % 7 + 1);
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
    : period_(7 * static_cast<std::size_t>(size)), es_(dtype_bytes(dtype)) {
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

}  // namespace braid::verify
