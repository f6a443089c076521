// The table of named views into the flat parameter buffer.
//
// Every parameter tensor of this rank is a ParamView {name, offset, shape,
// decay} into one flat float buffer; gradients and AdamW's m and v use the
// same offsets in buffers of the same length. Names are GPT-2's
// ("h.3.attn.c_attn.weight"), Linear weights are [out_features, in_features].
//
// Layout, in this order, each group contiguous (a "unit"):
//   embedding  wte.weight [V, C], wpe.weight [maxT, C]    (first PP stage)
//   h.{i}      ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj
//   head       ln_f.weight, ln_f.bias                      (last PP stage)
// A last stage that is not also the first holds its own wte in its head unit.
// Units are what the model's hooks speak about: ZeRO-3 gathers a unit's
// parameters before its pass, DDP reduces a unit's gradients once backward
// has finished them (units appear in reverse order during backward).
//
// ZeRO cuts every group of whole units into N equal chunks, so it asks for
// units padded to a multiple of N elements (`unit_multiple`): a unit's range
// then ends with up to N-1 padding elements that belong to no view. Padding
// stays zero: no pass writes it and the optimizer only walks views.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trainer/model/flat_buffer.h"
#include "trainer/model/gpt_config.h"

namespace braid::trainer {

// How a tensor is cut across tensor-parallel ranks.
enum class TpSplit {
  kReplicated,      // every rank holds all of it
  kColumnParallel,  // output features (weight rows, bias entries) split
  kRowParallel,     // input features (weight columns) split
};

struct ParamView {
  std::string name;
  std::size_t offset = 0;            // elements into the flat buffer
  std::vector<std::int64_t> shape;   // this rank's part
  bool decay = false;                // AdamW weight decay applies (2-D weights)
  TpSplit tp_split = TpSplit::kReplicated;
  int tp_groups = 1;                 // c_attn: q, k, v are split separately
  std::vector<std::int64_t> full_shape;  // in the whole model and in checkpoints
  int unit = 0;                      // index into ParamTable::units()

  std::size_t count() const;
  Range range() const { return {offset, count()}; }
};

struct Unit {
  std::string name;  // "embedding", "h.3", "head"
  Range range;       // contiguous in the flat buffers, padding included
};

class ParamTable {
 public:
  static ParamTable gpt(const GptConfig& config, const ModelLayout& layout, std::size_t unit_multiple = 1);
  // gpt(config, layout).param_count() without building the table (one view
  // per tensor): in double, for configurations too large to build.
  static double gpt_param_count(const GptConfig& config, const ModelLayout& layout);

  const std::vector<ParamView>& views() const { return views_; }
  const std::vector<Unit>& units() const { return units_; }
  // Elements of the flat buffers, padding included.
  std::size_t count() const { return count_; }
  // Parameters of the model: count() without the padding.
  std::size_t param_count() const { return param_count_; }

  // Throws InvalidUsage when this rank holds no tensor of that name.
  const ParamView& find(std::string_view name) const;
  bool contains(std::string_view name) const;

  // Unit indices; -1 where this stage does not hold that part.
  int embedding_unit() const { return embedding_unit_; }
  int head_unit() const { return head_unit_; }
  int block_unit(int layer) const;

 private:
  void begin_unit(std::string name);
  void add(std::string name, std::vector<std::int64_t> full_shape, bool decay,
           TpSplit split, int groups, int tp_size);
  void end_unit(std::size_t unit_multiple);

  std::vector<ParamView> views_;
  std::vector<Unit> units_;
  std::unordered_map<std::string, std::size_t> index_;
  std::size_t count_ = 0;
  std::size_t param_count_ = 0;
  int embedding_unit_ = -1;
  int head_unit_ = -1;
  int first_layer_ = 0;
  int last_layer_ = 0;
};

// Copies this rank's part of a tensor out of the whole tensor (row-major,
// shape view.full_shape) into `local` (view.count() elements).
void copy_tp_part(const ParamView& view, const ModelLayout& layout, const float* full, float* local);

}  // namespace braid::trainer
