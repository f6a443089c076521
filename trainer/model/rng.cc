#include "trainer/model/rng.h"

#include <cmath>
#include <numbers>

namespace braid::trainer {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t hash_words(std::initializer_list<std::uint64_t> words) {
  std::uint64_t h = 0x243f6a8885a308d3ULL;  // digits of pi: any fixed basis works
  for (auto w : words) h = mix64(h ^ w);
  return h;
}

Rng::Rng(std::uint64_t seed) {
  // Seed xoshiro's four words from a splitmix64 sequence, as Vigna advises.
  for (auto& w : s_) {
    seed += 0x9e3779b97f4a7c15ULL;
    w = mix64(seed);
  }
}

std::uint64_t Rng::next_u64() {
  auto rotl = [](std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() {
  return (static_cast<double>(next_u64() >> 11) + 0.5) * 0x1.0p-53;
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double r = std::sqrt(-2.0 * std::log(uniform()));
  const double theta = 2.0 * std::numbers::pi * uniform();
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

}  // namespace braid::trainer
