// Loss evaluation without gradients.
#pragma once

#include <cstdint>
#include <span>

#include "trainer/data/text_data.h"
#include "trainer/model/activations.h"
#include "trainer/model/gpt.h"

namespace braid::trainer {

// Mean loss over `batches` micro-batches of acts.capacity_B() sequences:
// batch b is "step" b of the sampler, so the batches are the same at every
// evaluation and evaluations are comparable.
double sampled_loss(Gpt& model, Activations& acts, const BatchSampler& sampler, int batches);
// The SUM of the target losses of samples [first, first + acts.capacity_B())
// of each of those batches: one data-parallel rank's share of them.
double sampled_loss_sum(Gpt& model, Activations& acts, const BatchSampler& sampler, int batches,
                        std::int64_t first);

// --eval-only. With T = block_size and L = bytes.size(), window
// i = 0 .. floor((L-1)/T) - 1 has inputs bytes[iT, iT+T) and targets
// bytes[iT+1, iT+T+1); the result is the mean cross-entropy (natural log)
// over every target byte of every window, summed in double.
struct WindowLoss {
  double loss = 0.0;
  std::int64_t windows = 0;
  std::int64_t tokens = 0;
};
WindowLoss window_loss(Gpt& model, Activations& acts, std::span<const std::uint8_t> bytes);

}  // namespace braid::trainer
