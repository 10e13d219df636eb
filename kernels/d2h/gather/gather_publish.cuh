// SPDX-License-Identifier: Apache-2.0
// Body of the gather_publish kernel, shared by the GPU wrapper (gather_publish.cu) and the host backend's
// (gather_publish_host.cpp). ONE launch per flushed batch of deferred entries (arguments: gather_args,
// dispatch: apportion_gather in ferry/d2h/detail/gather.hpp). The order of every block:
//   1. find its entry i (first_block table) and read the cursor slot[parity] once;
//   2. place entry i (the place_phys chain over entries 0..i in closed form, gather_offset; the CPU's
//      place() mirrors the chain); block 0's thread 0 writes slot[parity ^ 1] = the batch's end, from that
//      same cursor value, before its stores (no thread of this kernel reads that slot; the next writer reads
//      it after the kernel boundary);
//   3. copy its share of entry i;
//   4. (head_n > 0) block barrier, then thread 0 arrives at the join counter with an acq_rel RMW (device
//      scope): release of this block's stores (ordered before it by the barrier), acquire of every earlier
//      block's; the block that arrives last resets the counter and releases published_head at system
//      scope (publish_phase), cumulatively over every block's stores.
// Never a relaxed counter without a fence: the last block's release would then not cover the stores of
// the blocks that arrived before it (tests/reliability/d2h_gather_relacy_model.cpp catches that mutant).
#pragma once

#include "../../detail/vector_copy.cuh"
#include "../publish/publish.cuh"  // publish_phase

#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/kernel_args.hpp>

#include <atomic>
#include <cstdint>

namespace ferry::kernels::d2h {

using ferry::d2h::detail::gather_args;

/// Where the gather's entry `i` starts (physical offset) from cursor phys `phys`: the place_phys chain
///   off_k = place_phys(phys_k, r_k), phys_{k+1} = (off_k + r_k == ring_bytes ? 0 : off_k + r_k)
/// that the CPU's place() mirrors, in closed form over the prefix sums `pre` (O(1) unless the batch wraps).
/// A batch spans at most ring_bytes (its sizes plus one wrap padding: deferred_batch::needs_flush_before),
/// so the chain wraps at most once: entry i sits at phys + pre[i] while phys + pre[i + 1] <= ring_bytes
/// (every earlier entry then ended before the ring's end), else at pre[i] - pre[s], where s is the first
/// entry placed from offset 0 (the first one that no longer fits, or the one after an entry that ended
/// exactly at the ring's end). Every block computes it from the parameters alone: no dependent chain of
/// parameter loads per entry (tests/d2h/d2h_units_test.cpp checks it against the chain).
template <class Args>  // gather_args, gather_rows_args, rows_view: the same placement fields (dst, pre, n)
FERRY_HD constexpr std::uint64_t gather_offset(const Args& a, std::uint64_t phys, std::uint32_t i) noexcept
{
  const std::uint64_t ring = a.dst.ring_bytes;
  if (phys + a.pre[i + 1] <= ring) { return phys + a.pre[i]; }
  std::uint32_t s = 0;
  while (phys + a.pre[s + 1] <= ring) { ++s; }
  return a.pre[i] - a.pre[s];
}

/// Where the batch ends (the next writer's cursor phys, reduced: 0 at the ring's end).
template <class Args>
FERRY_HD constexpr std::uint64_t gather_end(const Args& a, std::uint64_t phys) noexcept
{
  const std::uint64_t end = gather_offset(a, phys, a.n - 1) + (a.pre[a.n] - a.pre[a.n - 1]);
  return end == a.dst.ring_bytes ? 0 : end;
}

/// The entry block `blk` copies: blk itself when every entry has one block (the common case of small
/// entries), else a binary search of first_block (nondecreasing, first_block[0] = 0).
FERRY_HD constexpr std::uint32_t gather_entry_of(const gather_args& a, std::uint32_t blk) noexcept
{
  if (a.first_block[a.n] == a.n) { return blk; }
  std::uint32_t lo = 0;
  std::uint32_t hi = a.n;  // first_block[lo] <= blk < first_block[hi]
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (a.first_block[mid] <= blk) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/// Steps 1-3 for block `blk` (thread `t`): `copy(dst_of, src, n, local_blk, local_nblk)` copies entry i's
/// share; it calls `dst_of()` once, where its first stores need the destination (the cursor load and the
/// placement chain run there, after the GPU copy issued its first source loads). dst_of() is null in a
/// graph launch that no plan() armed (cursor_unplanned): the copy then stores nothing.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class CopyFn>
FERRY_HD inline void gather_commit(const gather_args& a, std::uint32_t blk, std::uint32_t t, CopyFn&& copy)
{
  const std::uint32_t i = gather_entry_of(a, blk);
  auto dst_of = [&]() -> std::byte* {
    const ferry::d2h::cursor c = a.dst.load();
    const bool live = ferry::d2h::cursor_live(c);  // false: a launch no plan() armed writes nothing
    if (blk == 0 && t == 0) {
      ferry::d2h::store_cursor(&a.dst.state->slot[a.dst.parity ^ 1U],
                               live ? ferry::d2h::cursor{gather_end(a, c.phys), c.dyn_slot} : c);
    }
    return live ? a.dst.ring + gather_offset(a, c.phys, i) : nullptr;
  };
  copy(dst_of, a.e[i].src, a.e[i].bytes, blk - a.first_block[i], a.first_block[i + 1] - a.first_block[i]);
}

/// Step 4, by one thread per block after the block barrier: the acq_rel arrival. Returns true for the
/// block that arrived last (it then resets the counter: every block has arrived, and the next gather on
/// the stream starts after this kernel completed).
FERRY_HD inline bool gather_join_arrive(ferry::d2h::device_state* st, std::uint32_t nblocks) noexcept
{
  std::uint32_t old;
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
  cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device> j{st->gather_join};
  old = j.fetch_add(1U, cuda::std::memory_order_acq_rel);
  if (old + 1 == nblocks) { j.store(0U, cuda::std::memory_order_relaxed); }
#elif defined(__HIP_DEVICE_COMPILE__)
  old = __hip_atomic_fetch_add(&st->gather_join, 1U, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
  if (old + 1 == nblocks) { __hip_atomic_store(&st->gather_join, 0U, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }
#else
  std::atomic_ref<std::uint32_t> j{st->gather_join};
  old = j.fetch_add(1U, std::memory_order_acq_rel);
  if (old + 1 == nblocks) { j.store(0U, std::memory_order_relaxed); }
#endif
  return old + 1 == nblocks;
}

/// The release of a publishing gather, by the thread of the block that arrived last (it acquired every
/// block's arrival, and every block read its cursor before it arrived): at a forward boundary the cursor
/// normalization (slot[0] = slot[1], as publish_head_body), then produced += head_n and the system-scope
/// release of published_head.
template <class Args>  // gather_args, gather_rows_args: the same release fields
FERRY_HD inline void gather_release(const Args& a) noexcept
{
  // a boundary of a launch no plan() armed: the cursor restored from the slot this gather wrote, no release
  if (a.boundary != 0 && end_unplanned(a.dst.state, a.dst.parity ^ 1U)) { return; }
  if (a.normalize != 0) { ferry::d2h::normalize_cursor(a.dst.state); }
  publish_phase(a.dst.state, a.head, a.head_n);
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU copy of one gather block: from an aligned source copy_vectors<V> (V 16-byte vectors per thread per
/// pass, compile time: one small kernel per V, as the copy kernels; loads before the cursor; the byte tail),
/// bytes from any other source.
template <int V>
__device__ __forceinline__ void gather_block_phase(const gather_args& a, std::uint32_t blk, std::uint32_t t,
                                                   std::uint32_t nt)
{
  gather_commit(a, blk, t, [&](auto&& dst_of, const std::byte* src, std::uint64_t n, std::uint32_t lb, std::uint32_t nb) {
    if ((reinterpret_cast<std::uintptr_t>(src) & 15U) == 0) {
      copy_vectors<V>(dst_of, src, n, lb, nb, t, nt);
      return;
    }
    if (std::byte* d = dst_of(); d != nullptr) {
      copy_tail(d, src, static_cast<std::uint64_t>(lb) * nt + t, n, static_cast<std::uint64_t>(nb) * nt);
    }
  });
}
#endif

/// The host backend's gather block (`nt` threads), moving the bytes the GPU block's threads move
/// (copy_block_host), then the join and, for the last block, the release.
inline void gather_block_host(const gather_args& a, std::uint32_t blk, std::uint32_t nblk, std::uint32_t nt)
{
  gather_commit(a, blk, 0U, [&](auto&& dst_of, const std::byte* src, std::uint64_t n, std::uint32_t lb, std::uint32_t nb) {
    if (std::byte* d = dst_of(); d != nullptr) { copy_block_host(d, src, n, a.vecs_per_thread, lb, nb, nt); }
  });
  // Block join (the host runs a block as one thread), then the cross-block arrival.
  if (a.head_n != 0 && gather_join_arrive(a.dst.state, nblk)) { gather_release(a); }
}

}  // namespace ferry::kernels::d2h
