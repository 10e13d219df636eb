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

/// Block `blk` of `nblk` (thread `t` of `nt` per block) copies its share of the entry (the host backend's
/// form: the cursor is read through data(), the commit is a separate phase; the GPU kernels use
/// copy_commit_phase below).
FERRY_HD inline void copy_phase(const copy_args& a, std::uint32_t blk, std::uint32_t nblk, std::uint32_t t,
                                std::uint32_t nt) noexcept
{
  const std::uint64_t bt = static_cast<std::uint64_t>(blk) * nt + t;
  copy_bytes(a.dst.data(), a.src, copy_length(a), bt, static_cast<std::uint64_t>(nblk) * nt);
}

/// One block (the host backend's per-thread loop of the fused kernel): thread `t` of `nt`.
FERRY_HD inline void copy_phase(const copy_args& a, std::uint64_t t, std::uint64_t nt) noexcept
{
  copy_phase(a, 0U, 1U, static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(nt));
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU copy of block `blk` of `nblk` (thread `t` of `nt`), with the commit folded in: every thread reads
/// the cursor once (after its first source loads were issued: the two loads are in flight together), and
/// the grid's thread (0, 0) writes the next cursor slot from that same value at once, before its payload
/// stores. That is safe because the slot it writes (parity ^ 1) is read by no thread of this kernel, only
/// by the next writer kernel on the stream, after this one completed (kernel boundary or
/// grid_dependency_wait). A dynamic entry reads its size first (the length bounds the loads).
__device__ __forceinline__ void copy_commit_phase(const copy_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                  std::uint32_t t, std::uint32_t nt)
{
  const std::uint64_t actual = actual_length(a);
  const std::uint64_t n = copy_length(a, actual);
  auto place = [&] {
    const ferry::d2h::cursor c = a.dst.load();
    if (blk == 0 && t == 0) { a.dst.commit(c, actual); }  // the size slot is written for dynamic entries only
    return a.dst.ring + a.dst.offset(c);
  };
  if ((reinterpret_cast<std::uintptr_t>(a.src) & 15U) == 0) {  // entries start 16-byte aligned in the ring
    copy_vec(place, a.src, n, a.vecs_per_thread, blk, nblk, t, nt);
    return;
  }
  std::byte* dst = place();
  copy_bytes(dst, a.src, n, static_cast<std::uint64_t>(blk) * nt + t, static_cast<std::uint64_t>(nblk) * nt);
}
#endif

/// Exactly one thread of the grid: advance the cursor (and write the size slot of a dynamic entry).
/// Reads cursor slot `parity`, writes slot `parity ^ 1`: no other thread of this kernel reads that slot.
FERRY_HD inline void commit_phase(const copy_args& a) noexcept
{
  a.dst.commit(actual_length(a));  // the size slot is written for dynamic entries only
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
  if (a.normalize != 0) { a.state->slot[0] = a.state->slot[1]; }
  publish_phase(a.state, a.head, a.n);
}

}  // namespace ferry::kernels::d2h
