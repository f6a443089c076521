// Tensor checks and conversions for the ProcessGroup (tensors.h).
#include "tensors.h"

#include <ATen/MemoryOverlap.h>

#include <optional>
#include <string>

#include "braid/errors.h"

namespace braid::torch_backend {

namespace {

std::optional<DataType> braid_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DataType::f32;
    case at::kDouble: return DataType::f64;
    case at::kHalf: return DataType::f16;
    case at::kBFloat16: return DataType::bf16;
    case at::kChar: return DataType::i8;
    case at::kByte: return DataType::u8;
    case at::kInt: return DataType::i32;
    case at::kLong: return DataType::i64;
    default: return std::nullopt;
  }
}

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw InvalidUsage(std::string("braid: ") + op + ": " + what);
}

}  // namespace

at::Tensor& single_tensor(std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.size() != 1)
    refuse(op, "takes one tensor per process, got " + std::to_string(tensors.size()) +
                   " (several devices per process are not supported: start one process per device)");
  check_dense(tensors[0], op);
  return tensors[0];
}

void check_dense(const at::Tensor& tensor, const char* op) {
  if (tensor.layout() != at::kStrided) refuse(op, "sparse tensors are not supported");
  if (!tensor.is_non_overlapping_and_dense())
    refuse(op, "the tensor is a view with gaps or overlaps (not dense in any memory format): pass tensor.contiguous()");
  if (!tensor.is_cpu() && !tensor.is_cuda())
    refuse(op, "tensors on " + tensor.device().str() + " are not supported (CPU or CUDA)");
}

void check_contiguous(const at::Tensor& tensor, const char* op) {
  check_dense(tensor, op);
  if (!tensor.is_contiguous()) refuse(op, "the tensor is not contiguous: pass tensor.contiguous()");
}

void check_format_contiguous(const at::Tensor& tensor, const char* op) {
  check_dense(tensor, op);
  if (!tensor.is_contiguous(tensor.suggest_memory_format()))
    refuse(op, "the tensor is not contiguous in its memory format (a transposed or permuted view, whose "
               "elements would reach the peer in memory order): pass tensor.contiguous()");
}

void check_strided(const at::Tensor& tensor, const char* op, bool written) {
  // Read through a flat copy or written by copy_: any strided view will
  // do (gloo takes them too), but one written must not overlap itself.
  if (tensor.layout() != at::kStrided) refuse(op, "sparse tensors are not supported");
  if (!tensor.is_cpu() && !tensor.is_cuda())
    refuse(op, "tensors on " + tensor.device().str() + " are not supported (CPU or CUDA)");
  if (written && at::has_internal_overlap(tensor) == at::MemOverlap::Yes)
    refuse(op, "an output tensor overlaps itself (an expanded view): pass one with its own memory");
}

void check_same(const std::vector<at::Tensor>& tensors, const at::Tensor& like, const char* op, bool written) {
  for (const auto& tensor : tensors) {
    check_strided(tensor, op, written);
    if (tensor.scalar_type() != like.scalar_type() || tensor.device() != like.device() ||
        tensor.sizes() != like.sizes())
      refuse(op, "every tensor of the list must match the input's dtype, device and shape (" +
                     std::string(c10::toString(like.scalar_type())) + ", " + like.device().str() + ", " +
                     c10::str(like.sizes()) + "), got " + c10::toString(tensor.scalar_type()) + ", " +
                     tensor.device().str() + ", " + c10::str(tensor.sizes()));
  }
}

Buffer reducible(const at::Tensor& tensor, const char* op) {
  auto dtype = braid_dtype(tensor.scalar_type());
  if (!dtype)
    refuse(op, std::string("braid cannot reduce tensors of dtype ") + c10::toString(tensor.scalar_type()) +
                   " (it reduces float32, float64, float16, bfloat16, int8, uint8, int32 and int64)");
  return {tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()), *dtype};
}

Buffer movable(const at::Tensor& tensor, const char* op) {
  if (auto dtype = braid_dtype(tensor.scalar_type()))
    return {tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()), *dtype};
  return {tensor.data_ptr(), static_cast<std::size_t>(tensor.nbytes()), DataType::u8};
}

Buffer per_rank(Buffer whole, std::size_t ranks, const char* op) {
  if (whole.count % ranks != 0)
    refuse(op, std::to_string(whole.count) + " elements do not split into " + std::to_string(ranks) +
                   " equal parts");
  whole.count /= ranks;
  return whole;
}

ReduceOp reduce_op(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::sum;
    case c10d::ReduceOp::AVG: return ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::prod;
    case c10d::ReduceOp::MIN: return ReduceOp::min;
    case c10d::ReduceOp::MAX: return ReduceOp::max;
    case c10d::ReduceOp::BAND: return ReduceOp::band;  // of integer tensors: braid refuses floats by name
    case c10d::ReduceOp::BOR: return ReduceOp::bor;
    case c10d::ReduceOp::BXOR: return ReduceOp::bxor;
    default: {
      // torch's own names of the others (1.13: PREMUL_SUM, UNUSED), not their numbers.
      const std::string which = op.op_ == c10d::ReduceOp::PREMUL_SUM
                                    ? "PREMUL_SUM"
                                    : "reduce op " + std::to_string(static_cast<int>(op.op_));
      refuse(name, which + " is not supported (braid reduces with SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR)");
    }
  }
}

}  // namespace braid::torch_backend
