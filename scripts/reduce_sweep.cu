// Issue 19's 2-rank target asks a 256 MiB all_reduce for 0.5 x the
// device-to-device copy's bandwidth. Its kernel moves exactly twice the
// copy's bytes (two inputs read, two outputs written), so it meets 0.5 only
// as fast as cudaMemcpy moves bytes; the two cross-process waits of a call
// under MPS (scripts/cuda_gate_probe.cu, eventpong: 6.6 us each) then need
// it about 5 % faster than that. reduce_multi ran at 0.501-0.508 x the copy.
// This tool times other ways to write that kernel, to learn whether one
// moves bytes enough faster than the copy to be worth taking into
// kernels/cuda/reduce.cu:
//   - packs of 16 bytes, 1, 2 or 4 per thread a step, all loads first;
//   - plain loads and stores, streaming ones (ld/st .cs: evict first), or
//     non-coherent loads with a 256-byte L2 prefetch hint;
//   - 256 or 512 threads a block, on reduce_multi's grid (a thread a pack,
//     at most 65535 blocks) or on a resident one (every SM full, looping);
//   - bulk copies (cp.async.bulk, sm_90): tiles of both inputs into shared
//     memory, reduced there, copied out to both outputs, 4 tiles in flight
//     a block.
// Every variant's outputs are checked against reduce_multi's (f32 sum, the
// same order of operands, so bit for bit); a wrong one is named and fails
// the run. One line a variant: its time and busbw over the copy's bandwidth
// (bytes / time, as braid-bench's D2D); at the end the fastest six again,
// also over the copy measured once more, so that drift shows.
// Built by scripts/gpu_kit.sh: nvcc -std=c++20 -I. -Iinclude
// -gencode=arch=compute_90,code=sm_90 -o reduce_sweep scripts/reduce_sweep.cu
// kernels/cuda/reduce.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/cuda/reduce.h"
#include "scripts/cuda_timing.h"

namespace {

enum Hint { kPlain, kStreaming, kPrefetch };
const char* const kHintName[] = {"plain", "ld/st.cs", "ld.nc+L2::256B"};

template <int kHint>
__device__ float4 load(const float4* p) {
  if constexpr (kHint == kStreaming) {
    return __ldcs(p);
  } else if constexpr (kHint == kPrefetch) {
    float4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
  } else {
    return *p;
  }
}

template <int kHint>
__device__ void store(float4* p, float4 v) {
  if constexpr (kHint == kStreaming) __stcs(p, v);
  else *p = v;
}

// kUnroll packs a thread a step, blockDim.x apart (so a warp's accesses stay
// coalesced); `packs` is a multiple of blockDim.x * kUnroll.
template <int kUnroll, int kHint>
__global__ void vector_reduce2(const float4* a, const float4* b, float4* x, float4* y, std::size_t packs) {
  const std::size_t step = std::size_t(gridDim.x) * blockDim.x * kUnroll;
  for (std::size_t base = std::size_t(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; base < packs;
       base += step) {
    float4 u[kUnroll], v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) u[k] = load<kHint>(a + base + k * blockDim.x);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = load<kHint>(b + base + k * blockDim.x);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const float4 r{u[k].x + v[k].x, u[k].y + v[k].y, u[k].z + v[k].z, u[k].w + v[k].w};
      store<kHint>(x + base + k * blockDim.x, r);
      store<kHint>(y + base + k * blockDim.x, r);
    }
  }
}

// --- bulk copies through shared memory (sm_90) ---
constexpr int kTile = 8192;  // bytes of one input a tile
constexpr int kStages = 4;   // tiles in flight a block
constexpr int kBulkThreads = 256;
constexpr std::size_t kBulkShared = std::size_t(kStages) * 2 * kTile;

__device__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Thread 0 only: both inputs' tile into `stage`, completing on `bar`.
__device__ void bulk_load(char* stage, std::uint64_t* bar, const char* a, const char* b) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(2 * kTile)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(stage)),
               "l"(a), "r"(kTile), "r"(shared_address(bar))
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(stage + kTile)),
               "l"(b), "r"(kTile), "r"(shared_address(bar))
               : "memory");
}

// Gives up (traps: the launch fails) after 2 s, should a tile never come.
__device__ void bulk_wait(std::uint64_t* bar, std::uint32_t parity) {
  const std::uint64_t start = globaltimer_ns();
  std::uint32_t done = 0;
  while (!done) {
    if (globaltimer_ns() - start > 2000000000ull) __trap();
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  }
}

// Tiles blockIdx.x, blockIdx.x + gridDim.x, ...; for the i-th of a block,
// stage i % kStages on its (i / kStages)-th use.
__global__ void __launch_bounds__(kBulkThreads) bulk_reduce2(const char* a, const char* b, char* x, char* y,
                                                             std::size_t tiles) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) std::uint64_t full[kStages];
  const std::size_t mine = tiles > blockIdx.x ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  auto tile_at = [&](std::size_t i) { return (blockIdx.x + i * gridDim.x) * std::size_t(kTile); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&full[s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (std::size_t i = 0; i < mine && i < kStages; ++i)
      bulk_load(smem + i * 2 * kTile, &full[i], a + tile_at(i), b + tile_at(i));
  }
  __syncthreads();
  for (std::size_t i = 0; i < mine; ++i) {
    const int s = static_cast<int>(i % kStages);
    char* stage = smem + s * 2 * kTile;
    bulk_wait(&full[s], static_cast<std::uint32_t>((i / kStages) & 1));
    auto* u = reinterpret_cast<float4*>(stage);
    const auto* v = reinterpret_cast<const float4*>(stage + kTile);
    for (int k = threadIdx.x; k < kTile / 16; k += kBulkThreads) {
      const float4 p = u[k], q = v[k];
      u[k] = float4{p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w};
    }
    // The generic proxy's writes, seen by the bulk copies (the async proxy).
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
      const std::size_t at = tile_at(i);
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(x + at),
                   "r"(shared_address(stage)), "r"(kTile)
                   : "memory");
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(y + at),
                   "r"(shared_address(stage)), "r"(kTile)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      // The previous tile's stage is free once its copies out have read it:
      // refill it with the tile kStages after that one.
      if (i >= 1 && i - 1 + kStages < mine) {
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        const std::size_t j = i - 1 + kStages;
        const int r = static_cast<int>(j % kStages);
        bulk_load(smem + r * 2 * kTile, &full[r], a + tile_at(j), b + tile_at(j));
      }
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__global__ void fill(float* p, std::size_t n, float scale) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = scale * static_cast<float>((i * 2654435761u) % 1000003u);
}

__global__ void count_diff(const std::uint32_t* p, const std::uint32_t* q, std::size_t n,
                           unsigned long long* wrong) {
  unsigned long long mine = 0;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    mine += p[i] != q[i];
  if (mine) atomicAdd(wrong, mine);
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("sweep: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main() {
  constexpr std::size_t kBytes = std::size_t(256) << 20, kCount = kBytes / 4, kPacks = kBytes / 16;
  static_assert(kBytes % (512 * 4 * 16) == 0 && kBytes % kTile == 0);
  int device = 0, sms = 0;
  if (!ok(cudaGetDevice(&device), "cudaGetDevice")) return 1;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  void* buf[5];  // a, b, x, y, reference
  for (auto& p : buf)
    if (!ok(cudaMalloc(&p, kBytes), "cudaMalloc")) return 1;
  unsigned long long* wrong = nullptr;
  if (!ok(cudaMallocManaged(&wrong, sizeof *wrong), "cudaMallocManaged")) return 1;
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  fill<<<1024, 256, 0, stream>>>(static_cast<float*>(buf[0]), kCount, 0.5f);
  fill<<<1024, 256, 0, stream>>>(static_cast<float*>(buf[1]), kCount, -0.25f);
  const void* srcs[2] = {buf[0], buf[1]};
  void* ref[1] = {buf[4]};
  braid::kernels::cuda::reduce_multi(ref, 1, srcs, 2, kCount, braid::DataType::f32, braid::ReduceOp::sum, 0, stream);
  if (!ok(cudaStreamSynchronize(stream), "the reference")) return 1;

  auto best_ms = [&](auto&& body) { return ::best_ms(stream, 8, body); };
  auto copy_ms = [&] {
    return best_ms([&] { cudaMemcpyAsync(buf[2], buf[0], kBytes, cudaMemcpyDeviceToDevice, stream); });
  };
  const float copy = copy_ms();
  const double d2d = kBytes / (copy * 1e-3) / 1e9;
  std::printf("sweep: 256 MiB copy %.1f us (%.0f GB/s), %d SMs\n", copy * 1e3, d2d, sms);

  int failures = 0;
  bool broken = false;  // a kernel faulted: the context is lost, so the rest is skipped
  struct Row { float ms; char text[96]; };
  std::vector<Row> rows;
  // Times `launch` with both outputs cleared first, then checks them.
  auto run = [&](const char* family, const char* what, auto&& launch) {
    if (broken) return;
    cudaMemsetAsync(buf[2], 0xff, kBytes, stream);
    cudaMemsetAsync(buf[3], 0xff, kBytes, stream);
    const float ms = best_ms(launch);
    *wrong = 0;
    count_diff<<<1024, 256, 0, stream>>>(static_cast<const std::uint32_t*>(buf[2]),
                                         static_cast<const std::uint32_t*>(buf[4]), kCount, wrong);
    count_diff<<<1024, 256, 0, stream>>>(static_cast<const std::uint32_t*>(buf[3]),
                                         static_cast<const std::uint32_t*>(buf[4]), kCount, wrong);
    const bool launched = ok(cudaStreamSynchronize(stream), what);
    broken = !launched;
    Row row{ms, {}};
    std::snprintf(row.text, sizeof row.text, "%s %s", family, what);
    if (!launched || *wrong != 0) {
      if (launched) std::printf("sweep: WRONG %s: %llu words differ from reduce_multi's\n", row.text, *wrong);
      else std::printf("sweep: WRONG %s: the kernel failed (above)\n", row.text);
      ++failures;
      return;
    }
    std::printf("sweep: %-44s %7.1f us  %.3f x copy\n", row.text, ms * 1e3, kBytes / (ms * 1e-3) / 1e9 / d2d);
    rows.push_back(row);
  };

  const auto* a = static_cast<const float4*>(buf[0]);
  const auto* b = static_cast<const float4*>(buf[1]);
  auto* x = static_cast<float4*>(buf[2]);
  auto* y = static_cast<float4*>(buf[3]);
  run("reduce_multi", "(kernels/cuda/reduce.cu)", [&] {
    void* dsts[2] = {buf[2], buf[3]};
    braid::kernels::cuda::reduce_multi(dsts, 2, srcs, 2, kCount, braid::DataType::f32, braid::ReduceOp::sum, 0,
                                       stream);
  });

  static char names[64][64];
  int named = 0;
  auto sweep = [&]<int kUnroll, int kHint>() {
    for (int threads : {256, 512}) {
      int per_sm = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, vector_reduce2<kUnroll, kHint>, threads, 0);
      const unsigned all = static_cast<unsigned>(std::min<std::size_t>(kPacks / (threads * kUnroll), 65535));
      const unsigned resident = static_cast<unsigned>(sms * std::max(per_sm, 1));
      for (unsigned grid : {all, resident}) {
        char* name = names[named++ % 64];
        std::snprintf(name, 64, "x%d %s, %d threads, %u blocks%s", kUnroll, kHintName[kHint], threads, grid,
                      grid == resident ? " (resident)" : "");
        run("vector", name, [&] { vector_reduce2<kUnroll, kHint><<<grid, threads, 0, stream>>>(a, b, x, y, kPacks); });
      }
    }
  };
  sweep.template operator()<1, kPlain>();
  sweep.template operator()<2, kPlain>();
  sweep.template operator()<4, kPlain>();
  sweep.template operator()<1, kStreaming>();
  sweep.template operator()<2, kStreaming>();
  sweep.template operator()<1, kPrefetch>();
  sweep.template operator()<2, kPrefetch>();
  sweep.template operator()<4, kPrefetch>();

  if (ok(cudaFuncSetAttribute(bulk_reduce2, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kBulkShared)),
         "bulk: shared memory")) {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bulk_reduce2, kBulkThreads, kBulkShared);
    for (int per : {1, 2, std::max(per_sm, 1)}) {
      const unsigned grid = static_cast<unsigned>(sms * per);
      char* name = names[named++ % 64];
      std::snprintf(name, 64, "%d KiB tiles x %d, %u blocks (%d a SM, at most %d)", kTile / 1024, kStages, grid,
                    per, per_sm);
      run("bulk", name, [&] {
        bulk_reduce2<<<grid, kBulkThreads, kBulkShared, stream>>>(
            static_cast<const char*>(buf[0]), static_cast<const char*>(buf[1]), static_cast<char*>(buf[2]),
            static_cast<char*>(buf[3]), kBytes / kTile);
      });
    }
  } else {
    ++failures;
  }

  const float copy_after = broken ? copy : copy_ms();
  std::printf("sweep: 256 MiB copy again %.1f us (%.0f GB/s)\n", copy_after * 1e3,
              kBytes / (copy_after * 1e-3) / 1e9);
  // The fastest six again, slowest first, so that the last lines of the
  // output (all gpu_check.sh's summary keeps) hold them.
  std::sort(rows.begin(), rows.end(), [](const Row& l, const Row& r) { return l.ms < r.ms; });
  for (std::size_t k = std::min<std::size_t>(rows.size(), 6); k-- > 0;)
    std::printf("sweep: #%zu %s: %.3f x copy, %.3f x the copy measured again\n", k + 1, rows[k].text,
                copy / rows[k].ms, copy_after / rows[k].ms);
  if (failures) std::printf("sweep: %d variant(s) WRONG or failed\n", failures);
  return failures ? 1 : 0;
}
