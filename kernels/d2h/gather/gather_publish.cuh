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
// The chain, the join and the release are kernels/detail/gather_chain.cuh's (gather_rows_publish shares them).
#pragma once

#include "../../detail/gather_chain.cuh"   // gather_offset, gather_end, gather_join_arrive, gather_release
#include "../../detail/prefix_search.cuh"  // prefix_find
#include "../../detail/vector_copy.cuh"

#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/kernel_args.hpp>

#include <atomic>
#include <cstdint>

namespace ferry::kernels::d2h {

using ferry::d2h::detail::gather_args;

/// The entry block `blk` copies: blk itself when every entry has one block (the common case of small
/// entries), else a binary search of first_block (nondecreasing, first_block[0] = 0).
FERRY_HD constexpr std::uint32_t gather_entry_of(const gather_args& a, std::uint32_t blk) noexcept
{
  return prefix_find(a.first_block, a.n, blk);
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

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU copy of one gather block: from an aligned source copy_vectors<V> (V 16-byte vectors per thread per
/// pass, compile time: one small kernel per V, as the copy kernels; loads before the cursor; the byte tail),
/// bytes from any other source.
template <int V>
__device__ __forceinline__ void gather_block_phase(const gather_args& a, std::uint32_t blk, std::uint32_t t,
                                                   std::uint32_t nt)
{
  gather_commit(a, blk, t,
                [&](auto&& dst_of, const std::byte* src, std::uint64_t n, std::uint32_t lb, std::uint32_t nb) {
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
  gather_commit(a, blk, 0U,
                [&](auto&& dst_of, const std::byte* src, std::uint64_t n, std::uint32_t lb, std::uint32_t nb) {
                  if (std::byte* d = dst_of(); d != nullptr) {
                    copy_block_host(d, src, n, a.vecs_per_thread, lb, nb, nt);
                  }
                });
  // Block join (the host runs a block as one thread), then the cross-block arrival.
  if (a.rel.head_n != 0 && gather_join_arrive(a.dst.state, nblk)) { gather_release(a.rel, a.dst); }
}

}  // namespace ferry::kernels::d2h
