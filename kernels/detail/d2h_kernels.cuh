// SPDX-License-Identifier: Apache-2.0
// Bodies of the D2H kernels, shared by the GPU wrappers (kernels/d2h_kernels.cu) and the host backend
// (src/d2h_host_kernels.cpp). Written as phases; the wrappers put the block join (__syncthreads) between.
#pragma once

#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/kernel_args.hpp>

#include <cstdint>
#include <cstring>

namespace ferry::kernels::d2h {

using ferry::d2h::detail::copy_args;
using ferry::d2h::detail::head_args;

/// The entry's actual size: the static size, or the GPU-resolved size of a dynamic entry (one load; it
/// may exceed the reservation: the size slot reports it and the drain rejects the entry).
FERRY_HD inline std::uint64_t actual_length(const copy_args& a) noexcept
{
  return a.dst.dynamic != 0 ? *a.actual_size : a.bytes;
}

/// Bytes the copy writes for an entry of actual size `actual`: never beyond the reservation (a static
/// entry's size is always within it).
FERRY_HD inline std::uint64_t copy_length(const copy_args& a, std::uint64_t actual) noexcept
{
  return actual < a.dst.reserved ? actual : a.dst.reserved;
}
FERRY_HD inline std::uint64_t copy_length(const copy_args& a) noexcept { return copy_length(a, actual_length(a)); }

/// Thread `t` of `nt` copies its share: 16-byte vector moves when both sides are 16-byte aligned, bytes
/// otherwise (the tail, or a misaligned source).
FERRY_HD inline void copy_bytes(std::byte* dst, const std::byte* src, std::uint64_t n, std::uint64_t t,
                                std::uint64_t nt) noexcept
{
  std::uint64_t done = 0;
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) & 15U) == 0) {
    const std::uint64_t vecs = n / 16;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    auto* d = reinterpret_cast<ulonglong2*>(dst);
    const auto* s = reinterpret_cast<const ulonglong2*>(src);
    for (std::uint64_t i = t; i < vecs; i += nt) { d[i] = s[i]; }
#else
    for (std::uint64_t i = t; i < vecs; i += nt) { std::memcpy(dst + i * 16, src + i * 16, 16); }
#endif
    done = vecs * 16;
  }
  for (std::uint64_t i = done + t; i < n; i += nt) { dst[i] = src[i]; }
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// 16-byte vector copy of `vecs` vectors by block `blk` of `nblk` (thread `t` of `nt`): V vectors per thread
/// per pass, block-contiguous chunks (block b owns vectors [b*nt*V, (b+1)*nt*V) of every pass; a warp's
/// accesses are coalesced), and every load of a pass is issued before its first store. `dst_of()` is
/// called once, after the first pass's loads were issued (ferry: the cursor load overlaps them).
/// Returns the destination. Shared by ferry's copy kernels and the benchmark's copy-only baseline.
template <int V, class DstFn>
__device__ __forceinline__ std::byte* copy_vec_passes(DstFn&& dst_of, const std::byte* src, std::uint64_t vecs,
                                                      std::uint32_t blk, std::uint32_t nblk, std::uint32_t t,
                                                      std::uint32_t nt)
{
  const auto* s = reinterpret_cast<const ulonglong2*>(src);
  const std::uint64_t chunk = static_cast<std::uint64_t>(nt) * V;
  const std::uint64_t stride = chunk * nblk;
  std::uint64_t base = blk * chunk + t;
  ulonglong2 r[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const std::uint64_t i = base + static_cast<std::uint64_t>(j) * nt;
    if (i < vecs) { r[j] = s[i]; }
  }
  std::byte* dst = dst_of();
  auto* d = reinterpret_cast<ulonglong2*>(dst);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const std::uint64_t i = base + static_cast<std::uint64_t>(j) * nt;
    if (i < vecs) { d[i] = r[j]; }
  }
  for (base += stride; base < vecs; base += stride) {  // entries larger than one pass of the grid
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const std::uint64_t i = base + static_cast<std::uint64_t>(j) * nt;
      if (i < vecs) { r[j] = s[i]; }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const std::uint64_t i = base + static_cast<std::uint64_t>(j) * nt;
      if (i < vecs) { d[i] = r[j]; }
    }
  }
  return dst;
}

/// copy_vec_passes with V chosen at run time (uniform branch; V in {1, 2, 4, 8}, anything else is 1),
/// then the byte tail (n % 16) by block 0.
template <class DstFn>
__device__ __forceinline__ void copy_vec(DstFn&& dst_of, const std::byte* src, std::uint64_t n, std::uint32_t v,
                                         std::uint32_t blk, std::uint32_t nblk, std::uint32_t t, std::uint32_t nt)
{
  const std::uint64_t vecs = n / 16;
  std::byte* dst;
  switch (v) {
    case 8: dst = copy_vec_passes<8>(dst_of, src, vecs, blk, nblk, t, nt); break;
    case 4: dst = copy_vec_passes<4>(dst_of, src, vecs, blk, nblk, t, nt); break;
    case 2: dst = copy_vec_passes<2>(dst_of, src, vecs, blk, nblk, t, nt); break;
    default: dst = copy_vec_passes<1>(dst_of, src, vecs, blk, nblk, t, nt); break;
  }
  if (blk == 0) {
    for (std::uint64_t i = vecs * 16 + t; i < n; i += nt) { dst[i] = src[i]; }
  }
}
#endif

/// The copy-and-commit order of one writer thread (GPU) or one block (host backend), ONE code path for both:
///   1. the entry's actual size (a dynamic entry's GPU-resolved size bounds the copy);
///   2. `copy(place, n)` copies n bytes; it calls `place()` once, where its first stores need the destination
///      (the GPU copy issues its first source loads before, so the two loads are in flight together);
///   3. place() reads the cursor once, and the grid's thread (0, 0) (block `blk`, thread `t`; the host runs a
///      block as its thread 0) writes the next cursor slot from that same value at once, before its payload
///      stores.
/// That is safe because the slot it writes (parity ^ 1) is read by no thread of this kernel, only by the next
/// writer kernel on the stream, after this one completed (kernel boundary or grid_dependency_wait).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class CopyFn>
FERRY_HD inline void copy_commit(const copy_args& a, std::uint32_t blk, std::uint32_t t, CopyFn&& copy)
{
  const std::uint64_t actual = actual_length(a);
  const std::uint64_t n = copy_length(a, actual);
  auto place = [&] {
    const ferry::d2h::cursor c = a.dst.load();
    if (blk == 0 && t == 0) { a.dst.commit(c, actual); }  // the size slot is written for dynamic entries only
    return a.dst.ring + a.dst.offset(c);
  };
  copy(place, n);
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU copy of block `blk` of `nblk` (thread `t` of `nt`) in copy_commit's order, for a 16-byte aligned
/// source (entries start 16-byte aligned in the ring): V 16-byte vectors per thread per pass, V fixed at
/// compile time (copy_vec_passes: loads before stores), then the byte tail (n % 16) by block 0. One
/// instantiation per V and no run-time dispatch: each kernel's code stays small (in a model's graph it is
/// fetched cold at every hook).
template <int V>
__device__ __forceinline__ void copy_commit_vec(const copy_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                std::uint32_t t, std::uint32_t nt)
{
  copy_commit(a, blk, t, [&](auto&& place, std::uint64_t n) {
    const std::uint64_t vecs = n / 16;
    std::byte* dst = copy_vec_passes<V>(place, a.src, vecs, blk, nblk, t, nt);
    if (blk == 0) {
      for (std::uint64_t i = vecs * 16 + t; i < n; i += nt) { dst[i] = a.src[i]; }
    }
  });
}

/// The same for a source that is not 16-byte aligned: byte moves over the whole grid.
__device__ __forceinline__ void copy_commit_bytes(const copy_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                  std::uint32_t t, std::uint32_t nt)
{
  copy_commit(a, blk, t, [&](auto&& place, std::uint64_t n) {
    std::byte* dst = place();
    const std::uint64_t stride = static_cast<std::uint64_t>(nblk) * nt;
    for (std::uint64_t i = static_cast<std::uint64_t>(blk) * nt + t; i < n; i += stride) { dst[i] = a.src[i]; }
  });
}
#endif

/// The host backend's copy of block `blk` of `nblk` (`nt` threads) in copy_commit's order, moving the same
/// bytes the GPU block's threads move (copy_vec's chunks of nt * V vectors per pass, the byte tail by block
/// 0; bytes in segments of nt from an unaligned source), each segment as one memcpy.
inline void copy_commit_block_host(const copy_args& a, std::uint32_t blk, std::uint32_t nblk, std::uint32_t nt)
{
  copy_commit(a, blk, 0U, [&](auto&& place, std::uint64_t n) {
    std::byte* dst = place();
    const bool vec = (reinterpret_cast<std::uintptr_t>(a.src) & 15U) == 0;
    const std::uint64_t unit = vec ? 16 : 1;
    const std::uint64_t units = n / unit;
    const std::uint64_t v = vec ? (a.vecs_per_thread == 8 || a.vecs_per_thread == 4 || a.vecs_per_thread == 2
                                     ? a.vecs_per_thread
                                     : 1)
                                : 1;
    const std::uint64_t chunk = static_cast<std::uint64_t>(nt) * v;
    for (std::uint64_t base = blk * chunk; base < units; base += chunk * nblk) {
      const std::uint64_t k = chunk < units - base ? chunk : units - base;
      std::memcpy(dst + base * unit, a.src + base * unit, k * unit);
    }
    if (vec && blk == 0) {
      for (std::uint64_t i = units * 16; i < n; ++i) { dst[i] = a.src[i]; }
    }
  });
}

/// One thread, after every payload writer of the batch is joined (block barrier or stream order):
/// produced += n, then ONE system-scope release store of published_head. Nothing else is needed: the
/// release orders every write that happens-before it (this block's stores via the barrier, earlier
/// kernels' stores via the kernel boundary) before the CPU's matching acquire.
FERRY_HD inline void publish_phase(ferry::d2h::device_state* state, std::uint64_t* head, std::uint64_t n) noexcept
{
  const std::uint64_t produced = state->produced + n;
  state->produced = produced;
  ferry::backend::store_release_system(head, produced);
}

/// The publish kernel's body (one thread).
FERRY_HD inline void publish_head_body(const head_args& a) noexcept
{
  if (a.normalize != 0) { ferry::d2h::normalize_cursor(a.state); }
  publish_phase(a.state, a.head, a.n);
}

/// The commit check's body (one thread; see commit_check_args): stream order after the writer kernel.
FERRY_HD inline void commit_check_body(const ferry::d2h::detail::commit_check_args& a) noexcept
{
  const ferry::d2h::cursor from = a.entry.state->slot[a.entry.parity];
  const ferry::d2h::cursor to = a.entry.state->slot[a.entry.parity ^ 1U];
  const std::uint32_t want = ferry::d2h::cursor_commits(from.dyn_slot) + 1U;
  if (ferry::d2h::cursor_commits(to.dyn_slot) == want) { return; }
  a.entry.commit(from, ~std::uint64_t{0});  // the next entry is placed right; an unknown size is rejected
  if (ferry::backend::load_relaxed_system(a.flag) == 0) { ferry::backend::store_release_system(a.flag, a.tag); }
}

}  // namespace ferry::kernels::d2h
