#include "kernels/dtype.h"

namespace braid {

std::string_view name(DataType dtype) {
  static constexpr std::string_view kNames[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"};
  return is_valid(dtype) ? kNames[static_cast<int>(dtype)] : "invalid";
}

std::string_view name(ReduceOp op) {
  static constexpr std::string_view kNames[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  return is_valid(op) ? kNames[static_cast<int>(op)] : "invalid";
}

std::optional<DataType> parse_dtype(std::string_view t) {
  for (int i = 0; i < kNumDataTypes; ++i)
    if (t == name(static_cast<DataType>(i))) return static_cast<DataType>(i);
  if (t == "float" || t == "float32") return DataType::f32;
  if (t == "double" || t == "float64") return DataType::f64;
  if (t == "half" || t == "float16") return DataType::f16;
  if (t == "bfloat16") return DataType::bf16;
  if (t == "int8") return DataType::i8;
  if (t == "uint8") return DataType::u8;
  if (t == "int" || t == "int32") return DataType::i32;
  if (t == "int64") return DataType::i64;
  return std::nullopt;
}

std::optional<ReduceOp> parse_reduce_op(std::string_view t) {
  for (int i = 0; i < kNumReduceOps; ++i)
    if (t == name(static_cast<ReduceOp>(i))) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

}  // namespace braid
