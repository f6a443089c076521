#include "tools/check/values.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace braid::check {
namespace {

std::int64_t base(std::size_t index) {
  const std::uint64_t h = (static_cast<std::uint64_t>(index) + 1) * 0x9E3779B97F4A7C15ull;
  return static_cast<std::int64_t>((h >> 40) % 13) - 6;
}

// k/256, k in [1, 255]: another hash of the index than base's.
std::int64_t fraction(std::size_t index) {
  const std::uint64_t h = (static_cast<std::uint64_t>(index) + 7) * 0xC2B2AE3D27D4EB4Full;
  return static_cast<std::int64_t>((h >> 32) % 255) + 1;
}

std::int64_t high(std::size_t index) {
  return (static_cast<std::int64_t>(index % 3) - 1) * (std::int64_t{1} << 33);
}

std::uint16_t bf16_bits(std::int64_t value) {
  // Integers of at most 8 significant bits are exact in bfloat16: the upper
  // half of the float's bits, no rounding needed.
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(static_cast<float>(value)) >> 16);
}

std::optional<std::int64_t> integral(double value) {
  if (!std::isfinite(value) || value != std::floor(value)) return std::nullopt;
  return static_cast<std::int64_t>(value);
}

constexpr std::int64_t kF32Scale = 256;

}  // namespace

std::int64_t input_value(int rank, std::size_t index, int ranks, DataType dtype) {
  std::int64_t value = base(index) + 2 * static_cast<std::int64_t>((static_cast<std::size_t>(rank) + index) % ranks);
  if (dtype == DataType::i64) return value + high(index);
  if (dtype == DataType::f32) return value * kF32Scale + fraction(index);
  return value;
}

std::int64_t reduced_value(std::size_t index, int ranks, DataType dtype, ReduceOp op) {
  std::int64_t sum = 0, max = input_value(0, index, ranks, dtype);
  for (int r = 0; r < ranks; ++r) {
    const std::int64_t v = input_value(r, index, ranks, dtype);
    sum += v;
    max = std::max(max, v);
  }
  if (op == ReduceOp::max) return max;
  if (op == ReduceOp::avg) return sum / ranks;  // exact: the model makes the sum a multiple of ranks
  return sum;
}

bool supported(DataType dtype) {
  return dtype == DataType::f32 || dtype == DataType::bf16 || dtype == DataType::i64;
}

bool supported(ReduceOp op) { return op == ReduceOp::sum || op == ReduceOp::max || op == ReduceOp::avg; }

void store(void* buffer, std::size_t i, DataType dtype, std::int64_t value) {
  switch (dtype) {
    case DataType::f32: static_cast<float*>(buffer)[i] = static_cast<float>(value) / kF32Scale; break;
    case DataType::bf16: static_cast<std::uint16_t*>(buffer)[i] = bf16_bits(value); break;
    case DataType::i64: static_cast<std::int64_t*>(buffer)[i] = value; break;
    default: break;  // refused before any buffer is filled (supported())
  }
}

std::optional<std::int64_t> load(const void* buffer, std::size_t i, DataType dtype) {
  switch (dtype) {
    case DataType::f32: return integral(static_cast<double>(static_cast<const float*>(buffer)[i]) * kF32Scale);
    case DataType::bf16: {
      const std::uint32_t bits = std::uint32_t{static_cast<const std::uint16_t*>(buffer)[i]} << 16;
      return integral(std::bit_cast<float>(bits));
    }
    case DataType::i64: return static_cast<const std::int64_t*>(buffer)[i];
    default: return std::nullopt;
  }
}

std::string show_value(std::int64_t value, DataType dtype) {
  if (dtype != DataType::f32) return std::to_string(value);
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", static_cast<double>(value) / kF32Scale);
  return text;
}

std::string show(const void* buffer, std::size_t i, DataType dtype) {
  if (is_sentinel(buffer, i, dtype)) return "the sentinel (not written)";
  if (auto value = load(buffer, i, dtype)) return show_value(*value, dtype);
  const std::size_t bytes = dtype_bytes(dtype);
  std::uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const std::byte*>(buffer) + i * bytes, bytes);
  double number = NAN;
  if (dtype == DataType::f32) number = static_cast<const float*>(buffer)[i];
  if (dtype == DataType::bf16) number = std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  char text[64];
  if (std::isfinite(number))
    std::snprintf(text, sizeof text, "%.10g", number);
  else
    std::snprintf(text, sizeof text, "bits 0x%0*llx", static_cast<int>(2 * bytes),
                  static_cast<unsigned long long>(bits));
  return text;
}

bool is_sentinel(const void* buffer, std::size_t i, DataType dtype) {
  const std::size_t bytes = dtype_bytes(dtype);
  const auto* element = static_cast<const std::byte*>(buffer) + i * bytes;
  return std::all_of(element, element + bytes, [](std::byte b) { return b == kSentinelByte; });
}

void fill_sentinel(void* buffer, std::size_t count, DataType dtype) {
  std::memset(buffer, static_cast<int>(kSentinelByte), count * dtype_bytes(dtype));
}

}  // namespace braid::check
