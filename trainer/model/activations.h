// What the forward pass of one micro-batch keeps for its backward pass, on
// one pipeline stage. Blocks are stored separately (block(i)), so a pipeline
// schedule can hold several micro-batches in flight, each in its own
// Activations, and activation recomputation could drop a block's.
//
// Dimensions: B batch, T sequence, C n_embd, Cl = C / tp_size (this TP
// rank's channels), NHl heads of this rank, V vocabulary, N = B*T.
// Buffers are sized for the capacity (B, T) given at construction; a pass
// may use any smaller B and T (generation grows T one token at a time).
#pragma once

#include <cstdint>

#include "trainer/model/flat_buffer.h"
#include "trainer/model/gpt_config.h"

namespace braid::trainer {

struct BlockActivations {
  float* ln_1;        // [N, C]
  float* ln_1_mean;   // [N]
  float* ln_1_rstd;   // [N]
  float* qkv;         // [N, 3*Cl]
  float* atty;        // [N, Cl]  attention output before c_proj
  float* att;         // [B, NHl, T, T] softmax probabilities
  float* residual_2;  // [N, C]  x + attention branch
  float* ln_2;        // [N, C]
  float* ln_2_mean;   // [N]
  float* ln_2_rstd;   // [N]
  float* fch;         // [N, 4*Cl]  c_fc output
  float* fch_gelu;    // [N, 4*Cl]
  float* output;      // [N, C]  residual_2 + MLP branch
};

struct HeadActivations {
  float* ln_f;        // [N, C]
  float* ln_f_mean;   // [N]
  float* ln_f_rstd;   // [N]
  float* logits;      // [N, V]  (backward reuses it for dlogits)
  float* probs;       // [N, V]
  float* losses;      // [N]
  float* dlosses;     // [N]
};

class Activations {
 public:
  // Every buffer, tokens and targets included, lives on `device`.
  Activations(const GptConfig& config, const ModelLayout& layout, int B, int T, MemoryAccount* account,
              Device device = Device::kCpu);
  // The floats one Activations of capacity (B, T) holds, without building
  // it (braid-train's memory check, train/memory_plan.h). In double: the
  // check must not overflow on the configurations it refuses.
  static double float_count(const GptConfig& config, const ModelLayout& layout, double B, double T);

  // Sets the shape of the next pass (B <= capacity_B, T <= capacity_T).
  void set_shape(int B, int T);
  int B() const { return B_; }
  int T() const { return T_; }
  int capacity_B() const { return cap_B_; }
  int capacity_T() const { return cap_T_; }

  BlockActivations block(int layer);
  HeadActivations head();
  float* input() { return input_; }            // [N, C] stage input (embedding or received)
  float* proj() { return proj_; }              // [N, C] c_proj output scratch
  float* dresidual() { return dresidual_; }    // [N, C] gradient flowing down the residual
  std::int32_t* tokens() { return tokens_; }    // [N]
  std::int32_t* targets() { return targets_; }  // [N]
  Device device() const { return buffer_.device(); }
  std::size_t bytes() const { return buffer_.count() * sizeof(float); }

 private:
  int cap_B_, cap_T_, B_, T_;
  int first_layer_;
  std::size_t block_stride_ = 0;
  FlatBuffer buffer_;
  float* blocks_ = nullptr;
  float* head_ = nullptr;
  float* input_ = nullptr;
  float* proj_ = nullptr;
  float* dresidual_ = nullptr;
  std::size_t N_ = 0, C_ = 0, Cl_ = 0, NHl_ = 0, V_ = 0;
  bool has_head_ = false;
  std::int32_t* tokens_ = nullptr;
  std::int32_t* targets_ = nullptr;
};

}  // namespace braid::trainer
