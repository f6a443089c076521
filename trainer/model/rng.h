// Deterministic random numbers for the trainer, identical on every platform.
//
// std::normal_distribution's output is implementation-defined, so the
// trainer uses its own: splitmix64 (Steele, Lea, Flood 2014) to seed and to
// hash, xoshiro256** (Blackman, Vigna 2018) as the stream, and Box-Muller
// for normals. The same seed gives the same model and the same batches with
// any compiler, on any rank.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "runtime/hash.h"

namespace braid::trainer {

// The splitmix64 finalizer: a bijective 64-bit mix, used as a hash.
std::uint64_t mix64(std::uint64_t x);

// Hash of a sequence of words: each word is folded into the state with
// mix64, so (a, b) and (b, a) differ. The basis of "sample i of step s is a
// function of (seed, s, i)".
std::uint64_t hash_words(std::initializer_list<std::uint64_t> words);

// FNV-1a, 64-bit: a stable hash of a name or of a file's bytes.
using runtime::fnv1a;

class Rng {
 public:
  explicit Rng(std::uint64_t seed);

  std::uint64_t next_u64();
  // Uniform in (0, 1): 53 random bits, never 0 (safe for log in Box-Muller).
  double uniform();
  // Standard normal by Box-Muller; the second value of each pair is kept.
  double normal();

 private:
  std::array<std::uint64_t, 4> s_{};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace braid::trainer
