// FNV-1a, 64 bits: a hash every compiler and host computes alike, unlike
// std::hash, for what the ranks of a job (or two runs of it) must derive
// alike from a name: store ports, shared-memory names, communicator ids,
// the trainer's per-parameter seeds.
#pragma once

#include <cstdint>
#include <string_view>

namespace braid::runtime {

inline constexpr std::uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;

inline std::uint64_t fnv1a(std::string_view bytes, std::uint64_t hash = kFnv1aBasis) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

}  // namespace braid::runtime
