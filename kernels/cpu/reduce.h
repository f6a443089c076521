// Element-wise reductions for the collectives: the only arithmetic comm/
// performs. Loops are written so the compiler vectorises them; f16 and bf16
// are reduced through f32 and rounded back to nearest even.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace braid::kernels::cpu {

// dst[i] = op(a[i], b[i]) for i < count. dst may alias a or b (in-place
// accumulate). ReduceOp::avg reduces as sum; call divide() on the result.
void reduce(void* dst, const void* a, const void* b, std::size_t count,
            DataType dtype, ReduceOp op);

// memcpy with non-temporal stores where the CPU has them: a destination
// that will not be read again soon is written without first being read into
// cache (the read-for-ownership a plain store pays), and without evicting
// what the caller still works on. Any alignment; small copies use memcpy.
void stream_copy(void* dst, const void* src, std::size_t bytes);

// data[i] /= divisor (integer types truncate toward zero), the final step of
// avg. f16 and bf16 only: a nonzero `scale_up` then scales each quotient, as
// rounded, by 2^scale_up (scale_halves): the avg of halves whose inputs were
// scaled down.
void divide(void* data, std::size_t count, DataType dtype, int divisor, int scale_up = 0);

// f16 and bf16 only: dst[i] = src[i] * 2^shift (shift < 0 scales down).
// Exact where the result is normal (the exponent field moves by `shift`);
// other values go through f32, rounded to nearest even. The avg of halves
// scales its inputs down before the sum and the result back up after
// (comm/communicator.cc).
void scale_halves(void* dst, const void* src, std::size_t count, DataType dtype, int shift);

// f16 and bf16 only: dst[i] = a'[i] + b'[i], where x' is x scaled by
// 2^x_shift and rounded back to the type as scale_halves rounds it (a shift
// of 0 takes x as it is): the bits of scale_halves into copies and then a
// sum of the copies, without the copies. The ring reduces the inputs of an
// avg of halves so (Op::avg_inputs_unscaled).
void sum_scaled_halves(void* dst, const void* a, int a_shift, const void* b, int b_shift, std::size_t count,
                       DataType dtype);

// IEEE half and bfloat16 <-> float, round to nearest even, NaN kept NaN.
float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float f);
float bf16_to_f32(std::uint16_t h);
std::uint16_t f32_to_bf16(float f);

}  // namespace braid::kernels::cpu
