// SPDX-License-Identifier: Apache-2.0
// Body of the copy kernels, copy_entry (any grid, copy only) and copy_entry_publish (one block: copy, block
// join, the fused release), shared by the GPU wrapper (copy_entry.cu) and the host backend's
// (copy_entry_host.cpp). Written as phases; the wrappers put the block join (__syncthreads) between.
// Dispatch (form, shape): ferry/d2h/detail/launch_shape.hpp; the vector copy: kernels/detail/vector_copy.cuh.
#pragma once

#include "../../detail/vector_copy.cuh"
#include "../publish/publish.cuh"  // publish_phase

#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/kernel_args.hpp>
#include <ferry/d2h/detail/launch_shape.hpp>  // copy_form

#include <cstdint>

namespace ferry::kernels::d2h {

using ferry::d2h::detail::copy_args;
using ferry::d2h::detail::copy_form;

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

/// The copy-and-commit order of one writer thread (GPU) or one block (host backend), ONE code path for both:
///   1. the entry's actual size (a dynamic entry's GPU-resolved size bounds the copy);
///   2. `copy(place, n)` copies n bytes; it calls `place()` once, where its first stores need the destination
///      (the GPU copy issues its first source loads before, so the two loads are in flight together);
///   3. place() reads the cursor once, and the grid's thread (0, 0) (block `blk`, thread `t`; the host runs a
///      block as its thread 0) writes the next cursor slot from that same value at once, before its payload
///      stores. In a graph launch that no plan() armed the cursor carries cursor_unplanned: commit passes it
///      on and place() returns null, so the copy stores nothing (replay_token.cuh).
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
  auto place = [&]() -> std::byte* {
    const ferry::d2h::cursor c = a.dst.load();
    if (blk == 0 && t == 0) { a.dst.commit(c, actual); }  // the size slot is written for dynamic entries only
    return ferry::d2h::cursor_live(c) ? a.dst.ring + a.dst.offset(c) : nullptr;  // null: an unplanned launch
  };
  copy(place, n);
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU copy of block `blk` of `nblk` (thread `t` of `nt`) in copy_commit's order, for a 16-byte aligned
/// source (entries start 16-byte aligned in the ring): copy_vectors<V>, V fixed at compile time (loads before
/// stores, then the byte tail by block 0). One instantiation per V and no run-time dispatch: each kernel's
/// code stays small (in a model's graph it is fetched cold at every hook).
template <int V>
__device__ __forceinline__ void copy_commit_vec(const copy_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                std::uint32_t t, std::uint32_t nt)
{
  copy_commit(a, blk, t, [&](auto&& place, std::uint64_t n) { copy_vectors<V>(place, a.src, n, blk, nblk, t, nt); });
}

/// The same for a source that is not 16-byte aligned: byte moves over the whole grid.
__device__ __forceinline__ void copy_commit_bytes(const copy_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                  std::uint32_t t, std::uint32_t nt)
{
  copy_commit(a, blk, t, [&](auto&& place, std::uint64_t n) {
    if (std::byte* d = place(); d != nullptr) {
      copy_tail(d, a.src, static_cast<std::uint64_t>(blk) * nt + t, n, static_cast<std::uint64_t>(nblk) * nt);
    }
  });
}

/// The lean form (copy_form::vN_lean; launch_shape.hpp lean_form; config::lean_copy_kernel): an entry of a static size,
/// a multiple of 16 bytes, from a 16-byte aligned source, that one pass of the grid covers. copy_commit's order with
/// the least code: the thread's V loads, the cursor load, the commit by the grid's thread (0, 0), V stores. No pass
/// loop, no byte tail, no size load, 32-bit indices (one pass of any launch shape is far below 2^32 vectors).
/// copy_entry's only: the launch's own grid (blockIdx, threadIdx, blockDim), read after the size.
template <int V>
__device__ __forceinline__ void copy_commit_lean(const copy_args& a)
{
  const auto vecs = static_cast<std::uint32_t>(a.bytes >> 4U);
  const std::uint32_t nt = blockDim.x;
  const std::uint32_t blk = blockIdx.x;
  const std::uint32_t t = threadIdx.x;
  const auto place = [&]() -> vec16* {
    const ferry::d2h::cursor c = a.dst.load();
    if ((blk | t) == 0) { a.dst.commit(c); }
    return ferry::d2h::cursor_live(c) ? reinterpret_cast<vec16*>(a.dst.ring + a.dst.offset(c)) : nullptr;
  };
  vector_pass<V>(reinterpret_cast<const vec16*>(a.src), blk * nt * V + t, nt, vecs, place,
                 [](vec16* d, std::uint32_t i, const vec16& v) {
                   if (d != nullptr) { d[i] = v; }
                 });
}

/// Form `F`'s copy (copy_form: V vectors per thread from an aligned source, its lean form, or bytes).
template <copy_form F>
__device__ __forceinline__ void copy_by_form(const copy_args& a, std::uint32_t blk, std::uint32_t nblk,
                                             std::uint32_t t, std::uint32_t nt)
{
  constexpr int v = static_cast<int>(ferry::d2h::detail::form_vecs(F));
  if constexpr (F == copy_form::bytes) {
    copy_commit_bytes(a, blk, nblk, t, nt);
  } else if constexpr (ferry::d2h::detail::is_lean(F)) {
    copy_commit_lean<v>(a);
  } else {
    copy_commit_vec<v>(a, blk, nblk, t, nt);
  }
}
#endif

/// The host backend's copy of block `blk` of `nblk` (`nt` threads) in copy_commit's order, moving the bytes
/// the GPU block's threads move (copy_block_host), for every form.
inline void copy_commit_block_host(const copy_args& a, std::uint32_t blk, std::uint32_t nblk, std::uint32_t nt)
{
  copy_commit(a, blk, 0U, [&](auto&& place, std::uint64_t n) {
    if (std::byte* d = place(); d != nullptr) { copy_block_host(d, a.src, n, a.vecs_per_thread, blk, nblk, nt); }
  });
}

}  // namespace ferry::kernels::d2h
