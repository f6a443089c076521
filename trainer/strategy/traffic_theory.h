// What the tensor- and pipeline-parallel groups of a mesh should move per
// optimizer step, derived from the model's shape: bus bytes sent per rank
// (comm_meter.h), to set beside what the groups' meters count. The DP
// group's theory is its strategy's (Strategy::traffic_theory).
//
// Dimensions: B sequences of T tokens per micro-batch, C = n_embd, V the
// vocabulary, M micro-batches per step, L_s the blocks of this rank's stage,
// t the TP size; a float is 4 bytes.
//
//   TP (Megatron's f and g, tp_comm.h): 2 all-reduces of B*T*C floats per
//      block forward (g behind both c_proj) and 2 backward (f in front of
//      c_attn and c_fc): 4 L_s M x 2(t-1)/t x 4 B T C.
//   PP (pp_comm.h): a stage sends each micro-batch's activation B*T*C to
//      the next stage and its gradient B*T*C to the previous one; the first
//      and last stage also all-reduce the tied wte's gradient [V, C] over
//      their two ranks once per step: (M [not last] + M [not first]) x
//      4 B T C + [first or last] x 4 V C.
//
// Neither counts the few 8-byte scalar sums of a step (the loss and the
// gradient norm over the groups), which the meters do count.
#pragma once

#include "trainer/model/gpt_config.h"
#include "trainer/strategy/strategy.h"

namespace braid::trainer {

// One step's micro-batches: M of B sequences of T tokens.
struct StepShape {
  int micro_batches = 1;
  int B = 1;
  int T = 1;
};

TrafficTheory tp_traffic_theory(const GptConfig& config, const ModelLayout& layout, const StepShape& step);
// `stages`: the PP size.
TrafficTheory pp_traffic_theory(const GptConfig& config, const ModelLayout& layout, int stages,
                                const StepShape& step);

}  // namespace braid::trainer
