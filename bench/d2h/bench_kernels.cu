// SPDX-License-Identifier: Apache-2.0
// CUDA versions of the benchmark-only kernels (see bench_kernels.hpp).
#include "bench_kernels.hpp"
#include "detail/vector_copy.cuh"  // copy_vectors, copy_tail: the same copy ferry's kernels use
#include <ferry/testing/device_clock.cuh>

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/backend/system_atomic.hpp>
#include <ferry/testing/pattern.hpp>

namespace ferry::bench::gpu {

// No __constant__ variable in this module: one (a former constant-cache diagnostic) made every kernel of
// the module lose the benefit of programmatic dependent launch (copy_only == copy_only_plain, +0.3 us per
// hook; docs/perf/journal.md).
/// ferry's copy_vectors<V> with V chosen at run time (uniform branch; V in {1, 2, 4, 8}, anything else is 1).
template <class DstFn>
__device__ __forceinline__ void copy_vec(DstFn&& dst_of, const std::byte* src, std::uint64_t n, std::uint32_t v,
                                         std::uint32_t blk, std::uint32_t nblk, std::uint32_t t, std::uint32_t nt)
{
  switch (v) {
    case 8: ferry::kernels::copy_vectors<8>(dst_of, src, n, blk, nblk, t, nt); break;
    case 4: ferry::kernels::copy_vectors<4>(dst_of, src, n, blk, nblk, t, nt); break;
    case 2: ferry::kernels::copy_vectors<2>(dst_of, src, n, blk, nblk, t, nt); break;
    default: ferry::kernels::copy_vectors<1>(dst_of, src, n, blk, nblk, t, nt); break;
  }
}

/// The same copy body as ferry's copy kernels (copy_vectors: V vectors per thread, loads before stores), with a
/// fixed destination: the copy-only baseline is as fast as ferry's copy minus the cursor read.
__device__ inline void copy_grid(const copy_args& a)
{
  if (((reinterpret_cast<std::uintptr_t>(a.dst) | reinterpret_cast<std::uintptr_t>(a.src)) & 15U) == 0) {
    copy_vec(
      [&] {
        if (a.cursor_mode == 0) { return a.dst; }
        if (a.cursor_mode == 6) {  // 8-byte cursor slots (no size-slot half)
          const std::uint64_t c = a.cursor[a.parity];
          const std::uint64_t phys = c + a.bytes > a.ring_bytes ? 0 : c;
          if (blockIdx.x == 0 && threadIdx.x == 0) { a.cursor[a.parity ^ 1U] = phys + a.bytes; }
          return a.ring + phys;
        }
        if (a.cursor_mode >= 3 && a.cursor_mode <= 5) {  // the two-slot cursor; mode 5: slots on separate 128-byte lines
          auto* slots = reinterpret_cast<ulonglong2*>(a.cursor);
          const std::uint32_t apart = a.cursor_mode == 5 ? 8U : 1U;
          const ulonglong2 c = slots[a.parity * apart];
          const std::uint64_t phys = c.x + a.bytes > a.ring_bytes ? 0 : c.x;
          if (blockIdx.x == 0 && threadIdx.x == 0) { slots[(a.parity ^ 1U) * apart] = ulonglong2{phys + a.bytes, c.y}; }
          return a.cursor_mode == 3 ? a.dst : a.ring + phys;
        }
        if (a.cursor_mode == 9) {  // one load per block (thread 0), broadcast through shared memory
          __shared__ std::uint64_t word;
          if (threadIdx.x == 0) { word = *a.cursor; }
          __syncthreads();
          return a.dst + word;
        }
        if (a.cursor_mode == 10) { return a.dst + __ldg(a.cursor); }  // the read-only (non-coherent) path
        // modes 1, 2, 7 (word in the source allocation), 8 (word in the ring allocation)
        const std::uint64_t c = *a.cursor;  // always 0
        if (a.cursor_mode == 2 && blockIdx.x == 0 && threadIdx.x == 0) { *a.cursor = c; }
        return a.dst + c;
      },
      a.src, a.bytes, a.vecs_per_thread, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
    return;
  }
  const std::uint64_t t = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  ferry::kernels::copy_tail(a.dst, a.src, t, a.bytes, static_cast<std::uint64_t>(gridDim.x) * blockDim.x);
}

/// Block join, then (multi-block) a grid join through __threadfence + atomicAdd: true in the last block's thread 0.
__device__ inline bool join_all(const copy_args& a)
{
  __syncthreads();
  if (threadIdx.x != 0) { return false; }
  if (gridDim.x == 1) { return true; }
  __threadfence();
  const unsigned t = atomicAdd(a.join, 1U);
  if (t != gridDim.x - 1) { return false; }
  *a.join = 0;
  __threadfence();
  return true;
}

/// Launched exactly as ferry launches its copy kernel (programmatic where ferry's is), with the same waits.
__global__ void bench_copy(copy_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  ferry::backend::grid_dependency_wait();
  copy_grid(a);
}

/// The copy-only baseline proper (cursor_mode 0, 16-byte aligned source and destination): V fixed at compile
/// time, as in ferry's copy kernels (copy_commit_vec<V>), so the baseline is the same copy minus the cursor.
template <int V>
__global__ void bench_copy_plain_v(copy_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  ferry::backend::grid_dependency_wait();
  ferry::kernels::copy_vectors<V>([&] { return a.dst; }, a.src, a.bytes, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

__global__ void baseline_volatile_flag(copy_args a)
{
  copy_grid(a);
  if (join_all(a)) {
    __threadfence();  // device scope only: NOT a release toward the CPU
    *reinterpret_cast<volatile std::uint64_t*>(a.flag) = *a.fwd * a.hooks_per_fwd + a.hook + 1;
  }
}

__global__ void baseline_sysflag(copy_args a)
{
  copy_grid(a);
  if (join_all(a)) { ferry::backend::store_release_system(a.flag, *a.fwd * a.hooks_per_fwd + a.hook + 1); }
}

__global__ void layer(layer_args a)
{
  const std::uint64_t start = ferry::testing::globaltimer_ns();
  const std::uint64_t f = *a.fwd;
  const std::uint64_t t = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t nt = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t k = 0; k < a.n_hooks; ++k) {
    const std::uint64_t h = a.first_hook + k;
    const std::uint64_t seq = f * a.hooks_per_fwd + h;
    const bool mix = a.hook_off != nullptr;
    const std::uint64_t words = mix ? (a.hook_bytes[h] + 7) / 8 : a.bytes / 8;
    auto* dst = reinterpret_cast<std::uint64_t*>(a.act + (mix ? a.hook_off[h] : h * a.bytes));
    for (std::uint64_t i = t; i < words; i += nt) { dst[i] = ferry::testing::pattern_word(seq, i); }
  }
  if (t == 0) { ferry::testing::spin_until(start, a.spin_ns); }
}

__global__ void next_forward(std::uint64_t* fwd)
{
  if (threadIdx.x == 0 && blockIdx.x == 0) { *fwd += 1; }
}

}  // namespace ferry::bench::gpu

namespace ferry::bench {

cuda_kernel<copy_args> bench_copy_kernel(ferry::backend::cuda_tag)
{
  return {reinterpret_cast<const void*>(&gpu::bench_copy), "bench_copy"};
}
cuda_kernel<copy_args> bench_copy_plain_kernel(ferry::backend::cuda_tag, ferry::d2h::detail::copy_form f)
{
  using ferry::d2h::detail::copy_form;
  switch (f) {
    case copy_form::v1: return {reinterpret_cast<const void*>(&gpu::bench_copy_plain_v<1>), "bench_copy_plain_v1"};
    case copy_form::v2: return {reinterpret_cast<const void*>(&gpu::bench_copy_plain_v<2>), "bench_copy_plain_v2"};
    case copy_form::v4: return {reinterpret_cast<const void*>(&gpu::bench_copy_plain_v<4>), "bench_copy_plain_v4"};
    case copy_form::v8: return {reinterpret_cast<const void*>(&gpu::bench_copy_plain_v<8>), "bench_copy_plain_v8"};
    case copy_form::bytes:
    case copy_form::v1_lean:  // not passed here (copy_form_of)
    case copy_form::v2_lean:
    case copy_form::v4_lean:
    case copy_form::v8_lean: break;
  }
  return bench_copy_kernel(ferry::backend::cuda_tag{});  // unaligned: the general kernel's byte path
}
cuda_kernel<copy_args> baseline_volatile_kernel(ferry::backend::cuda_tag)
{
  return {reinterpret_cast<const void*>(&gpu::baseline_volatile_flag), "baseline_volatile_flag"};
}
cuda_kernel<copy_args> baseline_sysflag_kernel(ferry::backend::cuda_tag)
{
  return {reinterpret_cast<const void*>(&gpu::baseline_sysflag), "baseline_sysflag"};
}
cuda_kernel<layer_args> layer_kernel(ferry::backend::cuda_tag)
{
  return {reinterpret_cast<const void*>(&gpu::layer), "bench_layer"};
}
cuda_kernel<std::uint64_t*> next_forward_kernel(ferry::backend::cuda_tag)
{
  return {reinterpret_cast<const void*>(&gpu::next_forward), "bench_next_forward"};
}

}  // namespace ferry::bench
