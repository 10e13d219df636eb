// SPDX-License-Identifier: Apache-2.0
// The gathers' shared chain (gather_publish, gather_rows_publish; select_rows joins its blocks the same way),
// FERRY_HD for the GPU and the host backend:
//   gather_offset, gather_end  a batch's place_phys chain in closed form (the CPU's place() mirrors it);
//   join_arrive                a block's arrival at a kernel's join counter (device scope, Order), the last's reset;
//   gather_join_arrive         the acq_rel cross-block join (device scope) before the last block's commit;
//   gather_release             a publishing gather's release (gather_release_args), by the last block to arrive.
// Never a relaxed counter without a fence: the last block's release would then not cover the stores of
// the blocks that arrived before it (tests/reliability/d2h_gather_relacy_model.cpp catches that mutant).
#pragma once

#include "../d2h/publish/publish.cuh"  // publish_phase, end_unplanned: the release phase every publishing kernel runs

#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/kernel_args.hpp>

#include <atomic>
#include <cstdint>

namespace ferry::kernels::d2h {

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

/// A block's arrival at the join counter `j` (device_state::gather_join), by one thread after the block barrier:
/// fetch_add(add) at device scope with Order (std::memory_order_acq_rel or std::memory_order_relaxed), spelled as
/// each side spells it. The block whose add makes the count (the bits of `count_mask`) reach `nblocks` resets the
/// counter: every block has arrived, and the next launch on the stream starts after this kernel completed (the
/// reset is atomic only so that the host backend's blocks on their threads are race-free). Returns whether this
/// block was that one; `old` is the value its add read.
template <std::memory_order Order>
FERRY_HD inline bool join_arrive(std::uint32_t& j, std::uint32_t add, std::uint32_t nblocks, std::uint32_t count_mask,
                                 std::uint32_t& old) noexcept
{
  constexpr bool acq_rel = Order == std::memory_order_acq_rel;
  static_assert(acq_rel || Order == std::memory_order_relaxed);
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
  cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device> r{j};
  old = r.fetch_add(add, acq_rel ? cuda::std::memory_order_acq_rel : cuda::std::memory_order_relaxed);
  if ((old & count_mask) + 1U != nblocks) { return false; }
  r.store(0U, cuda::std::memory_order_relaxed);
#elif defined(__HIP_DEVICE_COMPILE__)
  old = __hip_atomic_fetch_add(&j, add, acq_rel ? __ATOMIC_ACQ_REL : __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
  if ((old & count_mask) + 1U != nblocks) { return false; }
  __hip_atomic_store(&j, 0U, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  std::atomic_ref<std::uint32_t> r{j};
  old = r.fetch_add(add, Order);
  if ((old & count_mask) + 1U != nblocks) { return false; }
  r.store(0U, std::memory_order_relaxed);
#endif
  return true;
}

/// Step 4, by one thread per block after the block barrier: the acq_rel arrival (join_arrive). Returns true for
/// the block that arrived last.
FERRY_HD inline bool gather_join_arrive(ferry::d2h::device_state* st, std::uint32_t nblocks) noexcept
{
  std::uint32_t old;
  return join_arrive<std::memory_order_acq_rel>(st->gather_join, 1U, nblocks, ~0U, old);
}

/// The release of a publishing gather, by the thread of the block that arrived last (it acquired every
/// block's arrival, and every block read its cursor before it arrived): at a forward boundary the cursor
/// normalization (slot[0] = slot[1], as publish_head_body), then produced += head_n and the system-scope
/// release of published_head.
/// `rel`: the release part of either gather's arguments (gather_release_args), `dst` their ring_ref.
FERRY_HD inline void gather_release(const ferry::d2h::detail::gather_release_args& rel,
                                    const ferry::d2h::ring_ref& dst) noexcept
{
  // a boundary of a launch no plan() armed: the cursor restored from the slot this gather wrote, no release
  if (rel.boundary != 0 && end_unplanned(dst.state, dst.parity ^ 1U)) { return; }
  if (rel.normalize != 0) { ferry::d2h::normalize_cursor(dst.state); }
  publish_phase(dst.state, rel.head, rel.head_n);
}

}  // namespace ferry::kernels::d2h
