// The shape of one collective case in the element-checked grids
// (test_collectives, test_direct, test_oneshot, test_direct_cuda): what is
// called, on which dtype and op, with how many elements, where, and the root.
#pragma once

#include <cstddef>
#include <string>

#include "comm/types.h"

namespace braid::test::cases {

inline constexpr comm::DataType kDtypes[] = {comm::DataType::f32, comm::DataType::f64, comm::DataType::f16,
                                             comm::DataType::bf16, comm::DataType::i8,  comm::DataType::u8,
                                             comm::DataType::i32, comm::DataType::i64};
inline constexpr comm::ReduceOp kOps[] = {comm::ReduceOp::sum, comm::ReduceOp::prod, comm::ReduceOp::min,
                                          comm::ReduceOp::max, comm::ReduceOp::avg};

struct Case {
  comm::OpKind kind;
  comm::DataType dtype;
  comm::ReduceOp op;
  std::size_t count;
  bool in_place;
  int root;
};

inline std::string describe(const Case& c, int size) {
  return std::string(name(c.kind)) + " " + std::string(name(c.dtype)) + " " + std::string(name(c.op)) + " count " +
         std::to_string(c.count) + (c.in_place ? " in place" : " out of place") + " root " + std::to_string(c.root) +
         " on " + std::to_string(size) + " ranks";
}

// Whether a buffer of the call holds one `count` per rank.
inline bool per_rank(comm::OpKind kind) {
  return kind == comm::OpKind::reduce_scatter || kind == comm::OpKind::all_gather || kind == comm::OpKind::all_to_all;
}

}  // namespace braid::test::cases
