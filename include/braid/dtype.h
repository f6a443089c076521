// Element types and reduction operators. They live in kernels/ because the
// reduction kernels are written against them and kernels/ depends on nothing
// else of ours; comm/ re-exports them as its public vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace braid {

enum class DataType : std::uint8_t { f32, f64, f16, bf16, i8, u8, i32, i64 };
inline constexpr int kNumDataTypes = 8;

// band, bor and bxor (bitwise and, or, exclusive or, as MPI_BAND and
// gloo's BAND...) reduce the integer types only.
enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg, band, bor, bxor };
inline constexpr int kNumReduceOps = 8;

// Bytes per element; 0 for a value outside the enum. Inline: every call
// asks them.
constexpr std::size_t dtype_bytes(DataType dtype) {
  switch (dtype) {
    case DataType::f32: return 4;
    case DataType::f64: return 8;
    case DataType::f16: return 2;
    case DataType::bf16: return 2;
    case DataType::i8: return 1;
    case DataType::u8: return 1;
    case DataType::i32: return 4;
    case DataType::i64: return 8;
  }
  return 0;
}
constexpr bool is_valid(DataType dtype) { return dtype_bytes(dtype) != 0; }
constexpr bool is_valid(ReduceOp op) { return static_cast<unsigned>(op) < kNumReduceOps; }
constexpr bool is_floating(DataType dtype) {
  return dtype == DataType::f32 || dtype == DataType::f64 || dtype == DataType::f16 || dtype == DataType::bf16;
}
constexpr bool is_bitwise(ReduceOp op) { return op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor; }
// Whether `op` reduces elements of `dtype`: every op but the bitwise ones
// on floating-point types.
constexpr bool can_reduce(DataType dtype, ReduceOp op) { return !(is_bitwise(op) && is_floating(dtype)); }
std::string_view name(DataType dtype);  // "f32", ...; "invalid" outside the enum
std::string_view name(ReduceOp op);     // "sum", ...
std::optional<DataType> parse_dtype(std::string_view text);  // also "float", "half", ...
std::optional<ReduceOp> parse_reduce_op(std::string_view text);

}  // namespace braid
