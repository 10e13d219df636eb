// SPDX-License-Identifier: Apache-2.0
// Body of the select_rows kernel (channel::capture_rows), shared by the GPU wrapper (select_rows.cu) and the
// host backend's (select_rows_host.cpp). One launch per row-selected entry: the rows a row_selection names
// (ferry/d2h/row_selection.hpp) from a [n_rows, row_bytes] source into one dynamic entry, in selection order.
// The order of every block:
//   1. the item count (CPU-known, or the GPU-resolved *device_count, refused above max_count) and the cursor
//      slot[parity] (one load; cursor_unplanned: a graph launch no plan() armed stores nothing);
//   2. rows blk, blk + nblk, ...: item = row / rows_per_item; its source row from the selection (validated:
//      an invalid item is not read, its row not written, and the block notes the error); the row's bytes;
//   3. block barrier, then thread 0 arrives at the join counter (acq_rel, device scope, as gather_publish),
//      first OR-ing a block error into device_state::select_error; the block that arrives last reads the
//      error flag (acquired by the arrival), resets flag and counter, and commits the entry: its size slot
//      (rows x row_bytes, or selection_error_size) and the next cursor, from the cursor value it read.
// The entry's release is a later kernel (the release chain): the kernel boundary joins every block's stores.
// Captured into a graph (select_args::planned), a replay whose plan() gave forward_meta::selected places the entry
// with exactly that many items (device_state::planned_items, set by the replay's claim: planned_row_reserved), as
// plan() placed it; it copies at most those rows and reports its true size, so a device count above the plan is
// delivered as size_overflow (the drain: a row entry larger than the bytes plan() expected) and nothing is
// written past the entry.
#pragma once

#include "../../detail/vector_copy.cuh"
#include "../gather/gather_publish.cuh"  // gather_join_arrive

#include <ferry/d2h/detail/kernel_args.hpp>

#include <atomic>
#include <cstdint>

namespace ferry::kernels::d2h {

using ferry::d2h::detail::select_args;

/// The number of items the entry holds; `ok` false when a GPU-resolved count is negative or above max_count.
FERRY_HD inline std::uint64_t select_items(const ferry::d2h::row_selection& s, bool& ok) noexcept
{
  if (s.device_count == nullptr) { return s.count; }
  const std::int32_t c = *s.device_count;
  ok = c >= 0 && static_cast<std::uint64_t>(c) <= s.max_count;
  return ok ? static_cast<std::uint64_t>(c) : 0;
}

/// The source row of the entry's row `j` (item j / rows_per_item), or -1 when its item is invalid.
FERRY_HD inline std::int64_t select_source_row(const ferry::d2h::row_selection& s, std::uint64_t n_rows, std::uint64_t j,
                                               std::uint64_t per_item) noexcept
{
  const std::uint64_t i = j / per_item;
  const auto n = static_cast<std::int64_t>(n_rows);
  if (s.form == ferry::d2h::selection_form::rows) {
    const std::int64_t r = s.index_bytes == 8 ? static_cast<const std::int64_t*>(s.indices)[i]
                                              : static_cast<const std::int32_t*>(s.indices)[i];
    return r >= 0 && r < n ? r : -1;
  }
  const std::int32_t q = static_cast<const std::int32_t*>(s.indices)[i];
  if (q < 0 || static_cast<std::uint32_t>(q) >= s.n_requests) { return -1; }
  const std::int64_t lo = s.query_start_loc[q];
  const std::int64_t hi = s.query_start_loc[q + 1];
  if (lo < 0 || hi < lo || hi > n) { return -1; }
  if (s.form == ferry::d2h::selection_form::last_token) { return hi > lo ? hi - 1 : -1; }
  return lo + s.window_end <= hi ? lo + s.window_begin + static_cast<std::int64_t>(j % per_item) : -1;
}

/// The entry's place in this launch (`dst`: a.dst, its reservation the replay's planned one when it has one)
/// and the rows it may write (`limit`: every row, or at most the planned ones).
struct select_place {
  ferry::d2h::ring_ref dst;
  std::uint64_t limit{0};
};
FERRY_HD inline select_place select_place_of(const select_args& a, std::uint64_t rows, std::uint64_t per_item) noexcept
{
  select_place p{a.dst, rows};
  const std::uint64_t items = a.planned != 0 ? a.dst.state->planned_items : ferry::d2h::no_planned_items;
  if (items != ferry::d2h::no_planned_items) {
    p.dst.reserved = ferry::d2h::detail::planned_row_reserved(items, per_item, a.row_bytes);
    p.limit = rows < items * per_item ? rows : items * per_item;
  }
  return p;
}

/// Step 3 by thread 0 of block `blk` after the block barrier: the arrival, and the commit by the last block.
FERRY_HD inline void select_arrive(const select_args& a, const ferry::d2h::ring_ref& dst, std::uint32_t nblk,
                                   bool block_error, std::uint64_t rows, bool count_ok) noexcept
{
  ferry::d2h::device_state* st = dst.state;
  if (block_error) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    atomicOr(&st->select_error, 1U);
#else
    std::atomic_ref<std::uint32_t>{st->select_error}.fetch_or(1U, std::memory_order_relaxed);
#endif
  }
  if (!gather_join_arrive(st, nblk)) { return; }
  const bool bad = !count_ok || st->select_error != 0;  // every block's OR is ordered before its arrival
  st->select_error = 0;
  const ferry::d2h::cursor c = dst.load();
  dst.commit(c, bad ? ferry::d2h::selection_error_size : rows * a.row_bytes);
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU body of block `blk` of `nblk` (`nt` threads): each row by the whole block, 16-byte moves when
/// `vec`, else bytes.
__device__ __forceinline__ void select_rows_block(const select_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                  std::uint32_t t, std::uint32_t nt)
{
  __shared__ int block_error;
  if (t == 0) { block_error = 0; }
  bool count_ok = true;
  const std::uint64_t per_item = a.sel.rows_per_item();
  const std::uint64_t rows = select_items(a.sel, count_ok) * per_item;
  const select_place at = select_place_of(a, rows, per_item);
  const ferry::d2h::cursor c = at.dst.load();
  std::byte* dst = ferry::d2h::cursor_live(c) ? at.dst.ring + at.dst.offset(c) : nullptr;
  __syncthreads();
  for (std::uint64_t j = blk; j < at.limit && dst != nullptr; j += nblk) {
    const std::int64_t r = select_source_row(a.sel, a.n_rows, j, per_item);
    if (r < 0) {
      if (t == 0) { block_error = 1; }
      continue;
    }
    const std::byte* from = a.src + static_cast<std::uint64_t>(r) * a.row_bytes;
    std::byte* to = dst + j * a.row_bytes;
    if (a.vec != 0) {
      const auto* s = reinterpret_cast<const vec16*>(from);
      auto* d = reinterpret_cast<vec16*>(to);
      for (std::uint64_t k = t; k < a.row_bytes / 16; k += nt) { d[k] = s[k]; }
    } else {
      copy_tail(to, from, t, a.row_bytes, nt);
    }
  }
  __syncthreads();  // every store and every error note of the block happen-before thread 0's arrival
  if (t == 0) { select_arrive(a, at.dst, nblk, block_error != 0, rows, count_ok); }
}
#endif

/// The host backend's block `blk` of `nblk` (the host runs a block as one thread): the same rows, one memcpy
/// each, then the arrival.
inline void select_rows_block_host(const select_args& a, std::uint32_t blk, std::uint32_t nblk)
{
  bool count_ok = true;
  bool block_error = false;
  const std::uint64_t per_item = a.sel.rows_per_item();
  const std::uint64_t rows = select_items(a.sel, count_ok) * per_item;
  const select_place at = select_place_of(a, rows, per_item);
  const ferry::d2h::cursor c = at.dst.load();
  std::byte* dst = ferry::d2h::cursor_live(c) ? at.dst.ring + at.dst.offset(c) : nullptr;
  for (std::uint64_t j = blk; j < at.limit && dst != nullptr; j += nblk) {
    const std::int64_t r = select_source_row(a.sel, a.n_rows, j, per_item);
    if (r < 0) {
      block_error = true;
      continue;
    }
    std::memcpy(dst + j * a.row_bytes, a.src + static_cast<std::uint64_t>(r) * a.row_bytes, a.row_bytes);
  }
  select_arrive(a, at.dst, nblk, block_error, rows, count_ok);
}

}  // namespace ferry::kernels::d2h
