#include "trainer/model/param_table.h"

#include <algorithm>
#include <cstring>

#include "runtime/errors.h"

namespace braid::trainer {

std::size_t ParamView::count() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

namespace {

// This rank's shape: column parallel splits dim 0 (within each of `groups`),
// row parallel splits dim 1 of a 2-D weight.
std::vector<std::int64_t> local_shape(std::vector<std::int64_t> shape, TpSplit split, int tp_size) {
  if (split == TpSplit::kColumnParallel) shape[0] /= tp_size;
  if (split == TpSplit::kRowParallel && shape.size() == 2) shape[1] /= tp_size;
  return shape;
}

}  // namespace

void ParamTable::begin_unit(std::string name) {
  units_.push_back(Unit{std::move(name), Range{count_, 0}});
}

void ParamTable::end_unit(std::size_t unit_multiple) {
  count_ = (count_ + unit_multiple - 1) / unit_multiple * unit_multiple;
  units_.back().range.count = count_ - units_.back().range.offset;
}

void ParamTable::add(std::string name, std::vector<std::int64_t> full_shape, bool decay,
                     TpSplit split, int groups, int tp_size) {
  ParamView v;
  v.name = std::move(name);
  v.offset = count_;
  v.shape = local_shape(full_shape, split, tp_size);
  v.decay = decay;
  v.tp_split = split;
  v.tp_groups = groups;
  v.full_shape = std::move(full_shape);
  v.unit = static_cast<int>(units_.size()) - 1;
  count_ += v.count();
  param_count_ += v.count();
  index_.emplace(v.name, views_.size());
  views_.push_back(std::move(v));
}

ParamTable ParamTable::gpt(const GptConfig& c, const ModelLayout& l, std::size_t unit_multiple) {
  validate(c, l);
  if (unit_multiple < 1) throw InvalidUsage("unit_multiple must be at least 1");
  const std::int64_t C = c.n_embd, V = c.vocab_size, maxT = c.block_size;
  const int tp = l.tp_size;
  ParamTable t;
  t.first_layer_ = l.pp_first_layer;
  t.last_layer_ = l.pp_last_layer;
  if (l.pp_is_first_stage) {
    t.begin_unit("embedding");
    t.add("wte.weight", {V, C}, true, TpSplit::kReplicated, 1, tp);
    t.add("wpe.weight", {maxT, C}, true, TpSplit::kReplicated, 1, tp);
    t.end_unit(unit_multiple);
    t.embedding_unit_ = 0;
  }
  for (int i = l.pp_first_layer; i < l.pp_last_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    t.begin_unit("h." + std::to_string(i));
    t.add(h + "ln_1.weight", {C}, false, TpSplit::kReplicated, 1, tp);
    t.add(h + "ln_1.bias", {C}, false, TpSplit::kReplicated, 1, tp);
    t.add(h + "attn.c_attn.weight", {3 * C, C}, true, TpSplit::kColumnParallel, 3, tp);
    t.add(h + "attn.c_attn.bias", {3 * C}, false, TpSplit::kColumnParallel, 3, tp);
    t.add(h + "attn.c_proj.weight", {C, C}, true, TpSplit::kRowParallel, 1, tp);
    t.add(h + "attn.c_proj.bias", {C}, false, TpSplit::kReplicated, 1, tp);
    t.add(h + "ln_2.weight", {C}, false, TpSplit::kReplicated, 1, tp);
    t.add(h + "ln_2.bias", {C}, false, TpSplit::kReplicated, 1, tp);
    t.add(h + "mlp.c_fc.weight", {4 * C, C}, true, TpSplit::kColumnParallel, 1, tp);
    t.add(h + "mlp.c_fc.bias", {4 * C}, false, TpSplit::kColumnParallel, 1, tp);
    t.add(h + "mlp.c_proj.weight", {C, 4 * C}, true, TpSplit::kRowParallel, 1, tp);
    t.add(h + "mlp.c_proj.bias", {C}, false, TpSplit::kReplicated, 1, tp);
    t.end_unit(unit_multiple);
  }
  if (l.pp_is_last_stage) {
    t.begin_unit("head");
    t.add("ln_f.weight", {C}, false, TpSplit::kReplicated, 1, tp);
    t.add("ln_f.bias", {C}, false, TpSplit::kReplicated, 1, tp);
    if (!l.pp_is_first_stage) t.add("wte.weight", {V, C}, true, TpSplit::kReplicated, 1, tp);
    t.end_unit(unit_multiple);
    t.head_unit_ = static_cast<int>(t.units_.size()) - 1;
  }
  return t;
}

// The tensors gpt() adds: per block ln_1 and ln_2 (2C each), c_attn (3Cl x C
// + 3Cl), attn.c_proj (C x Cl + C), c_fc (4Cl x C + 4Cl), mlp.c_proj
// (C x 4Cl + C); wte (V x C) and wpe (T x C) on the first stage; ln_f (2C)
// and, on a last stage that is not the first, its own wte on the last.
double ParamTable::gpt_param_count(const GptConfig& c, const ModelLayout& l) {
  const double C = c.n_embd, Cl = l.local_embd(c), V = c.vocab_size, T = c.block_size;
  const double block = 12 * C * Cl + 7 * Cl + 6 * C;
  double count = block * (l.pp_last_layer - l.pp_first_layer);
  if (l.pp_is_first_stage) count += V * C + T * C;
  if (l.pp_is_last_stage) count += 2 * C + (l.pp_is_first_stage ? 0 : V * C);
  return count;
}

const ParamView& ParamTable::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) {
    throw InvalidUsage("this rank holds no parameter named '" + std::string(name) + "'");
  }
  return views_[it->second];
}

bool ParamTable::contains(std::string_view name) const {
  return index_.count(std::string(name)) != 0;
}

int ParamTable::block_unit(int layer) const {
  if (layer < first_layer_ || layer >= last_layer_) return -1;
  return (embedding_unit_ >= 0 ? 1 : 0) + layer - first_layer_;
}

void copy_tp_part(const ParamView& v, const ModelLayout& l, const float* full, float* local) {
  if (v.tp_split == TpSplit::kReplicated || l.tp_size == 1) {
    std::memcpy(local, full, v.count() * sizeof(float));
    return;
  }
  const std::int64_t cols = v.full_shape.size() == 2 ? v.full_shape[1] : 1;
  if (v.tp_split == TpSplit::kColumnParallel) {
    // Rows of group g: full rows [g*R + tp_rank*r, g*R + tp_rank*r + r).
    const std::int64_t R = v.full_shape[0] / v.tp_groups, r = R / l.tp_size;
    for (int g = 0; g < v.tp_groups; ++g) {
      const float* src = full + (g * R + l.tp_rank * r) * cols;
      std::memcpy(local + g * r * cols, src, static_cast<std::size_t>(r * cols) * sizeof(float));
    }
    return;
  }
  // Row parallel: columns [tp_rank*c, tp_rank*c + c) of every row.
  const std::int64_t rows = v.full_shape[0], c = cols / l.tp_size;
  for (std::int64_t i = 0; i < rows; ++i) {
    std::memcpy(local + i * c, full + i * cols + l.tp_rank * c, static_cast<std::size_t>(c) * sizeof(float));
  }
}

}  // namespace braid::trainer
