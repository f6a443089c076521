// How torch tensors and options become braid call arguments, with the checks
// that refuse what braid cannot do before any byte moves. Every refusal is a
// braid::InvalidUsage (Python: RuntimeError) that names the operation.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>
#include <vector>

#include "braid/types.h"

namespace braid::torch_backend {

// A tensor's storage as braid sees it: a pointer, an element count and a
// braid element type. Tensors of a dtype braid does not reduce (bool,
// int16, complex, ...) travel as bytes where no reduction is involved.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::u8;
};

// The one tensor of a per-process call (torch's multi-tensor lists are for
// several devices per process, which braid does not take).
at::Tensor& single_tensor(std::vector<at::Tensor>& tensors, const char* op);
// Refuses sparse tensors, views with gaps or overlaps, and tensors on other
// devices than CPU and CUDA, by name. A dense tensor in another memory
// format (channels_last) passes: its elements fill numel() places from
// data_ptr() on, which an elementwise call (all_reduce, broadcast, reduce)
// moves as they are, given the same format on every rank (as torch's NCCL
// backend does); the calls that split or join tensors go through
// contiguous copies.
void check_dense(const at::Tensor& tensor, const char* op);
// check_dense, and contiguous: the flat calls (_allgather_base,
// _reduce_scatter_base, alltoall_base), whose tensors are their buffers.
void check_contiguous(const at::Tensor& tensor, const char* op);
// check_dense, and contiguous in its memory format (a channels_last tensor
// passes; a transposed or permuted view does not): send and recv, whose two
// ends are often different code. A sender's x.t() reached a contiguous
// receiver in the sender's memory order, permuted, with no error; gloo
// refuses it the same way.
void check_format_contiguous(const at::Tensor& tensor, const char* op);
// A tensor read or written through a flat copy: strided (views with gaps
// are fine), on CPU or CUDA, and, where `written`, not overlapping itself.
void check_strided(const at::Tensor& tensor, const char* op, bool written);
// Every tensor of a list (which goes through a flat copy) check_strided, and
// of `like`'s dtype, device and shape (gloo's rule: a (3, 2) output for a
// (2, 3) input took its elements reshaped, without a word).
void check_same(const std::vector<at::Tensor>& tensors, const at::Tensor& like, const char* op,
                bool written = false);

// For reductions: the tensor with its braid dtype, or InvalidUsage naming
// the dtypes braid reduces.
Buffer reducible(const at::Tensor& tensor, const char* op);
// For data movement: the tensor as typed elements where braid knows the
// dtype, else as bytes.
Buffer movable(const at::Tensor& tensor, const char* op);
// The same storage split into `ranks` equal parts (the count of one part), for the per-rank
// counts of all_gather, reduce_scatter and all_to_all.
Buffer per_rank(Buffer whole, std::size_t ranks, const char* op);

// sum, avg, product, min, max, band, bor, bxor; premultiplied sums are refused.
ReduceOp reduce_op(const c10d::ReduceOp& op, const char* name);

}  // namespace braid::torch_backend
