#include "comm/types.h"

namespace braid::comm {

std::string_view name(OpKind kind) {
  static constexpr std::string_view kNames[] = {
      "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
      "send",       "recv",           "all_to_all", "barrier"};
  auto index = static_cast<unsigned>(kind);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

std::string describe(const Op& op) {
  std::string text = std::string(name(op.kind)) + " #" + std::to_string(op.seq);
  if (op.kind == OpKind::barrier) return text;
  text += " (count " + std::to_string(op.count) + ", " + std::string(name(op.dtype));
  if (op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter || op.kind == OpKind::reduce)
    text += ", " + std::string(name(op.reduce_op));
  if (op.kind == OpKind::broadcast || op.kind == OpKind::reduce) text += ", root " + std::to_string(op.root);
  if (op.kind == OpKind::send || op.kind == OpKind::recv) text += ", peer " + std::to_string(op.root);
  return text + ")";
}

}  // namespace braid::comm
