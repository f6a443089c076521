// The host Reducer: kernels::cpu block by block. Each block of the result
// is reduced into one accumulator and copied from there, still in cache, to
// the other destinations. The accumulator is a destination that no source
// but the first can be clobbered through (in place, the destination that is
// the first source; out of place, any destination), else a per-thread
// scratch block, so that no source is overwritten before it is read.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/reducer.h"
#include "kernels/cpu/reduce.h"
#include "runtime/errors.h"

namespace braid::comm {
namespace {

constexpr std::size_t kBlockBytes = 32u << 10;

bool overlap(const std::byte* a, const std::byte* b, std::size_t bytes) { return a < b + bytes && b < a + bytes; }

// Where block [at, at + bytes) of the result is reduced: a destination that
// overlaps no source other than being the first one, else `scratch`.
std::byte* accumulator(std::span<void* const> dsts, std::span<const void* const> srcs, std::size_t at,
                       std::size_t bytes, std::byte* scratch) {
  for (void* d : dsts) {
    auto* dst = static_cast<std::byte*>(d) + at;
    bool clobbers = false;
    for (std::size_t k = 0; k < srcs.size() && !clobbers; ++k) {
      const auto* src = static_cast<const std::byte*>(srcs[k]) + at;
      clobbers = overlap(dst, src, bytes) && !(k == 0 && dst == src);
    }
    if (!clobbers) return dst;
  }
  return scratch;
}

class HostReducer final : public Reducer {
 public:
  void reduce_multi(std::span<void* const> dsts, std::span<const void* const> srcs, std::size_t count,
                    DataType dtype, ReduceOp op, Averaging avg) override {
    if (srcs.empty() || dsts.empty()) throw InvalidUsage("reduce_multi needs a source and a destination");
    const std::size_t es = dtype_bytes(dtype), block = std::max<std::size_t>(1, kBlockBytes / es);
    thread_local std::vector<std::byte> scratch(kBlockBytes);
    for (std::size_t done = 0; done < count; done += block) {
      const std::size_t elems = std::min(block, count - done), at = done * es, bytes = elems * es;
      if (srcs.size() == 1 && avg.source_shift == 0) {
        copy_block(dsts, static_cast<const std::byte*>(srcs[0]) + at, at, bytes);
        continue;
      }
      std::byte* acc = accumulator(dsts, srcs, at, bytes, scratch.data());
      auto src = [&](std::size_t k) { return static_cast<const std::byte*>(srcs[k]) + at; };
      if (avg.source_shift != 0) {
        // The sources of an avg of halves as they are: each scaled as it is
        // read, the bits of a reduce of scaled copies.
        const int s = avg.source_shift;
        if (srcs.size() == 1) kernels::cpu::scale_halves(acc, src(0), elems, dtype, s);
        else kernels::cpu::sum_scaled_halves(acc, src(0), s, src(1), s, elems, dtype);
        for (std::size_t k = 2; k < srcs.size(); ++k) kernels::cpu::sum_scaled_halves(acc, acc, 0, src(k), s, elems, dtype);
      } else {
        kernels::cpu::reduce(acc, src(0), src(1), elems, dtype, op);
        for (std::size_t k = 2; k < srcs.size(); ++k) kernels::cpu::reduce(acc, acc, src(k), elems, dtype, op);
      }
      if (avg.divisor != 0) kernels::cpu::divide(acc, elems, dtype, avg.divisor, avg.scale_up);
      copy_block(dsts, acc, at, bytes);
    }
  }

  void finish(Clock::time_point) override {}

 private:
  // Block `at` of every destination from `from` (skipping a destination that is `from`).
  static void copy_block(std::span<void* const> dsts, const std::byte* from, std::size_t at, std::size_t bytes) {
    for (void* d : dsts) {
      auto* dst = static_cast<std::byte*>(d) + at;
      if (dst != from) std::memmove(dst, from, bytes);
    }
  }
};

}  // namespace

Reducer& host_reducer() {
  static HostReducer reducer;
  return reducer;
}

}  // namespace braid::comm
