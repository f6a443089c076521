// The inputs and expected results of braid-check, computed without any of
// braid's code (no kernels/, no tools/bench/verify): a checker that shared
// the reduction kernels with the code under test could not see them wrong.
//
// Every input is a small number exact in its dtype, so every sum, max and
// average of them is exact too and is predicted in int64 arithmetic, in
// units of 1/256 for f32 and of 1 for bf16 and i64; results are compared bit
// for bit, in any order of reduction. Element `index` of rank `rank` in a
// job of `ranks`, in whole units:
//
//   base(index) + 2 * ((rank + index) % ranks)   [+ high(index) for i64]
//                                                [+ fraction(index) for f32]
//
// base is a multiplicative hash of the index in [-6, 6], so a block of the
// result moved by any offset lands on other values; the second term makes
// the ranks' values at one index all different (a result taken from the
// wrong rank shows) and their sum a multiple of `ranks`, so the average is
// an exact integer; high is -2^33, 0 or 2^33, so an i64 reduced or moved as
// 32-bit halves shows. fraction is k/256, k in [1, 255] and alike on every
// rank (the average stays exact): an f32 result that went through a
// narrower type (bf16 keeps 8 significant bits) loses it and shows; whole
// numbers alone were exact in bf16 too (a review helper's case). f32 sums
// stay exact up to 128 ranks, bf16's (|v| <= 256) up to 10.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/dtype.h"

namespace braid::check {

// Values are in units of 1/256 for f32, of 1 for the others (above).
std::int64_t input_value(int rank, std::size_t index, int ranks, DataType dtype);
// The reduction over all ranks of element `index`: sum, max or avg.
std::int64_t reduced_value(std::size_t index, int ranks, DataType dtype, ReduceOp op);

// The dtypes and ops the value model is exact for.
bool supported(DataType dtype);
bool supported(ReduceOp op);

// buffer[i] = value (in units) in dtype (exact: the value model keeps it
// representable).
void store(void* buffer, std::size_t i, DataType dtype, std::int64_t value);
// buffer[i] in units, or nothing when it holds no whole number of them
// (NaN, a finer fraction, an untouched sentinel of a float type).
std::optional<std::int64_t> load(const void* buffer, std::size_t i, DataType dtype);
// A value in units as text for a report: "37.01171875".
std::string show_value(std::int64_t value, DataType dtype);
// buffer[i] as text for a report: the number, or its bit pattern where it
// is no number (NaN, infinity).
std::string show(const void* buffer, std::size_t i, DataType dtype);

// Fills `count` elements with a byte pattern no input has (0xA5...): an
// element a collective should have written and did not shows as wrong.
inline constexpr std::byte kSentinelByte{0xA5};
// Whether buffer[i] still holds the sentinel.
bool is_sentinel(const void* buffer, std::size_t i, DataType dtype);
void fill_sentinel(void* buffer, std::size_t count, DataType dtype);

}  // namespace braid::check
