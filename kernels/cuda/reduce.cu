// Reduction kernels for the collectives, one template instantiated per
// (element type, operator). Each thread handles one 16-byte pack (4 floats,
// 8 halves, 16 bytes...) per step of a grid-stride loop; the last
// count % pack elements, or all of them when a pointer is not 16-byte
// aligned, go through the scalar loop at the end of the same kernel.
//
// The element operators are the CPU's, written for the device:
//   - Min/Max are IEEE 754-2019's minimum/maximum, as on the CPU: NaN if
//     either operand is NaN (one quiet NaN, the same bits as the CPU's in
//     every float type), -0 < +0; the order of the operands never matters.
//     A NaN from arithmetic (a sum with a NaN) is a quiet NaN on both, whose
//     sign and payload may differ: the GPU's f32 arithmetic gives its one
//     canonical NaN, x86's keeps an operand's;
//   - i8, i32 and i64 sum/prod go through uint32/uint32/uint64 so that
//     overflow wraps with defined behaviour; u8 promotes to int and truncates;
//   - f16/bf16 convert to f32 (exact), apply the operator in f32 and convert
//     back with the hardware's round-to-nearest-even conversion.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/reduce.h"

namespace braid::kernels::cuda {
namespace {

using detail::check;
using detail::check_launch;
using detail::grid_for;
using detail::kThreads;

template <typename T>
struct Sum { __device__ static T apply(T a, T b) { return a + b; } };
template <typename T>
struct Prod { __device__ static T apply(T a, T b) { return a * b; } };
template <typename T>
struct Min {
  __device__ static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a || b != b) return static_cast<T>(NAN);
      if (a == b) return signbit(a) ? a : b;
    }
    return b < a ? b : a;
  }
};
template <typename T>
struct Max {
  __device__ static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a || b != b) return static_cast<T>(NAN);
      if (a == b) return signbit(a) ? b : a;
    }
    return a < b ? b : a;
  }
};
// The bitwise operators, for the integer types only (dispatch_bitwise).
template <typename T>
struct BitAnd { __device__ static T apply(T a, T b) { return static_cast<T>(a & b); } };
template <typename T>
struct BitOr { __device__ static T apply(T a, T b) { return static_cast<T>(a | b); } };
template <typename T>
struct BitXor { __device__ static T apply(T a, T b) { return static_cast<T>(a ^ b); } };

// How one element of storage type T is reduced: plain, wrapping through an
// unsigned type U, or through f32 for the 16-bit floats.
template <typename T, template <typename> class Op>
struct Plain {
  __device__ static T apply(T a, T b) { return Op<T>::apply(a, b); }
};
template <typename T, typename U, template <typename> class Op>
struct Wrapping {
  __device__ static T apply(T a, T b) {
    return static_cast<T>(Op<U>::apply(static_cast<U>(a), static_cast<U>(b)));
  }
};
// f32 to f16/bf16 bits as the CPU's f32_to_f16/f32_to_bf16 give them: the
// hardware conversions make every NaN 0x7fff, the CPU's make it the one
// quiet NaN with the sign kept (0x7e00 / 0x7fc0), so an f16 min with a NaN
// gave other bits on the direct CUDA path than on a staged call reduced on
// the CPU.
__device__ inline std::uint16_t f16_bits(float r) {
  if (r != r) return signbit(r) ? 0xfe00 : 0x7e00;
  return __half_as_ushort(__float2half_rn(r));
}
__device__ inline std::uint16_t bf16_bits(float r) {
  if (r != r) return signbit(r) ? 0xffc0 : 0x7fc0;
  return __bfloat16_as_ushort(__float2bfloat16_rn(r));
}

template <template <typename> class Op>
struct Half {
  __device__ static std::uint16_t apply(std::uint16_t a, std::uint16_t b) {
    return f16_bits(Op<float>::apply(__half2float(__ushort_as_half(a)), __half2float(__ushort_as_half(b))));
  }
};
template <template <typename> class Op>
struct BHalf {
  __device__ static std::uint16_t apply(std::uint16_t a, std::uint16_t b) {
    return bf16_bits(Op<float>::apply(__bfloat162float(__ushort_as_bfloat16(a)),
                                      __bfloat162float(__ushort_as_bfloat16(b))));
  }
};

constexpr std::size_t kPackBytes = 16;

template <typename T>
struct alignas(kPackBytes) Pack {
  static constexpr int kCount = kPackBytes / sizeof(T);
  T v[kCount];
};

// dst = op(a, b): packs [0, packs) vectorised, elements [packs * kCount,
// count) one by one.
template <typename T, typename Elem>
__global__ void reduce_kernel(T* dst, const T* a, const T* b, std::size_t packs, std::size_t count) {
  using P = Pack<T>;
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t first = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t p = first; p < packs; p += stride) {
    P x = reinterpret_cast<const P*>(a)[p];
    P y = reinterpret_cast<const P*>(b)[p];
#pragma unroll
    for (int l = 0; l < P::kCount; ++l) x.v[l] = Elem::apply(x.v[l], y.v[l]);
    reinterpret_cast<P*>(dst)[p] = x;
  }
  for (std::size_t i = packs * P::kCount + first; i < count; i += stride)
    dst[i] = Elem::apply(a[i], b[i]);
}

// The divisor is converted to T first, as the CPU does (static_cast<T>(divisor)).
template <typename T>
struct DivideBy {
  // Integers in 64 bits: the quotient kernels/cpu/reduce.cc gives (it
  // divides up to 32 bits through double, which is exact).
  __device__ static T apply(T x, int divisor) {
    if constexpr (std::is_integral_v<T>) {
      using Wide = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
      return static_cast<T>(static_cast<Wide>(x) / static_cast<Wide>(divisor));
    } else {
      return static_cast<T>(x / static_cast<T>(divisor));
    }
  }
};
struct DivideHalf {
  __device__ static std::uint16_t apply(std::uint16_t x, int divisor) {
    return f16_bits(__half2float(__ushort_as_half(x)) / static_cast<float>(divisor));
  }
};
struct DivideBHalf {
  __device__ static std::uint16_t apply(std::uint16_t x, int divisor) {
    return bf16_bits(__bfloat162float(__ushort_as_bfloat16(x)) / static_cast<float>(divisor));
  }
};

// The fused all-reduce step of reduce_multi: each thread reduces one pack
// (or element) over every source, divides it for avg, and writes it to
// every destination; a destination may alias a source, since each element
// is read from all sources before it is written.
template <typename T>
struct MultiPointers {
  const T* src[kMaxMulti];
  T* dst[kMaxMulti];
  int n_src, n_dst;
};

template <typename T, typename Elem, typename Div>
__global__ void reduce_multi_kernel(MultiPointers<T> p, std::size_t packs, std::size_t count, int divisor) {
  using P = Pack<T>;
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t first = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t q = first; q < packs; q += stride) {
    P acc = reinterpret_cast<const P*>(p.src[0])[q];
    for (int s = 1; s < p.n_src; ++s) {
      P y = reinterpret_cast<const P*>(p.src[s])[q];
#pragma unroll
      for (int l = 0; l < P::kCount; ++l) acc.v[l] = Elem::apply(acc.v[l], y.v[l]);
    }
    if (divisor != 0) {
#pragma unroll
      for (int l = 0; l < P::kCount; ++l) acc.v[l] = Div::apply(acc.v[l], divisor);
    }
    for (int d = 0; d < p.n_dst; ++d) reinterpret_cast<P*>(p.dst[d])[q] = acc;
  }
  for (std::size_t i = packs * P::kCount + first; i < count; i += stride) {
    T acc = p.src[0][i];
    for (int s = 1; s < p.n_src; ++s) acc = Elem::apply(acc, p.src[s][i]);
    if (divisor != 0) acc = Div::apply(acc, divisor);
    for (int d = 0; d < p.n_dst; ++d) p.dst[d][i] = acc;
  }
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kPackBytes == 0; }

template <typename T, typename Elem>
void launch(void* dst, const void* a, const void* b, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  bool vector = aligned(dst) && aligned(a) && aligned(b);
  std::size_t packs = vector ? count / Pack<T>::kCount : 0;
  std::size_t work = packs + (count - packs * Pack<T>::kCount);
  reduce_kernel<T, Elem><<<grid_for(work), kThreads, 0, stream>>>(
      static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), packs, count);
  check_launch("reduce_kernel");
}

template <typename T, typename Elem, typename Div>
void launch_multi(void* const* dsts, int n_dst, const void* const* srcs, int n_src, std::size_t count, int divisor,
                  cudaStream_t stream) {
  if (count == 0) return;
  MultiPointers<T> p{};
  bool vector = true;
  for (int s = 0; s < n_src; ++s) {
    p.src[s] = static_cast<const T*>(srcs[s]);
    vector = vector && aligned(srcs[s]);
  }
  for (int d = 0; d < n_dst; ++d) {
    p.dst[d] = static_cast<T*>(dsts[d]);
    vector = vector && aligned(dsts[d]);
  }
  p.n_src = n_src;
  p.n_dst = n_dst;
  std::size_t packs = vector ? count / Pack<T>::kCount : 0;
  std::size_t work = packs + (count - packs * Pack<T>::kCount);
  reduce_multi_kernel<T, Elem, Div><<<grid_for(work), kThreads, 0, stream>>>(p, packs, count, divisor);
  check_launch("reduce_multi_kernel");
}

// The (element, divide) pair of each dtype, as dispatch() and divide() pick them.
template <template <typename> class Op, bool kOrdered>
void dispatch_multi(void* const* d, int nd, const void* const* s, int ns, std::size_t n, DataType dtype,
                    int divisor, cudaStream_t st) {
  using u16 = std::uint16_t;
  using i8 = std::int8_t;
  using i32 = std::int32_t;
  using i64 = std::int64_t;
  switch (dtype) {
    case DataType::f32: return launch_multi<float, Plain<float, Op>, DivideBy<float>>(d, nd, s, ns, n, divisor, st);
    case DataType::f64:
      return launch_multi<double, Plain<double, Op>, DivideBy<double>>(d, nd, s, ns, n, divisor, st);
    case DataType::f16: return launch_multi<u16, Half<Op>, DivideHalf>(d, nd, s, ns, n, divisor, st);
    case DataType::bf16: return launch_multi<u16, BHalf<Op>, DivideBHalf>(d, nd, s, ns, n, divisor, st);
    case DataType::u8:
      return launch_multi<std::uint8_t, Plain<std::uint8_t, Op>, DivideBy<std::uint8_t>>(d, nd, s, ns, n, divisor, st);
    case DataType::i8:
      if constexpr (kOrdered) return launch_multi<i8, Plain<i8, Op>, DivideBy<i8>>(d, nd, s, ns, n, divisor, st);
      else return launch_multi<i8, Wrapping<i8, std::uint32_t, Op>, DivideBy<i8>>(d, nd, s, ns, n, divisor, st);
    case DataType::i32:
      if constexpr (kOrdered) return launch_multi<i32, Plain<i32, Op>, DivideBy<i32>>(d, nd, s, ns, n, divisor, st);
      else return launch_multi<i32, Wrapping<i32, std::uint32_t, Op>, DivideBy<i32>>(d, nd, s, ns, n, divisor, st);
    case DataType::i64:
      if constexpr (kOrdered) return launch_multi<i64, Plain<i64, Op>, DivideBy<i64>>(d, nd, s, ns, n, divisor, st);
      else return launch_multi<i64, Wrapping<i64, std::uint64_t, Op>, DivideBy<i64>>(d, nd, s, ns, n, divisor, st);
  }
}

template <template <typename> class Op>
void dispatch(void* d, const void* a, const void* b, std::size_t n, DataType dtype, cudaStream_t s) {
  using u16 = std::uint16_t;
  switch (dtype) {
    case DataType::f32: return launch<float, Plain<float, Op>>(d, a, b, n, s);
    case DataType::f64: return launch<double, Plain<double, Op>>(d, a, b, n, s);
    case DataType::f16: return launch<u16, Half<Op>>(d, a, b, n, s);
    case DataType::bf16: return launch<u16, BHalf<Op>>(d, a, b, n, s);
    case DataType::i8: return launch<std::int8_t, Wrapping<std::int8_t, std::uint32_t, Op>>(d, a, b, n, s);
    case DataType::u8: return launch<std::uint8_t, Plain<std::uint8_t, Op>>(d, a, b, n, s);
    case DataType::i32: return launch<std::int32_t, Wrapping<std::int32_t, std::uint32_t, Op>>(d, a, b, n, s);
    case DataType::i64: return launch<std::int64_t, Wrapping<std::int64_t, std::uint64_t, Op>>(d, a, b, n, s);
  }
}

// min/max on signed integers must compare as signed, so they skip the
// unsigned detour.
template <template <typename> class Op>
void dispatch_ordered(void* d, const void* a, const void* b, std::size_t n, DataType dtype,
                      cudaStream_t s) {
  switch (dtype) {
    case DataType::i8: return launch<std::int8_t, Plain<std::int8_t, Op>>(d, a, b, n, s);
    case DataType::i32: return launch<std::int32_t, Plain<std::int32_t, Op>>(d, a, b, n, s);
    case DataType::i64: return launch<std::int64_t, Plain<std::int64_t, Op>>(d, a, b, n, s);
    default: return dispatch<Op>(d, a, b, n, dtype, s);
  }
}

// Bitwise operators on the bits as they lie, of the integer types only (the
// communicator refuses them on floating-point types before any kernel runs).
[[noreturn]] void refuse_bitwise(DataType dtype) {
  throw std::invalid_argument("braid kernels: " + std::string(name(dtype)) +
                              " has no bitwise reduction (integer types only)");
}

template <template <typename> class Op>
void dispatch_bitwise(void* d, const void* a, const void* b, std::size_t n, DataType dtype, cudaStream_t s) {
  using u8 = std::uint8_t;
  using u32 = std::uint32_t;
  using u64 = std::uint64_t;
  switch (dtype) {
    case DataType::i8:
    case DataType::u8: return launch<u8, Plain<u8, Op>>(d, a, b, n, s);
    case DataType::i32: return launch<u32, Plain<u32, Op>>(d, a, b, n, s);
    case DataType::i64: return launch<u64, Plain<u64, Op>>(d, a, b, n, s);
    default: refuse_bitwise(dtype);
  }
}

// The divisor is 0 here: avg is not bitwise.
template <template <typename> class Op>
void dispatch_multi_bitwise(void* const* d, int nd, const void* const* s, int ns, std::size_t n, DataType dtype,
                            cudaStream_t st) {
  using u8 = std::uint8_t;
  using u32 = std::uint32_t;
  using u64 = std::uint64_t;
  switch (dtype) {
    case DataType::i8:
    case DataType::u8: return launch_multi<u8, Plain<u8, Op>, DivideBy<u8>>(d, nd, s, ns, n, 0, st);
    case DataType::i32: return launch_multi<u32, Plain<u32, Op>, DivideBy<u32>>(d, nd, s, ns, n, 0, st);
    case DataType::i64: return launch_multi<u64, Plain<u64, Op>, DivideBy<u64>>(d, nd, s, ns, n, 0, st);
    default: refuse_bitwise(dtype);
  }
}

template <typename T, typename Div>
__global__ void divide_kernel(T* data, std::size_t count, int divisor) {
  std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    data[i] = Div::apply(data[i], divisor);
}

template <typename T, typename Div>
void launch_divide(void* data, std::size_t count, int divisor, cudaStream_t stream) {
  if (count == 0) return;
  divide_kernel<T, Div><<<grid_for(count), kThreads, 0, stream>>>(static_cast<T*>(data), count, divisor);
  check_launch("divide_kernel");
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dtype,
            ReduceOp op, cudaStream_t stream) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return dispatch<Sum>(dst, a, b, count, dtype, stream);
    case ReduceOp::prod: return dispatch<Prod>(dst, a, b, count, dtype, stream);
    case ReduceOp::min: return dispatch_ordered<Min>(dst, a, b, count, dtype, stream);
    case ReduceOp::max: return dispatch_ordered<Max>(dst, a, b, count, dtype, stream);
    case ReduceOp::band: return dispatch_bitwise<BitAnd>(dst, a, b, count, dtype, stream);
    case ReduceOp::bor: return dispatch_bitwise<BitOr>(dst, a, b, count, dtype, stream);
    case ReduceOp::bxor: return dispatch_bitwise<BitXor>(dst, a, b, count, dtype, stream);
  }
}

void reduce_multi(void* const* dsts, int n_dst, const void* const* srcs, int n_src, std::size_t count,
                  DataType dtype, ReduceOp op, int divisor, cudaStream_t stream) {
  if (n_src < 1 || n_src > kMaxMulti || n_dst < 1 || n_dst > kMaxMulti)
    throw std::runtime_error("braid kernels: reduce_multi takes 1.." + std::to_string(kMaxMulti) +
                             " sources and destinations, not " + std::to_string(n_src) + " and " +
                             std::to_string(n_dst));
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return dispatch_multi<Sum, false>(dsts, n_dst, srcs, n_src, count, dtype, divisor, stream);
    case ReduceOp::prod: return dispatch_multi<Prod, false>(dsts, n_dst, srcs, n_src, count, dtype, divisor, stream);
    case ReduceOp::min: return dispatch_multi<Min, true>(dsts, n_dst, srcs, n_src, count, dtype, divisor, stream);
    case ReduceOp::max: return dispatch_multi<Max, true>(dsts, n_dst, srcs, n_src, count, dtype, divisor, stream);
    case ReduceOp::band: return dispatch_multi_bitwise<BitAnd>(dsts, n_dst, srcs, n_src, count, dtype, stream);
    case ReduceOp::bor: return dispatch_multi_bitwise<BitOr>(dsts, n_dst, srcs, n_src, count, dtype, stream);
    case ReduceOp::bxor: return dispatch_multi_bitwise<BitXor>(dsts, n_dst, srcs, n_src, count, dtype, stream);
  }
}

void divide(void* data, std::size_t count, DataType dtype, int divisor, cudaStream_t stream) {
  using u16 = std::uint16_t;
  switch (dtype) {
    case DataType::f32: return launch_divide<float, DivideBy<float>>(data, count, divisor, stream);
    case DataType::f64: return launch_divide<double, DivideBy<double>>(data, count, divisor, stream);
    case DataType::f16: return launch_divide<u16, DivideHalf>(data, count, divisor, stream);
    case DataType::bf16: return launch_divide<u16, DivideBHalf>(data, count, divisor, stream);
    case DataType::i8: return launch_divide<std::int8_t, DivideBy<std::int8_t>>(data, count, divisor, stream);
    case DataType::u8: return launch_divide<std::uint8_t, DivideBy<std::uint8_t>>(data, count, divisor, stream);
    case DataType::i32: return launch_divide<std::int32_t, DivideBy<std::int32_t>>(data, count, divisor, stream);
    case DataType::i64: return launch_divide<std::int64_t, DivideBy<std::int64_t>>(data, count, divisor, stream);
  }
}

void preload(cudaStream_t stream) {
  void* block = nullptr;  // three 8-byte elements, zero: every kernel below reads and writes one
  check(cudaMalloc(&block, 64), "cudaMalloc (preloading the reduction kernels)");
  auto* bytes = static_cast<char*>(block);
  void* dst = bytes;
  const void* src[2] = {bytes + 16, bytes + 32};
  try {
    check(cudaMemsetAsync(block, 0, 64, stream), "cudaMemsetAsync (preloading the reduction kernels)");
    for (int t = 0; t < kNumDataTypes; ++t) {
      const auto dtype = DataType(t);
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto op = ReduceOp(o);
        if (!can_reduce(dtype, op)) continue;
        reduce(dst, src[0], src[1], 1, dtype, op, stream);
        reduce_multi(&dst, 1, src, 2, 1, dtype, op, 0, stream);
      }
      divide(dst, 1, dtype, 1, stream);
    }
    check(cudaStreamSynchronize(stream), "preloading the reduction kernels");
  } catch (...) {
    cudaFree(block);
    throw;
  }
  check(cudaFree(block), "cudaFree (preloading the reduction kernels)");
}

bool cuda_device_available(std::string* why) {
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so the next CUDA call does not report it again
    if (why != nullptr)
      *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status) + ": " +
             cudaGetErrorString(status);
    return false;
  }
  if (devices == 0) {
    if (why != nullptr) *why = "cudaGetDeviceCount found 0 devices (check CUDA_VISIBLE_DEVICES)";
    return false;
  }
  return true;
}

}  // namespace braid::kernels::cuda
