#include "comm/types.h"

#include <array>

namespace braid::comm {
namespace {

// select.cc's names, numbered from 1 (algorithm_id).
constexpr std::array<std::string_view, kAlgorithmIds - 1> kAlgorithmNames = {
    "ring", "recursive_doubling", "direct", "oneshot", "binomial", "pipelined", "pairwise", "dissemination"};

}  // namespace

std::string_view name(OpKind kind) {
  static constexpr std::string_view kNames[] = {
      "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
      "send",       "recv",           "all_to_all", "barrier"};
  auto index = static_cast<unsigned>(kind);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

std::string list_form_note(OpKind kind) {
  if (kind != OpKind::all_gather && kind != OpKind::reduce_scatter) return {};
  return kind == OpKind::all_gather
             ? "; an all_gather into one buffer per rank (the list form) never runs direct, even on registered "
               "buffers, so under BRAID_ALGO=direct every rank must pass the same form"
             : "; a reduce_scatter from one buffer per rank (the list form) never runs direct, even on registered "
               "buffers, so under BRAID_ALGO=direct every rank must pass the same form";
}

std::string describe(const Op& op) {
  if (op.kind == OpKind::all_gather && op.root == kSplitRoot)
    return "split #" + std::to_string(op.seq) + " (its all_gather of every rank's color and key)";
  std::string text = std::string(name(op.kind)) + " #" + std::to_string(op.seq);
  if (op.kind == OpKind::barrier) return text;
  text += " (count " + std::to_string(op.count) + ", " + std::string(name(op.dtype));
  if (op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter || op.kind == OpKind::reduce)
    text += ", " + std::string(name(op.reduce_op));
  if (op.kind == OpKind::broadcast || op.kind == OpKind::reduce) text += ", root " + std::to_string(op.root);
  if (op.kind == OpKind::send || op.kind == OpKind::recv) text += ", peer " + std::to_string(op.root);
  return text + ")";
}

std::uint8_t algorithm_id(std::string_view name) {
  if (name == "cuda_ipc") name = "direct";
  for (std::size_t i = 0; i < kAlgorithmNames.size(); ++i)
    if (kAlgorithmNames[i] == name) return static_cast<std::uint8_t>(i + 1);
  return 0;
}

std::string algorithm_name(std::uint8_t id) {
  if (id >= 1 && id < kAlgorithmIds) return std::string(kAlgorithmNames[id - 1]);
  return "algorithm " + std::to_string(id);
}

}  // namespace braid::comm
