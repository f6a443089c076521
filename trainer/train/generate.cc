#include "trainer/train/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

// The length of the well-formed UTF-8 sequence of two to four bytes at the
// start of `s` (Unicode's table 3-7: no overlong forms, no surrogates,
// nothing past U+10FFFF), or 0.
std::size_t utf8_sequence(std::string_view s) {
  auto at = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  auto cont = [&](std::size_t i, unsigned lo = 0x80, unsigned hi = 0xbf) {
    return i < s.size() && at(i) >= lo && at(i) <= hi;
  };
  const unsigned b = at(0);
  if (b >= 0xc2 && b <= 0xdf) return cont(1) ? 2 : 0;
  if (b >= 0xe0 && b <= 0xef) {
    const unsigned lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (b >= 0xf0 && b <= 0xf4) {
    const unsigned lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

std::string terminal_safe(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (b == '\\') {  // doubled, so that a generated "\x7f" does not read as an escaped byte
      out += "\\\\";
      ++i;
      continue;
    }
    if ((b >= 0x20 && b < 0x7f) || b == '\n' || b == '\t') {
      out += bytes[i++];
      continue;
    }
    const std::size_t n = b >= 0x80 ? utf8_sequence(bytes.substr(i)) : 0;
    // U+0080..U+009F, the C1 controls, are 0xc2 0x80..0x9f.
    if (n && !(b == 0xc2 && static_cast<unsigned char>(bytes[i + 1]) < 0xa0)) {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", b);
    out += hex;
    ++i;
  }
  return out;
}

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
