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

enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg };
inline constexpr int kNumReduceOps = 5;

// Bytes per element; 0 for a value outside the enum.
std::size_t dtype_bytes(DataType dtype);
bool is_valid(DataType dtype);
bool is_valid(ReduceOp op);
std::string_view name(DataType dtype);  // "f32", ...; "invalid" outside the enum
std::string_view name(ReduceOp op);     // "sum", ...
std::optional<DataType> parse_dtype(std::string_view text);  // also "float", "half", ...
std::optional<ReduceOp> parse_reduce_op(std::string_view text);

}  // namespace braid
