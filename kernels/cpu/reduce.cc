#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

namespace braid::kernels::cpu {
namespace {

template <typename T>
struct Sum { static T apply(T a, T b) { return a + b; } };
template <typename T>
struct Prod { static T apply(T a, T b) { return a * b; } };
// Min and max are IEEE 754-2019's minimum and maximum: a NaN on either
// side gives NaN (one quiet NaN, whatever the payloads) and -0 < +0, so
// the order of the operands never matters. `b < a ? b : a` kept whichever
// operand came first for NaN and for zeros of both signs: recursive
// doubling, whose partners reduce (own, peer) in opposite orders, left
// ranks with different results (NaN on one, 1.0 on the other), and a NaN
// counted or not by the rank that held it.
//
// Written as selects, with no early return, so that the loops vectorise:
// the branches made an f64 min 8 times slower than an f64 sum. Equal
// operands are equal bits but for +0 and -0, so their minimum is the OR of
// the bits (-0 where either is) and their maximum the AND.
template <typename T>
using FloatBits = std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t>;

template <typename T>
struct Min {
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      const FloatBits<T> ua = std::bit_cast<FloatBits<T>>(a), ub = std::bit_cast<FloatBits<T>>(b);
      T r = b < a ? b : a;
      r = a == b ? std::bit_cast<T>(static_cast<FloatBits<T>>(ua | ub)) : r;
      return a != a || b != b ? std::numeric_limits<T>::quiet_NaN() : r;
    } else {
      return b < a ? b : a;
    }
  }
};
template <typename T>
struct Max {
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      const FloatBits<T> ua = std::bit_cast<FloatBits<T>>(a), ub = std::bit_cast<FloatBits<T>>(b);
      T r = a < b ? b : a;
      r = a == b ? std::bit_cast<T>(static_cast<FloatBits<T>>(ua & ub)) : r;
      return a != a || b != b ? std::numeric_limits<T>::quiet_NaN() : r;
    } else {
      return a < b ? b : a;
    }
  }
};

// The bitwise operators, for the integer types only (dispatch_bitwise).
template <typename T>
struct BitAnd { static T apply(T a, T b) { return static_cast<T>(a & b); } };
template <typename T>
struct BitOr { static T apply(T a, T b) { return static_cast<T>(a | b); } };
template <typename T>
struct BitXor { static T apply(T a, T b) { return static_cast<T>(a ^ b); } };

// Integer sums and products wrap (as they do in NCCL and MPI), computed in
// unsigned arithmetic so that overflow is defined.
template <typename T, template <typename> class Op>
void loop(T* dst, const T* a, const T* b, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = Op<T>::apply(a[i], b[i]);
}

template <typename T, typename U, template <typename> class Op>
void loop_wrapping(T* dst, const T* a, const T* b, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    dst[i] = static_cast<T>(Op<U>::apply(static_cast<U>(a[i]), static_cast<U>(b[i])));
}

// Halves to f32 and back, a block at a time. f16 goes through the CPU's
// F16C conversions where it has them (built with -march=native): the
// branchy scalar ones made an f16 sum 13 times slower than a bf16 one (1 MiB
// all_reduce on 2 ranks: 1006 us against 74). They agree with the scalar
// ones bit for bit (both round to nearest even, subnormals included), but
// for the payload of a NaN: a NaN result is made the one quiet NaN the
// scalar conversion gives, sign kept, so that no result depends on where
// the vector part of a block ends.
template <float (*ToF32)(std::uint16_t)>
void halves_to_f32(const std::uint16_t* in, float* out, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  if constexpr (ToF32 == &f16_to_f32)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < n; ++i) out[i] = ToF32(in[i]);
}

#if defined(__F16C__) && defined(__AVX__)
// Eight f32 to f16, rounded to nearest even, a NaN made the one quiet NaN
// of the scalar conversion (its sign kept).
inline __m128i f32x8_to_f16(__m256 x) {
  const __m128i exponent = _mm_set1_epi16(0x7c00), mantissa = _mm_set1_epi16(0x03ff);
  const __m128i sign = _mm_set1_epi16(static_cast<short>(0x8000)), quiet = _mm_set1_epi16(0x7e00);
  const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m128i all_ones = _mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent);
  const __m128i no_payload = _mm_cmpeq_epi16(_mm_and_si128(h, mantissa), _mm_setzero_si128());
  const __m128i nan = _mm_andnot_si128(no_payload, all_ones);
  const __m128i canonical = _mm_or_si128(_mm_and_si128(h, sign), quiet);
  return _mm_or_si128(_mm_and_si128(nan, canonical), _mm_andnot_si128(nan, h));
}
#endif

template <std::uint16_t (*FromF32)(float)>
void f32_to_halves(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  if constexpr (FromF32 == &f32_to_f16)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), f32x8_to_f16(_mm256_loadu_ps(in + i)));
#endif
  for (; i < n; ++i) out[i] = FromF32(in[i]);
}

template <float (*ToF32)(std::uint16_t), std::uint16_t (*FromF32)(float), template <typename> class Op>
void loop_half(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* b, std::size_t count) {
#if defined(__F16C__) && defined(__AVX__)
  // An f16 sum or product eight at a time in registers, through the same
  // conversions and the same operation as the blocks below, without their
  // round trips through f32 buffers: the f16 sum ran at 60% of the bf16
  // one's speed in cache, and it is the most common reduction of halves.
  constexpr bool sum = std::is_same_v<Op<float>, Sum<float>>, prod = std::is_same_v<Op<float>, Prod<float>>;
  // The tail goes through the same eight lanes, padded: a scalar a + b,
  // which the compiler may emit as b + a, gave the second operand's NaN
  // where the lanes give the first's, so the sign of a NaN sum depended on
  // where its element lay (a review helper).
  if constexpr (ToF32 == &f16_to_f32 && (sum || prod)) {
    auto eight = [](const std::uint16_t* x8, const std::uint16_t* y8) {
      const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x8)));
      const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y8)));
      return f32x8_to_f16(sum ? _mm256_add_ps(x, y) : _mm256_mul_ps(x, y));
    };
    std::size_t i = 0;
    for (; i + 8 <= count; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), eight(a + i, b + i));
    if (i < count) {
      const std::size_t rest = count - i;
      std::uint16_t x[8] = {}, y[8] = {}, r[8];
      std::memcpy(x, a + i, rest * sizeof(std::uint16_t));
      std::memcpy(y, b + i, rest * sizeof(std::uint16_t));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r), eight(x, y));
      std::memcpy(dst + i, r, rest * sizeof(std::uint16_t));
    }
    return;
  }
#endif
  constexpr std::size_t kBlock = 256;
  float fa[kBlock], fb[kBlock];
  for (std::size_t base = 0; base < count; base += kBlock) {
    std::size_t n = std::min(kBlock, count - base);
    halves_to_f32<ToF32>(a + base, fa, n);
    halves_to_f32<ToF32>(b + base, fb, n);
    for (std::size_t i = 0; i < n; ++i) fa[i] = Op<float>::apply(fa[i], fb[i]);
    f32_to_halves<FromF32>(fa, dst + base, n);
  }
}

template <template <typename> class Op>
void dispatch(void* d, const void* a, const void* b, std::size_t n, DataType dtype) {
  using u16 = std::uint16_t;
  switch (dtype) {
    case DataType::f32: return loop<float, Op>((float*)d, (const float*)a, (const float*)b, n);
    case DataType::f64: return loop<double, Op>((double*)d, (const double*)a, (const double*)b, n);
    case DataType::f16:
      return loop_half<f16_to_f32, f32_to_f16, Op>((u16*)d, (const u16*)a, (const u16*)b, n);
    case DataType::bf16:
      return loop_half<bf16_to_f32, f32_to_bf16, Op>((u16*)d, (const u16*)a, (const u16*)b, n);
    case DataType::i8:
      return loop_wrapping<std::int8_t, std::uint32_t, Op>((std::int8_t*)d, (const std::int8_t*)a,
                                                           (const std::int8_t*)b, n);
    case DataType::u8: return loop<std::uint8_t, Op>((std::uint8_t*)d, (const std::uint8_t*)a,
                                                     (const std::uint8_t*)b, n);
    case DataType::i32:
      return loop_wrapping<std::int32_t, std::uint32_t, Op>((std::int32_t*)d, (const std::int32_t*)a,
                                                            (const std::int32_t*)b, n);
    case DataType::i64:
      return loop_wrapping<std::int64_t, std::uint64_t, Op>((std::int64_t*)d, (const std::int64_t*)a,
                                                            (const std::int64_t*)b, n);
  }
}

// min/max on signed integers must compare as signed, so they use plain loops.
template <template <typename> class Op>
void dispatch_ordered(void* d, const void* a, const void* b, std::size_t n, DataType dtype) {
  switch (dtype) {
    case DataType::i8: return loop<std::int8_t, Op>((std::int8_t*)d, (const std::int8_t*)a, (const std::int8_t*)b, n);
    case DataType::i32: return loop<std::int32_t, Op>((std::int32_t*)d, (const std::int32_t*)a, (const std::int32_t*)b, n);
    case DataType::i64: return loop<std::int64_t, Op>((std::int64_t*)d, (const std::int64_t*)a, (const std::int64_t*)b, n);
    default: return dispatch<Op>(d, a, b, n, dtype);
  }
}

// Bitwise operators on the bits as they lie, of the integer types only: the
// communicator refuses them on floating-point types before any kernel runs.
template <template <typename> class Op>
void dispatch_bitwise(void* d, const void* a, const void* b, std::size_t n, DataType dtype) {
  using u8 = std::uint8_t;
  using u32 = std::uint32_t;
  using u64 = std::uint64_t;
  switch (dtype) {
    case DataType::i8:
    case DataType::u8: return loop<u8, Op>((u8*)d, (const u8*)a, (const u8*)b, n);
    case DataType::i32: return loop<u32, Op>((u32*)d, (const u32*)a, (const u32*)b, n);
    case DataType::i64: return loop<u64, Op>((u64*)d, (const u64*)a, (const u64*)b, n);
    default:
      throw std::invalid_argument("braid kernels: " + std::string(name(dtype)) +
                                  " has no bitwise reduction (integer types only)");
  }
}

template <typename T>
void divide_loop(T* data, std::size_t count, int divisor) {
  if constexpr (std::is_integral_v<T>) {
    // The divisor is never cast to T: the communicator's size would be 0
    // for u8 at 256 ranks (a division by zero) and negative for i8 at 128.
    // Up to 32 bits through double, which vectorises where a division by a
    // divisor known only at run time does not (1% of memcpy's speed): the
    // quotient of two integers below 2^31 is never within double's rounding
    // of the next integer, so truncating it gives the integer quotient.
    if constexpr (sizeof(T) <= 4) {
      const double d = divisor;
      for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<T>(static_cast<double>(data[i]) / d);
      return;
    }
    // i64 in 64 bits.
    using Wide = std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>;
    for (std::size_t i = 0; i < count; ++i)
      data[i] = static_cast<T>(static_cast<Wide>(data[i]) / static_cast<Wide>(divisor));
  } else {
    for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<T>(data[i] / static_cast<T>(divisor));
  }
}

// out[i] = fn(in[i]) for halves, computed in f32 a block at a time and
// rounded back to nearest even; out may be in.
template <float (*ToF32)(std::uint16_t), std::uint16_t (*FromF32)(float), typename Fn>
void map_half(const std::uint16_t* in, std::uint16_t* out, std::size_t count, Fn fn) {
  constexpr std::size_t kBlock = 256;
  float f[kBlock];
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t n = std::min(kBlock, count - base);
    halves_to_f32<ToF32>(in + base, f, n);
    for (std::size_t i = 0; i < n; ++i) f[i] = fn(f[i]);
    f32_to_halves<FromF32>(f, out + base, n);
  }
}

// sum_scaled_halves a block at a time, in cache: the operands whose shift
// asks are scaled into blocks of their own (scale_halves, whose exponent
// add takes nearly every value), then summed as reduce sums. Through f32
// in the sum's own loop instead (a product and a rounding back through the
// type per operand), the sum ran slower than the copy it replaced.
template <float (*ToF32)(std::uint16_t), std::uint16_t (*FromF32)(float)>
void sum_scaled_loop(std::uint16_t* dst, const std::uint16_t* a, int a_shift, const std::uint16_t* b, int b_shift,
                     std::size_t count, DataType dtype) {
  constexpr std::size_t kBlock = 512;
  std::uint16_t scaled_a[kBlock], scaled_b[kBlock];
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t n = std::min(kBlock, count - base);
    const std::uint16_t* x = a + base;
    const std::uint16_t* y = b + base;
    if (a_shift != 0) scale_halves(scaled_a, x, n, dtype, a_shift), x = scaled_a;
    if (b_shift != 0) scale_halves(scaled_b, y, n, dtype, b_shift), y = scaled_b;
    loop_half<ToF32, FromF32, Sum>(dst + base, x, y, n);
  }
}

template <float (*ToF32)(std::uint16_t), std::uint16_t (*FromF32)(float)>
void divide_half(std::uint16_t* data, std::size_t count, int divisor) {
  const float d = static_cast<float>(divisor);
  map_half<ToF32, FromF32>(data, data, count, [d](float x) { return x / d; });
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return dispatch<Sum>(dst, a, b, count, dtype);
    case ReduceOp::prod: return dispatch<Prod>(dst, a, b, count, dtype);
    case ReduceOp::min: return dispatch_ordered<Min>(dst, a, b, count, dtype);
    case ReduceOp::max: return dispatch_ordered<Max>(dst, a, b, count, dtype);
    case ReduceOp::band: return dispatch_bitwise<BitAnd>(dst, a, b, count, dtype);
    case ReduceOp::bor: return dispatch_bitwise<BitOr>(dst, a, b, count, dtype);
    case ReduceOp::bxor: return dispatch_bitwise<BitXor>(dst, a, b, count, dtype);
  }
}

void scale_halves(void* dst, const void* src, std::size_t count, DataType dtype, int shift) {
  auto* out = static_cast<std::uint16_t*>(dst);
  const auto* in = static_cast<const std::uint16_t*>(src);
  const bool f16 = dtype == DataType::f16;
  const int mantissa_bits = f16 ? 10 : 7, max_exponent = f16 ? 30 : 254;  // of a finite value
  const auto exponent_mask = static_cast<std::uint16_t>(f16 ? 0x7c00 : 0x7f80);
  // A normal value moves to a normal one, exactly, where its exponent field
  // e and e + shift both lie in [1, max_exponent]: then the field moves by
  // adding shift << mantissa_bits to the bits, no carry past it. As bounds
  // on the field in place, so that the test and the move are 16-bit
  // compares and an add the compiler vectorises (the shift of each field
  // down and back up it did not: 74 us for 1 MiB, against 11 for a divide
  // of f32).
  const int lowest = std::max(1, 1 - shift), highest = std::min(max_exponent, max_exponent - shift);
  const bool some_move = lowest <= highest;
  // Where none moves, a range no field reaches (fields are at most 0x7f80).
  const auto low = static_cast<std::uint16_t>(some_move ? lowest << mantissa_bits : 0x8000);
  const auto high = static_cast<std::uint16_t>(some_move ? highest << mantissa_bits : 0x8000);
  const auto delta = static_cast<std::uint16_t>(static_cast<unsigned>(shift) << mantissa_bits);
  auto moves = [&](std::uint16_t x) {
    return static_cast<std::uint16_t>((x & exponent_mask) - low) <= static_cast<std::uint16_t>(high - low);
  };
  auto is_zero = [](std::uint16_t x) { return static_cast<std::uint16_t>(x << 1) == 0; };
  // In blocks, each looked at first (dst may be src): a block whose nonzero
  // values all move, nearly every block, takes the branch-free loop (a zero
  // stays itself); one with others (subnormals, results out of the normal
  // range, infinities and NaNs) takes them one by one, the others through
  // f32, rounded to nearest even. The look is a min and a max of the fields,
  // which vectorises better than a count of the values out of range.
  constexpr std::size_t kBlock = 512;
  for (std::size_t start = 0; start < count; start += kBlock) {
    const std::size_t n = std::min(kBlock, count - start);
    const std::uint16_t* x = in + start;
    std::uint16_t* y = out + start;
    std::uint16_t least = 0xffff, most = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto e = static_cast<std::uint16_t>(is_zero(x[i]) ? low : x[i] & exponent_mask);
      least = std::min(least, e);
      most = std::max(most, e);
    }
    if (some_move && least >= low && most <= high) {
      for (std::size_t i = 0; i < n; ++i)
        y[i] = static_cast<std::uint16_t>(x[i] + (moves(x[i]) ? delta : std::uint16_t{0}));
      continue;
    }
    // The others through f32, where a product by 2^shift is exact (or, for
    // a result below f32's normals, rounded once, as ldexp rounds it), then
    // rounded back to nearest even, in vector loops (F16C's conversions for
    // f16). One by one, each through the scalar conversions, a block with
    // a single small value cost 40 times the branch-free loop: gradients in
    // f16 have some in nearly every block, and an f16 avg of them ran 20 to
    // 40 times slower than the sum. Per element through ldexp for a shift
    // whose power of two f32 does not hold, and for f16 on a CPU without
    // F16C, whose scalar conversions of a whole block cost 3-5 times the
    // few odd values' (a review helper).
#if defined(__F16C__) && defined(__AVX__)
    constexpr bool f16_vectors = true;
#else
    constexpr bool f16_vectors = false;
#endif
    if (shift >= -126 && shift <= 127 && (f16_vectors || !f16)) {
      const float scale = std::ldexp(1.0f, shift);
      auto times_scale = [scale](float v) { return v * scale; };
      if (f16) map_half<f16_to_f32, f32_to_f16>(x, y, n, times_scale);
      else map_half<bf16_to_f32, f32_to_bf16>(x, y, n, times_scale);
      continue;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t v = x[i];
      if (moves(v)) y[i] = static_cast<std::uint16_t>(v + delta);
      else if (is_zero(v)) y[i] = v;
      else y[i] = f16 ? f32_to_f16(std::ldexp(f16_to_f32(v), shift)) : f32_to_bf16(std::ldexp(bf16_to_f32(v), shift));
    }
  }
}

void sum_scaled_halves(void* dst, const void* a, int a_shift, const void* b, int b_shift, std::size_t count,
                       DataType dtype) {
  using u16 = std::uint16_t;
  switch (dtype) {
    case DataType::f16:
      return sum_scaled_loop<f16_to_f32, f32_to_f16>((u16*)dst, (const u16*)a, a_shift, (const u16*)b, b_shift, count,
                                                     dtype);
    case DataType::bf16:
      return sum_scaled_loop<bf16_to_f32, f32_to_bf16>((u16*)dst, (const u16*)a, a_shift, (const u16*)b, b_shift,
                                                       count, dtype);
    default:
      throw std::invalid_argument("braid kernels: sum_scaled_halves takes f16 or bf16, not " + std::string(name(dtype)));
  }
}

namespace {

// Halves divided by 2^m and then scaled by 2^m (the avg of inputs scaled
// down by 2^m on a power-of-two number of ranks). A value whose quotient
// is a normal number comes back as it was, so a block of only such values
// (and zeros) is left unwritten; a block with any other (a quotient below
// the normals, an infinity, a NaN) goes through both scales, each rounded
// as the division and the scale round.
void divide_and_scale_back(std::uint16_t* data, std::size_t count, DataType dtype, int m) {
  const bool f16 = dtype == DataType::f16;
  const int mantissa_bits = f16 ? 10 : 7, max_exponent = f16 ? 30 : 254;  // of a finite value
  const auto exponent_mask = static_cast<std::uint16_t>(f16 ? 0x7c00 : 0x7f80);
  if (m + 1 > max_exponent) {  // no quotient is normal
    scale_halves(data, data, count, dtype, -m);
    return scale_halves(data, data, count, dtype, m);
  }
  const auto low = static_cast<std::uint16_t>((m + 1) << mantissa_bits);
  const auto high = static_cast<std::uint16_t>(max_exponent << mantissa_bits);
  constexpr std::size_t kBlock = 512;
  for (std::size_t start = 0; start < count; start += kBlock) {
    const std::size_t n = std::min(kBlock, count - start);
    std::uint16_t* x = data + start;
    std::uint16_t least = 0xffff, most = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool zero = static_cast<std::uint16_t>(x[i] << 1) == 0;
      const auto e = static_cast<std::uint16_t>(zero ? low : x[i] & exponent_mask);
      least = std::min(least, e);
      most = std::max(most, e);
    }
    if (least >= low && most <= high) continue;
    scale_halves(x, x, n, dtype, -m);
    scale_halves(x, x, n, dtype, m);
  }
}

}  // namespace

void divide(void* data, std::size_t count, DataType dtype, int divisor, int scale_up) {
  const bool halves = dtype == DataType::f16 || dtype == DataType::bf16;
  if (scale_up != 0 && !halves)
    throw std::invalid_argument("braid kernels: divide scales up halves only, not " + std::string(name(dtype)));
  auto* h = static_cast<std::uint16_t*>(data);
  if (halves && divisor > 0 && std::has_single_bit(static_cast<unsigned>(divisor))) {
    // A quotient by 2^m is a product by 2^-m, which f32 holds exactly: the
    // same value rounded the same way, without a division (an f16 divide
    // ran at a quarter of memcpy's speed).
    const int m = std::countr_zero(static_cast<unsigned>(divisor));
    if (scale_up == m) return divide_and_scale_back(h, count, dtype, m);
    scale_halves(h, h, count, dtype, -m);
    if (scale_up != 0) scale_halves(h, h, count, dtype, scale_up);
    return;
  }
  if (scale_up != 0) {
    // A block at a time, divided and then scaled while it is in cache: the
    // same bits as a divide of the whole and then a scale of the whole, in
    // one pass over memory instead of two.
    constexpr std::size_t kBlock = 2048;
    for (std::size_t at = 0; at < count; at += kBlock) {
      const std::size_t n = std::min(kBlock, count - at);
      if (dtype == DataType::f16) divide_half<f16_to_f32, f32_to_f16>(h + at, n, divisor);
      else divide_half<bf16_to_f32, f32_to_bf16>(h + at, n, divisor);
      scale_halves(h + at, h + at, n, dtype, scale_up);
    }
    return;
  }
  switch (dtype) {
    case DataType::f32: return divide_loop((float*)data, count, divisor);
    case DataType::f64: return divide_loop((double*)data, count, divisor);
    case DataType::f16: return divide_half<f16_to_f32, f32_to_f16>((std::uint16_t*)data, count, divisor);
    case DataType::bf16: return divide_half<bf16_to_f32, f32_to_bf16>((std::uint16_t*)data, count, divisor);
    case DataType::i8: return divide_loop((std::int8_t*)data, count, divisor);
    case DataType::u8: return divide_loop((std::uint8_t*)data, count, divisor);
    case DataType::i32: return divide_loop((std::int32_t*)data, count, divisor);
    case DataType::i64: return divide_loop((std::int64_t*)data, count, divisor);
  }
}

float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {        // subnormal: normalise
    int shift = 0;
    while (!(mant & 0x400u)) { mant <<= 1; ++shift; }
    mant &= 0x3ffu;
    bits = sign | (static_cast<std::uint32_t>(113 - shift) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t f32_to_f16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  std::uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // inf or NaN (NaN keeps a mantissa bit)
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                         // below the smallest normal half
    if (abs < 0x33000000u) return sign;            // below half the smallest subnormal
    std::uint32_t exp = abs >> 23;
    std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126 - exp;               // 14 + (113 - exp) - 1
    std::uint32_t half = mant >> shift;
    std::uint32_t rest = mant & ((1u << shift) - 1);
    std::uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return sign | static_cast<std::uint16_t>(half);
  }
  std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even
  return sign | static_cast<std::uint16_t>((rounded - 0x38000000u) >> 13);
}

float bf16_to_f32(std::uint16_t h) {
  std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t f32_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

void stream_copy(void* dst, const void* src, std::size_t bytes) {
#if defined(__SSE2__)
  constexpr std::size_t kMinBytes = 4096;
  if (bytes < kMinBytes) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<std::byte*>(dst);
  auto* s = static_cast<const std::byte*>(src);
  // Plain copy up to the destination's first cache line, streamed lines after.
  std::size_t head = (64 - reinterpret_cast<std::uintptr_t>(d) % 64) % 64;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  std::size_t lines = bytes / 64;
  for (std::size_t i = 0; i < lines; ++i, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  _mm_sfence();  // streamed stores are weakly ordered: publish them before returning
  std::memcpy(d, s, bytes % 64);
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace braid::kernels::cpu
