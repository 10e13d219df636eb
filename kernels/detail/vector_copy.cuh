// SPDX-License-Identifier: Apache-2.0
// The vector copy of every ferry kernel body (copy_entry, gather_publish, the H2D scatter), on the GPU and
// in the host backend (FERRY_HD):
//   vector_pass   one pass of a thread: its V loads, then what must come between (the copy's cursor read,
//                 the scatter's count), then its V stores. Every load of a pass is issued before its first
//                 store: the compiler cannot hoist a load above a store that may alias it, and a cold or
//                 zero-copy load costs ~1 us, so V loads in flight instead of one;
//   vector_loop   passes of vector_pass;
//   copy_tail     the bytes past the last whole vector (or every byte of an unaligned copy);
//   copy_vectors  the copy kernels' 16-byte copy: vector passes in block-contiguous chunks, then the tail.
// And the host backend's block copy (copy_block_host): the bytes a GPU block's threads move, as memcpy
// segments (the host runs a block as one thread).
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/detail/launch_rules.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define FERRY_UNROLL _Pragma("unroll")
#else
#define FERRY_UNROLL
#endif
#if defined(__CUDACC__) || defined(__HIPCC__)
#define FERRY_HD_INLINE FERRY_HD __forceinline__
#else
#define FERRY_HD_INLINE inline
#endif

namespace ferry::kernels {

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
using vec16 = ulonglong2;  // one 16-byte load/store (ld.global.v2.u64 / st.global.v2.u64)
#else
struct alignas(16) vec16 {
  std::uint64_t x, y;
};
#endif

/// One pass of one thread: loads the vectors base + j * step (j < V) below `count` from `s`, then calls
/// `mid()` once, then stores each loaded vector with `store(m, i, v)` (m: what mid() returned; i: its index).
/// Returns m. `I` (32 or 64 bit) is the index type of every computation.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int V, class I, class Vec, class Mid, class Store>
FERRY_HD_INLINE auto vector_pass(const Vec* s, I base, I step, I count, Mid&& mid, Store&& store)
{
  Vec r[V];
  FERRY_UNROLL
  for (int j = 0; j < V; ++j) {
    const I i = base + static_cast<I>(j) * step;
    if (i < count) { r[j] = s[i]; }
  }
  auto m = mid();
  FERRY_UNROLL
  for (int j = 0; j < V; ++j) {
    const I i = base + static_cast<I>(j) * step;
    if (i < count) { store(m, i, r[j]); }
  }
  return m;
}

/// vector_pass from `base`, every `stride`, while base < count.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int V, class I, class Vec, class Mid, class Store>
FERRY_HD_INLINE void vector_loop(const Vec* s, I base, I step, I stride, I count, Mid&& mid, Store&& store)
{
  for (; base < count; base += stride) { vector_pass<V>(s, base, step, count, mid, store); }
}

/// Bytes [from, n), every `step`-th: a thread's share of the tail (or of an unaligned copy).
template <class Byte>
FERRY_HD_INLINE void copy_tail(Byte* dst, const Byte* src, std::uint64_t from, std::uint64_t n, std::uint64_t step)
{
  for (std::uint64_t i = from; i < n; i += step) { dst[i] = src[i]; }
}

/// The copy kernels' copy of `n` bytes from a 16-byte aligned `src` by block `blk` of `nblk` (thread `t` of
/// `nt`): V 16-byte vectors per thread per pass in block-contiguous chunks (block b owns vectors
/// [b*nt*V, (b+1)*nt*V) of every pass: a warp's accesses are coalesced), then the tail (n % 16) by block 0.
/// `dst_of()` is called once by every thread, after its first pass's loads (ferry: the cursor load overlaps
/// them), and gives the destination; null: nothing is stored.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int V, class DstFn>
FERRY_HD_INLINE void copy_vectors(DstFn&& dst_of, const std::byte* src, std::uint64_t n, std::uint32_t blk,
                                  std::uint32_t nblk, std::uint32_t t, std::uint32_t nt)
{
  const std::uint64_t vecs = n / 16;
  const auto* s = reinterpret_cast<const vec16*>(src);
  const std::uint64_t chunk = static_cast<std::uint64_t>(nt) * V;
  const std::uint64_t stride = chunk * nblk;
  const std::uint64_t base = blk * chunk + t;
  const auto store = [](std::byte* d, std::uint64_t i, const vec16& v) {
    if (d != nullptr) { reinterpret_cast<vec16*>(d)[i] = v; }
  };
  std::byte* dst = vector_pass<V>(s, base, std::uint64_t{nt}, vecs, dst_of, store);
  if (dst == nullptr) { return; }  // ferry's writers: a graph launch that no plan() armed stores nothing
  // Entries larger than one pass of the grid.
  vector_loop<V>(s, base + stride, std::uint64_t{nt}, stride, vecs, [dst] { return dst; }, store);
  if (blk == 0) { copy_tail(dst, src, vecs * 16 + t, n, nt); }
}

/// The host backend's copy of block `blk` of `nblk` (`nt` threads): the bytes the GPU block's threads move
/// (copy_vectors' chunks of nt x V vectors per pass and the tail by block 0 from a 16-byte aligned `src`, V
/// = launch_rules::vecs_per_thread(vecs_per_thread); segments of nt bytes from any other source), each
/// segment as one memcpy.
inline void copy_block_host(std::byte* dst, const std::byte* src, std::uint64_t n, std::uint32_t vecs_per_thread,
                            std::uint32_t blk, std::uint32_t nblk, std::uint32_t nt)
{
  const bool vec = (reinterpret_cast<std::uintptr_t>(src) & 15U) == 0;
  const std::uint64_t unit = vec ? 16 : 1;
  const std::uint64_t units = n / unit;
  const std::uint64_t chunk =
    static_cast<std::uint64_t>(nt) * (vec ? ferry::detail::launch_rules::vecs_per_thread(vecs_per_thread) : 1);
  for (std::uint64_t base = blk * chunk; base < units; base += chunk * nblk) {
    const std::uint64_t k = chunk < units - base ? chunk : units - base;
    std::memcpy(dst + base * unit, src + base * unit, k * unit);
  }
  if (vec && blk == 0) { copy_tail(dst, src, units * 16, n, 1); }
}

}  // namespace ferry::kernels
