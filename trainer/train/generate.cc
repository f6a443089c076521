#include "trainer/train/generate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "trainer/model/rng.h"

namespace braid::trainer {

namespace {

int pick(const float* logits, int V, float temperature, Rng& rng) {
  if (temperature == 0.0f) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  const float top = *std::max_element(logits, logits + V);
  std::vector<double> p(V);
  double sum = 0.0;
  for (int i = 0; i < V; ++i) sum += p[i] = std::exp((logits[i] - top) / temperature);
  double u = rng.uniform() * sum;
  for (int i = 0; i < V; ++i) {
    if ((u -= p[i]) <= 0.0) return i;
  }
  return V - 1;
}

}  // namespace

std::string generate(Gpt& model, const std::string& prompt, int count, float temperature, std::uint64_t seed) {
  const int maxT = model.config().block_size, V = model.config().vocab_size;
  Activations acts = model.make_activations(1, maxT);
  std::vector<std::int32_t> context;
  for (unsigned char c : prompt.empty() ? std::string("\n") : prompt) context.push_back(c);
  Rng rng(hash_words({seed, 0x73616d706c65ULL}));  // "sample": its own stream
  std::string out;
  std::vector<float> logits(V);
  for (int i = 0; i < count; ++i) {
    const int T = std::min<int>(maxT, static_cast<int>(context.size()));
    acts.set_shape(1, T);
    model.forward(acts, context.data() + context.size() - T, nullptr);
    model.ops().to_host(logits.data(), acts.head().logits + static_cast<std::size_t>(T - 1) * V, V * sizeof(float));
    const int next = pick(logits.data(), V, temperature, rng);
    context.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  return out;
}

}  // namespace braid::trainer
