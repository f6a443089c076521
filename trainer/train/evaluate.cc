#include "trainer/train/evaluate.h"

#include <algorithm>
#include <vector>

#include "runtime/errors.h"

namespace braid::trainer {

namespace {

// Sum (not mean) of the per-token losses of the last forward, in double.
double loss_sum(Activations& acts) {
  const HeadActivations h = acts.head();
  const std::int64_t N = static_cast<std::int64_t>(acts.B()) * acts.T();
  std::vector<float> losses(static_cast<std::size_t>(N));
  backend(acts.device()).to_host(losses.data(), h.losses, losses.size() * sizeof(float));
  double sum = 0.0;
  for (float loss : losses) sum += loss;
  return sum;
}

}  // namespace

double sampled_loss_sum(Gpt& model, Activations& acts, const BatchSampler& sampler, int batches,
                        std::int64_t first) {
  const int B = acts.capacity_B(), T = sampler.T();
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(B) * T), targets(inputs.size());
  double sum = 0.0;
  for (int b = 0; b < batches; ++b) {
    sampler.fill(b, first, B, inputs.data(), targets.data());
    acts.set_shape(B, T);
    model.forward(acts, inputs.data(), targets.data());
    sum += loss_sum(acts);
  }
  return sum;
}

double sampled_loss(Gpt& model, Activations& acts, const BatchSampler& sampler, int batches) {
  const double tokens = static_cast<double>(batches) * acts.capacity_B() * sampler.T();
  return sampled_loss_sum(model, acts, sampler, batches, 0) / tokens;
}

WindowLoss window_loss(Gpt& model, Activations& acts, std::span<const std::uint8_t> bytes) {
  const int T = model.config().block_size;
  if (bytes.size() < static_cast<std::size_t>(T) + 1) {
    throw InvalidUsage("evaluation needs at least block_size + 1 = " + std::to_string(T + 1) + " bytes, got " +
                       std::to_string(bytes.size()));
  }
  WindowLoss result;
  result.windows = static_cast<std::int64_t>((bytes.size() - 1) / T);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(acts.capacity_B()) * T), targets(inputs.size());
  double sum = 0.0;
  for (std::int64_t first = 0; first < result.windows; first += acts.capacity_B()) {
    const int B = static_cast<int>(std::min<std::int64_t>(acts.capacity_B(), result.windows - first));
    for (int b = 0; b < B; ++b) {
      const std::uint8_t* window = bytes.data() + (first + b) * T;
      for (int t = 0; t < T; ++t) {
        inputs[b * T + t] = window[t];
        targets[b * T + t] = window[t + 1];
      }
    }
    acts.set_shape(B, T);
    model.forward(acts, inputs.data(), targets.data());
    sum += loss_sum(acts);
  }
  result.tokens = result.windows * T;
  result.loss = sum / static_cast<double>(result.tokens);
  return result;
}

}  // namespace braid::trainer
