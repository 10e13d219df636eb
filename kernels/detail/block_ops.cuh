// SPDX-License-Identifier: Apache-2.0
// A block of threads as the reduce bodies (reduce_block.cuh) see it, on each backend: its thread `t` of `nt`, a
// barrier, shared-memory atomics (a warp's claim of slots), a warp's max, the radix-select histogram pass, and a
// bitonic sort in shared memory (block_sort).
//   host_block   the host backend's block: one thread; the barrier is a no-op, the atomics plain;
//   gpu_block    a CUDA / HIP block of nt threads, nt a multiple of 32 (reduce_rows launches 256).
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD

#include <cstdint>

namespace ferry::kernels::d2h {

struct host_block {
  static constexpr std::uint32_t lanes = 1;  ///< threads of a warp (mean_record's columns per row pass)
  std::uint32_t t{0};
  std::uint32_t nt{1};
  FERRY_HD void sync() const noexcept {}
  FERRY_HD std::uint32_t add(std::uint32_t* p, std::uint32_t v) const noexcept
  {
    const std::uint32_t old = *p;
    *p = old + v;
    return old;
  }
  FERRY_HD void max(std::uint32_t* p, std::uint32_t v) const noexcept { *p = v > *p ? v : *p; }
  FERRY_HD std::uint32_t claim(std::uint32_t* count, bool want) const noexcept
  {
    return want ? add(count, 1) : 0xffffffffU;
  }
  /// The max of `v` over the lanes of the caller's warp (one lane: `v`).
  FERRY_HD static std::uint32_t warp_max(std::uint32_t v) noexcept { return v; }
  /// radix_select's histogram pass: hist[digit(c)] += 1 for every c in [0, width) that digit() admits (< 256).
  template <class Digit>
  FERRY_HD void histogram(std::uint32_t* hist, std::uint64_t width, Digit digit) const
  {
    for (std::uint64_t c = 0; c < width; ++c) {
      const std::uint32_t d = digit(c);
      if (d < 256) { ++hist[d]; }
    }
  }
};

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU block (only its device pass calls these; the host pass of a FERRY_HD template sees the declarations).
struct gpu_block {
  static constexpr std::uint32_t lanes = 32;  ///< threads of a warp; nt is a multiple of it
  std::uint32_t t;
  std::uint32_t nt;
  FERRY_HD void sync() const
  {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    __syncthreads();
#endif
  }
  FERRY_HD std::uint32_t add(std::uint32_t* p, std::uint32_t v) const
  {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return atomicAdd(p, v);
#else
    return *p += v, *p - v;
#endif
  }
  FERRY_HD void max(std::uint32_t* p, std::uint32_t v) const
  {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    atomicMax(p, v);
#else
    *p = v > *p ? v : *p;
#endif
  }
  /// The max of `v` over the 32 lanes of the caller's warp (every lane calls it; on a 64-wide HIP wavefront, over
  /// its half).
  FERRY_HD static std::uint32_t warp_max(std::uint32_t v)
  {
#if defined(__CUDA_ARCH__)
    for (int d = 16; d > 0; d >>= 1) {
      const std::uint32_t o = __shfl_xor_sync(0xffffffffU, v, d);
      v = o > v ? o : v;
    }
#elif defined(__HIP_DEVICE_COMPILE__)
    for (int d = 16; d > 0; d >>= 1) {
      const std::uint32_t o = static_cast<std::uint32_t>(__shfl_xor(static_cast<int>(v), d, 32));
      v = o > v ? o : v;
    }
#endif
    return v;
  }
  /// For a lane whose `want` holds: a slot of `*count` of its own (count += 1 per wanting lane, one atomic add per
  /// warp on CUDA, its converged lanes ranked by lane); other lanes: 0xffffffff.
  FERRY_HD std::uint32_t claim(std::uint32_t* count, bool want) const
  {
#if defined(__CUDA_ARCH__)
    const std::uint32_t active = __activemask();
    const std::uint32_t wanting = __ballot_sync(active, want);
    if (wanting == 0) { return 0xffffffffU; }
    const int leader = __ffs(static_cast<int>(wanting)) - 1;
    std::uint32_t base = 0;
    if ((t & 31U) == static_cast<std::uint32_t>(leader)) { base = atomicAdd(count, __popc(wanting)); }
    base = __shfl_sync(active, base, leader);
    return want ? base + __popc(wanting & ((1U << (t & 31U)) - 1U)) : 0xffffffffU;
#elif defined(__HIP_DEVICE_COMPILE__)
    return want ? atomicAdd(count, 1U) : 0xffffffffU;
#else
    return want ? (*count += 1, *count - 1) : 0xffffffffU;
#endif
  }
  /// hist[d] += 1 for the caller's digit `d` (< 256; 256: none), by every lane of the warp at once: on CUDA the
  /// lanes with one digit add once (__match_any_sync: the few top digits of a row's first pass would otherwise
  /// serialise the block on a handful of shared atomics).
  FERRY_HD void warp_count(std::uint32_t* hist, std::uint32_t d) const
  {
#if defined(__CUDA_ARCH__)
    const std::uint32_t peers = __match_any_sync(0xffffffffU, d);
    if (d < 256 && (t & 31U) == static_cast<std::uint32_t>(__ffs(static_cast<int>(peers)) - 1)) {
      atomicAdd(&hist[d], static_cast<std::uint32_t>(__popc(peers)));
    }
#elif defined(__HIP_DEVICE_COMPILE__)
    if (d < 256) { atomicAdd(&hist[d], 1U); }
#else
    (void)hist, (void)d;
#endif
  }
  /// The histogram pass by the whole block, warp-aligned (every lane of a warp runs the same iterations, each
  /// digit counted by warp_count).
  template <class Digit>
  FERRY_HD void histogram(std::uint32_t* hist, std::uint64_t width, Digit digit) const
  {
#if defined(__CUDA_ARCH__)
    constexpr std::uint32_t batch = 8;  // digits (their loads) a lane has in flight before it adds them
    const std::uint32_t lane = t & 31U;
    for (std::uint64_t base = t - lane; base < width; base += batch * nt) {
      std::uint32_t d[batch];
#pragma unroll
      for (std::uint32_t u = 0; u < batch; ++u) {
        const std::uint64_t c = base + u * nt + lane;
        d[u] = c < width ? digit(c) : 256U;
      }
#pragma unroll
      for (std::uint32_t u = 0; u < batch; ++u) { warp_count(hist, d[u]); }
    }
#elif defined(__HIP_DEVICE_COMPILE__)
    for (std::uint64_t c = t; c < width; c += nt) { warp_count(hist, digit(c)); }
#else
    (void)hist, (void)width, (void)digit;
#endif
  }
};
#endif

/// Bitonic sort of a[0, n2) in shared memory (n2 a power of two) by every thread of block `b`: descending when
/// `desc`, else ascending. Ends with a barrier.
template <class Blk, class T>
FERRY_HD void block_sort(const Blk& b, T* a, std::uint32_t n2, bool desc)
{
  for (std::uint32_t size = 2; size <= n2; size <<= 1) {
    for (std::uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (std::uint32_t i = b.t; i < n2; i += b.nt) {
        const std::uint32_t j = i ^ stride;
        const bool up = ((i & size) == 0) != desc;  // this pair's run ascends
        if (j > i && (up ? a[j] < a[i] : a[i] < a[j])) {
          const T x = a[i];
          a[i] = a[j];
          a[j] = x;
        }
      }
      b.sync();
    }
  }
}

}  // namespace ferry::kernels::d2h
