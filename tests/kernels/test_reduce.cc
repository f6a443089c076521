// Reduction kernels against scalar definitions, and the f16/bf16 conversions
// against exactly representable values and round-to-nearest-even ties; the
// streaming copy against memcpy.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/reduce.h"

using namespace braid;
using namespace braid::kernels::cpu;

TEST_CASE("f16 conversion is exact on representable values and rounds ties to even") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    std::uint16_t half = static_cast<std::uint16_t>(h);
    float f = f16_to_f32(half);
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    REQUIRE(f32_to_f16(f) == half);
  }
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f32_to_f16(1.0f + 0.00048828125f) == 0x3c00);   // halfway 1 and 1+2^-10: to even
  CHECK(f32_to_f16(1.0f + 3 * 0.00048828125f) == 0x3c02);  // halfway, rounds up to even
  CHECK(f32_to_f16(65520.0f) == 0x7c00);                 // overflows to inf
  CHECK(f32_to_f16(65519.0f) == 0x7bff);
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0);         // tie at half the smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 1);
}

// The f16 reductions convert through the CPU's F16C instructions where
// the build has them (-march=native): every result must be the bits the
// scalar conversions give, for every f16 value (subnormals, infinities,
// NaNs: one quiet NaN, its sign kept), at every position of a block.
TEST_CASE("f16 reductions give the scalar conversions' bits for every value, NaNs included") {
  std::vector<std::uint16_t> a(0x10000), b(0x10000), got(0x10000);
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    a[i] = static_cast<std::uint16_t>(i);
    b[i] = static_cast<std::uint16_t>((i * 40503u + 12345u) & 0xffffu);
  }
  struct Case {
    ReduceOp op;
    float (*apply)(float, float);
  };
  const Case cases[] = {
      {ReduceOp::sum, [](float x, float y) { return x + y; }},
      {ReduceOp::prod, [](float x, float y) { return x * y; }},
  };
  for (const Case& c : cases) {
    INFO("op " << static_cast<int>(c.op));
    reduce(got.data(), a.data(), b.data(), got.size(), DataType::f16, c.op);
    std::size_t wrong = 0;
    for (std::uint32_t i = 0; i < 0x10000; ++i) {
      const std::uint16_t want = f32_to_f16(c.apply(f16_to_f32(a[i]), f16_to_f32(b[i])));
      const bool nan = (want & 0x7c00) == 0x7c00 && (want & 0x3ff) != 0;
      // The NaN's sign is the x86 operand's whose NaN it is: compare the rest.
      if (nan ? (got[i] & 0x7fff) != 0x7e00 : got[i] != want) ++wrong;
    }
    CHECK(wrong == 0);
  }
  // divide() (the avg's last step) through the same conversions.
  std::vector<std::uint16_t> divided = a;
  divide(divided.data(), divided.size(), DataType::f16, 3);
  std::size_t wrong = 0;
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    const std::uint16_t want = f32_to_f16(f16_to_f32(a[i]) / 3.0f);
    const bool nan = (want & 0x7c00) == 0x7c00 && (want & 0x3ff) != 0;
    if (nan ? (divided[i] & 0x7fff) != 0x7e00 : divided[i] != want) ++wrong;
  }
  CHECK(wrong == 0);
}

// The sign of an f16 NaN result must not depend on where its element lies:
// the eight-lane loop takes the first operand's NaN, and a scalar tail the
// compiler wrote as b + a took the second's (-NaN in the last elements,
// +NaN in the others, of one buffer; a review helper).
TEST_CASE("an f16 sum or product of two NaNs gives the same bits at every position, count and offset") {
  const std::pair<std::uint16_t, std::uint16_t> pairs[] = {{0x7e00, 0xfe00}, {0xfe00, 0x7e00}, {0x7c01, 0xfd00}};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod}) {
    for (const auto& [x, y] : pairs) {
      std::vector<std::uint16_t> a(48, x), b(48, y), got(48);
      reduce(got.data(), a.data(), b.data(), 16, DataType::f16, op);
      const std::uint16_t want = got[0];
      std::size_t wrong = 0;
      for (std::size_t offset = 0; offset < 8; ++offset) {
        for (std::size_t count = 1; count <= 40; ++count) {
          std::fill(got.begin(), got.end(), 0);
          reduce(got.data() + offset, a.data() + offset, b.data() + offset, count, DataType::f16, op);
          for (std::size_t i = offset; i < offset + count; ++i) wrong += got[i] != want;
          std::vector<std::uint16_t> in_place = a;  // dst == a
          reduce(in_place.data() + offset, in_place.data() + offset, b.data() + offset, count, DataType::f16, op);
          for (std::size_t i = offset; i < offset + count; ++i) wrong += in_place[i] != want;
        }
      }
      INFO("op " << static_cast<int>(op) << ", " << x << " and " << y << " give " << want);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("bf16 conversion is exact on representable values and rounds ties to even") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_bf16(f) == h);
  }
  CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // tie -> even (down)
  CHECK(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // tie -> even (up)
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

template <typename T>
std::vector<T> reduce_vec(const std::vector<T>& a, const std::vector<T>& b, DataType dt, ReduceOp op) {
  std::vector<T> out(a.size());
  reduce(out.data(), a.data(), b.data(), a.size(), dt, op);
  return out;
}

TEST_CASE("bitwise reductions of the integer types follow their definitions, and refuse floats") {
  std::vector<std::int8_t> a{-1, 0x55, -128, 12}, b{0x0f, 0x33, 1, -13};
  CHECK(reduce_vec(a, b, DataType::i8, ReduceOp::band) == std::vector<std::int8_t>{0x0f, 0x11, 0, 0});
  CHECK(reduce_vec(a, b, DataType::i8, ReduceOp::bor) == std::vector<std::int8_t>{-1, 0x77, -127, -1});
  CHECK(reduce_vec(a, b, DataType::i8, ReduceOp::bxor) == std::vector<std::int8_t>{-16, 0x66, -127, -1});
  std::vector<std::uint8_t> c{0xf0, 0xaa}, d{0x3c, 0x0f};
  CHECK(reduce_vec(c, d, DataType::u8, ReduceOp::bxor) == std::vector<std::uint8_t>{0xcc, 0xa5});
  std::vector<std::int32_t> e{-1, 0x12345678}, f{0x7fff0000, 0x0f0f0f0f};
  CHECK(reduce_vec(e, f, DataType::i32, ReduceOp::band) == std::vector<std::int32_t>{0x7fff0000, 0x02040608});
  std::vector<std::int64_t> g{1ll << 62, -2}, h{1, 1};
  CHECK(reduce_vec(g, h, DataType::i64, ReduceOp::bor) == std::vector<std::int64_t>{(1ll << 62) | 1, -1});
  std::vector<float> x{1.0f}, y{2.0f};
  CHECK_THROWS_WITH(reduce_vec(x, y, DataType::f32, ReduceOp::bor), Catch::Contains("f32 has no bitwise reduction"));
}

TEST_CASE("integer reductions follow their definitions") {
  std::vector<std::int32_t> a{1, -5, 7, 100, -3}, b{2, 3, -7, -100, -4};
  CHECK(reduce_vec(a, b, DataType::i32, ReduceOp::sum) == std::vector<std::int32_t>{3, -2, 0, 0, -7});
  CHECK(reduce_vec(a, b, DataType::i32, ReduceOp::prod) == std::vector<std::int32_t>{2, -15, -49, -10000, 12});
  CHECK(reduce_vec(a, b, DataType::i32, ReduceOp::min) == std::vector<std::int32_t>{1, -5, -7, -100, -4});
  CHECK(reduce_vec(a, b, DataType::i32, ReduceOp::max) == std::vector<std::int32_t>{2, 3, 7, 100, -3});
  std::vector<std::int8_t> c{-100, 50}, d{-100, -60};
  CHECK(reduce_vec(c, d, DataType::i8, ReduceOp::min) == std::vector<std::int8_t>{-100, -60});
  CHECK(reduce_vec(c, d, DataType::i8, ReduceOp::sum) == std::vector<std::int8_t>{56, -10});  // wraps
  std::vector<std::uint8_t> e{200, 3}, f{100, 4};
  CHECK(reduce_vec(e, f, DataType::u8, ReduceOp::max) == std::vector<std::uint8_t>{200, 4});
  std::vector<std::int64_t> g{1ll << 40, -1}, h{1ll << 40, 5};
  CHECK(reduce_vec(g, h, DataType::i64, ReduceOp::sum) == std::vector<std::int64_t>{1ll << 41, 4});
  std::vector<std::int32_t> avg{7, -7, 9};
  divide(avg.data(), avg.size(), DataType::i32, 2);
  CHECK(avg == std::vector<std::int32_t>{3, -3, 4});
  // avg's divisor is the communicator's size, wider than the small types:
  // cast to them first it was 0 for u8 at 256 ranks and -128 for i8 at 128.
  std::vector<std::uint8_t> u8_avg{200, 255};
  divide(u8_avg.data(), u8_avg.size(), DataType::u8, 256);
  CHECK(u8_avg == std::vector<std::uint8_t>{0, 0});
  std::vector<std::int8_t> i8_avg{-128, 100, 127};
  divide(i8_avg.data(), i8_avg.size(), DataType::i8, 128);
  CHECK(i8_avg == std::vector<std::int8_t>{-1, 0, 0});
}

// avg's integer divide goes through double up to 32 bits: it must truncate
// toward zero exactly as integer division does, for every i8 and u8 value
// and i32 values at the ends of the range, by divisors up to past INT_MAX / 2.
TEST_CASE("integer avg divides exactly as integer division truncates") {
  const int divisors[] = {1, 2, 3, 7, 127, 128, 255, 256, 1000, 65537, 1 << 30, 2147483647};
  for (int d : divisors) {
    INFO("divisor " << d);
    std::vector<std::int8_t> i8(256);
    std::vector<std::uint8_t> u8(256);
    for (int v = 0; v < 256; ++v) i8[v] = static_cast<std::int8_t>(v - 128), u8[v] = static_cast<std::uint8_t>(v);
    divide(i8.data(), i8.size(), DataType::i8, d);
    divide(u8.data(), u8.size(), DataType::u8, d);
    std::size_t wrong = 0;
    for (int v = 0; v < 256; ++v) wrong += i8[v] != (v - 128) / d, wrong += u8[v] != v / d;
    std::vector<std::int32_t> i32;
    for (std::int64_t v : {std::int64_t{INT32_MIN}, std::int64_t{INT32_MAX}, std::int64_t{0}})
      for (std::int64_t k = -3000; k <= 3000; ++k)
        if (v + k >= INT32_MIN && v + k <= INT32_MAX) i32.push_back(static_cast<std::int32_t>(v + k));
    for (std::int64_t k = 1; k < 3000; ++k)  // multiples of d and their neighbours
      for (int off : {-1, 0, 1})
        for (int sign : {-1, 1})
          if (const std::int64_t v = sign * (k * d + off); v >= INT32_MIN && v <= INT32_MAX)
            i32.push_back(static_cast<std::int32_t>(v));
    std::vector<std::int32_t> divided = i32;
    divide(divided.data(), divided.size(), DataType::i32, d);
    for (std::size_t i = 0; i < i32.size(); ++i) wrong += divided[i] != static_cast<std::int64_t>(i32[i]) / d;
    CHECK(wrong == 0);
  }
}

// The avg of halves scales its inputs down by a power of two and the result
// back up: through the exponent field where the result stays normal, which
// must give exactly what f32 arithmetic rounded back gives, for every f16
// and bf16 value and both directions.
TEST_CASE("halves scaled by a power of two match f32 arithmetic on every value") {
  std::vector<std::uint16_t> all(65536), out(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  for (DataType dtype : {DataType::f16, DataType::bf16}) {
    auto to = dtype == DataType::f16 ? f16_to_f32 : bf16_to_f32;
    auto from = dtype == DataType::f16 ? f32_to_f16 : f32_to_bf16;
    // +-40 and +-300 move no value of either type (the branch-free loop
    // must then move none); in place as well as into another buffer.
    for (int shift : {-300, -40, -6, -3, -2, -1, 1, 2, 3, 6, 40, 300}) {
      for (bool in_place : {false, true}) {
        if (in_place) out = all;
        scale_halves(out.data(), in_place ? out.data() : all.data(), all.size(), dtype, shift);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < all.size(); ++i) {
          const float want = std::ldexp(to(all[i]), shift);
          const bool same = std::isnan(want) ? std::isnan(to(out[i])) : out[i] == from(want);
          wrong += !same;
        }
        INFO(name(dtype) << " shift " << shift << (in_place ? " in place" : ""));
        CHECK(wrong == 0);
      }
    }
  }
}

// The avg's divide of halves, with and without the scale back up of inputs
// scaled down (Op::avg_scale_up): by a power of two it multiplies, and on
// the way back leaves blocks of values whose quotient is normal unwritten;
// every value must still be what the division rounded, then the scale
// rounded, give. In order, the 512-value blocks of the skip hold runs of
// normal values, and others a subnormal quotient, an infinity or a NaN.
TEST_CASE("halves divided, and scaled back up, give the division's and the scale's bits on every value") {
  std::vector<std::uint16_t> all(65536), got(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  struct Case {
    int divisor, scale_up;
  };
  const Case cases[] = {{1, 0}, {2, 0}, {2, 1}, {4, 2}, {8, 3}, {1024, 10}, {1 << 20, 20}, {1 << 30, 30},
                        {3, 0},  {3, 2}, {6, 3}, {7, 3}, {4, 3},  {2, 2}};
  for (DataType dtype : {DataType::f16, DataType::bf16}) {
    auto to = dtype == DataType::f16 ? f16_to_f32 : bf16_to_f32;
    auto from = dtype == DataType::f16 ? f32_to_f16 : f32_to_bf16;
    for (const Case& c : cases) {
      got = all;
      divide(got.data(), got.size(), dtype, c.divisor, c.scale_up);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < all.size(); ++i) {
        const float quotient = to(from(to(all[i]) / static_cast<float>(c.divisor)));
        const std::uint16_t want = from(std::ldexp(quotient, c.scale_up));
        const bool same = std::isnan(to(want)) ? std::isnan(to(got[i])) : got[i] == want;
        wrong += !same;
      }
      INFO(name(dtype) << " divisor " << c.divisor << " scale_up " << c.scale_up);
      CHECK(wrong == 0);
    }
  }
  std::vector<float> f32s(4, 1.0f);
  CHECK_THROWS_WITH(divide(f32s.data(), f32s.size(), DataType::f32, 2, 1), Catch::Contains("halves only"));
}

// The ring's sum of an avg's unscaled inputs: every pair must give the
// bits of scale_halves into copies and a sum of the copies.
TEST_CASE("sum_scaled_halves gives the bits of a sum of scaled copies for every value") {
  std::vector<std::uint16_t> a(65536), b(65536), got(65536), sa(65536), sb(65536), want(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    a[i] = static_cast<std::uint16_t>(i);
    b[i] = static_cast<std::uint16_t>((i * 40503u + 12345u) & 0xffffu);
  }
  const std::pair<int, int> shifts[] = {{-1, -1}, {-1, 0}, {0, -2}, {-3, -3}, {0, 0}, {-10, -10}, {2, -1}, {-140, 1}};
  for (DataType dtype : {DataType::f16, DataType::bf16}) {
    auto to = dtype == DataType::f16 ? f16_to_f32 : bf16_to_f32;
    for (const auto& [a_shift, b_shift] : shifts) {
      for (bool in_place : {false, true}) {
        scale_halves(sa.data(), a.data(), a.size(), dtype, a_shift);
        scale_halves(sb.data(), b.data(), b.size(), dtype, b_shift);
        reduce(want.data(), sa.data(), sb.data(), want.size(), dtype, ReduceOp::sum);
        if (in_place) got = a;
        sum_scaled_halves(got.data(), in_place ? got.data() : a.data(), a_shift, b.data(), b_shift, got.size(), dtype);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          wrong += std::isnan(to(want[i])) ? !std::isnan(to(got[i])) : got[i] != want[i];
        INFO(name(dtype) << " shifts " << a_shift << ", " << b_shift << (in_place ? " in place" : ""));
        CHECK(wrong == 0);
      }
    }
  }
  std::vector<float> f32s(4, 1.0f);
  CHECK_THROWS_WITH(sum_scaled_halves(f32s.data(), f32s.data(), -1, f32s.data(), -1, 2, DataType::f32),
                    Catch::Contains("f16 or bf16"));
}

TEST_CASE("float reductions in place and through f32 for half types") {
  std::vector<float> a(1001), b(1001);
  for (int i = 0; i < 1001; ++i) { a[i] = i * 0.5f; b[i] = 3.0f - i; }
  reduce(a.data(), a.data(), b.data(), a.size(), DataType::f32, ReduceOp::sum);  // in place
  for (int i = 0; i < 1001; ++i) REQUIRE(a[i] == i * 0.5f + 3.0f - i);
  std::vector<double> x{1.5, -2}, y{2, 4};
  CHECK(reduce_vec(x, y, DataType::f64, ReduceOp::prod) == std::vector<double>{3.0, -8.0});
  std::vector<std::uint16_t> p(300), q(300), r(300);
  for (int i = 0; i < 300; ++i) { p[i] = f32_to_f16(float(i)); q[i] = f32_to_f16(float(-2 * i)); }
  reduce(r.data(), p.data(), q.data(), 300, DataType::f16, ReduceOp::max);
  for (int i = 0; i < 300; ++i) REQUIRE(f16_to_f32(r[i]) == float(i));
  for (int i = 0; i < 300; ++i) { p[i] = f32_to_bf16(float(i)); q[i] = f32_to_bf16(1.0f); }
  reduce(r.data(), p.data(), q.data(), 300, DataType::bf16, ReduceOp::sum);
  for (int i = 0; i < 300; ++i) REQUIRE(bf16_to_f32(r[i]) == bf16_to_f32(f32_to_bf16(bf16_to_f32(p[i]) + 1)));
}

// min/max kept whichever operand came first for a NaN and for zeros of both
// signs, so recursive doubling (partners reduce in opposite orders) left
// ranks with different results. They are now IEEE 754-2019 minimum and
// maximum: NaN on either side gives NaN, -0 < +0, in either order.
template <typename T, typename Encode, typename Decode>
void check_min_max_order_free(DataType dtype, Encode encode, Decode decode) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> values{1.0f, -2.0f, 0.0f, -0.0f, nan, -nan, std::numeric_limits<float>::infinity()};
  for (float x : values) {
    for (float y : values) {
      for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
        INFO("dtype " << static_cast<int>(dtype) << " op " << static_cast<int>(op) << ": " << x << ", " << y);
        T a = encode(x), b = encode(y), ab{}, ba{};
        reduce(&ab, &a, &b, 1, dtype, op);
        reduce(&ba, &b, &a, 1, dtype, op);
        CHECK(std::memcmp(&ab, &ba, sizeof(T)) == 0);  // the same bits in either order
        const float got = decode(ab);
        if (std::isnan(x) || std::isnan(y)) {
          CHECK(std::isnan(got));
        } else {
          const float want = op == ReduceOp::min ? (x == y ? (std::signbit(x) ? x : y) : std::min(x, y))
                                                 : (x == y ? (std::signbit(x) ? y : x) : std::max(x, y));
          CHECK(got == want);
          CHECK(std::signbit(got) == std::signbit(want));
        }
      }
    }
  }
  // The same pairs in one call, at every lane of the vector loop and in its
  // tail: each must give what it gives alone.
  std::vector<T> pairs_a, pairs_b;
  for (float x : values)
    for (float y : values) pairs_a.push_back(encode(x)), pairs_b.push_back(encode(y));
  for (std::size_t lead = 0; lead < 9; ++lead) {
    std::vector<T> a(lead, encode(1.0f)), b(lead, encode(3.0f));
    a.insert(a.end(), pairs_a.begin(), pairs_a.end());
    b.insert(b.end(), pairs_b.begin(), pairs_b.end());
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
      std::vector<T> got(a.size());
      reduce(got.data(), a.data(), b.data(), a.size(), dtype, op);
      for (std::size_t i = lead; i < a.size(); ++i) {
        T alone{};
        reduce(&alone, &a[i], &b[i], 1, dtype, op);
        INFO("dtype " << static_cast<int>(dtype) << " op " << static_cast<int>(op) << " element " << i);
        CHECK(std::memcmp(&got[i], &alone, sizeof(T)) == 0);
      }
    }
  }
}

TEST_CASE("float min and max give NaN for a NaN and order -0 before +0, in either order of operands") {
  const auto same = [](float v) { return v; };
  check_min_max_order_free<float>(DataType::f32, same, same);
  check_min_max_order_free<double>(DataType::f64, [](float v) { return double(v); },
                                   [](double v) { return float(v); });
  check_min_max_order_free<std::uint16_t>(DataType::f16, f32_to_f16, f16_to_f32);
  check_min_max_order_free<std::uint16_t>(DataType::bf16, f32_to_bf16, bf16_to_f32);
}

TEST_CASE("stream_copy copies exactly at every size and alignment and touches nothing else") {
  std::vector<std::uint8_t> src(70000), dst(70000 + 256);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 131 + 7);
  for (std::size_t bytes : {0u, 1u, 63u, 64u, 4095u, 4096u, 4097u, 65536u + 37u}) {
    for (std::size_t src_off : {0u, 1u, 17u}) {
      for (std::size_t dst_off : {0u, 3u, 64u, 100u}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        stream_copy(dst.data() + dst_off, src.data() + src_off, bytes);
        INFO("bytes " << bytes << " src+" << src_off << " dst+" << dst_off);
        REQUIRE(std::memcmp(dst.data() + dst_off, src.data() + src_off, bytes) == 0);
        for (std::size_t i = 0; i < dst_off; ++i) REQUIRE(dst[i] == 0xEE);
        for (std::size_t i = dst_off + bytes; i < dst.size(); ++i) REQUIRE(dst[i] == 0xEE);
      }
    }
  }
}
