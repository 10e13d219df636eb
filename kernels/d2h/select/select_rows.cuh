// SPDX-License-Identifier: Apache-2.0
// Body of the select_rows kernel (channel::capture_rows), shared by the GPU wrapper (select_rows.cu) and the
// host backend's (select_rows_host.cpp). One launch per row-selected entry: the rows a row_selection names
// (ferry/d2h/row_selection.hpp) from a [n_rows, row_bytes] source into one dynamic entry, in selection order.
// The order of every block:
//   1. the item count (CPU-known, or the GPU-resolved *device_count, refused above max_count) and the cursor
//      slot[parity] (one load; cursor_unplanned: a graph launch no plan() armed stores nothing);
//   2. rows blk, blk + nblk, ...: item = row / rows_per_item; its source row from the selection (validated:
//      an invalid item is not read, its row not written, and the block notes the error); the row's bytes;
//   3. block barrier, then thread 0 arrives at the join counter (entry_arrive: one relaxed fetch_add that carries
//      the block's error in the count); the block that arrives last has every block's error in the value it read,
//      resets the counter, and commits the entry: its size slot (rows x row_bytes, or selection_error_size) and
//      the next cursor, from the cursor value it read.
// The entry's release is a later kernel (the release chain): the kernel boundary joins every block's stores.
// Captured into a graph (select_args::planned), a replay whose plan() gave forward_meta::selected places the entry
// with exactly that many items (device_state::planned_items, set by the replay's claim: row_reserved), as
// plan() placed it; it copies at most those rows and reports its true size, so a device count above the plan is
// delivered as size_overflow (the drain: a row entry larger than the bytes plan() expected) and nothing is
// written past the entry.
#pragma once

#include "../../detail/rows.cuh"  // select_items, select_source_row, copy_row, entry_arrive

#include <ferry/d2h/detail/kernel_args.hpp>

#include <atomic>
#include <cstdint>

namespace ferry::kernels::d2h {

using ferry::d2h::detail::select_args;

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
    p.dst.reserved = ferry::d2h::detail::row_reserved(items, per_item, a.row_bytes);
    p.limit = rows < items * per_item ? rows : items * per_item;
  }
  return p;
}

/// Step 1 of every block: the item count, the entry's place (select_place_of) and the cursor it read; `dst`: the
/// entry's bytes (null: a launch no plan() armed, cursor_unplanned: nothing is stored).
struct select_start {
  select_place at;
  std::uint64_t per_item{1};
  std::uint64_t rows{0};
  bool count_ok{true};
  ferry::d2h::cursor c{};  ///< the cursor slot's value, read once (the commit's too)
  std::byte* dst{nullptr};
};
FERRY_HD inline select_start select_start_of(const select_args& a) noexcept
{
  select_start s;
  s.per_item = a.sel.rows_per_item();
  s.rows = select_items(a.sel, s.count_ok) * s.per_item;
  s.at = select_place_of(a, s.rows, s.per_item);
  s.c = s.at.dst.load();
  s.dst = ferry::d2h::cursor_live(s.c) ? s.at.dst.ring + s.at.dst.offset(s.c) : nullptr;
  return s;
}

/// Step 2 for block `blk` of `nblk` (thread `t` of `nt`): rows blk, blk + nblk, ... (every thread of the block walks
/// the same rows, each row by the whole block: copy_row). Thread 0 sets `block_error` when one of them names an
/// invalid item (not read, its row not written).
template <class Flag>
FERRY_HD inline void select_rows_copy(const select_args& a, const select_start& s, std::uint32_t blk,
                                      std::uint32_t nblk, std::uint32_t t, std::uint32_t nt, Flag& block_error) noexcept
{
  for (std::uint64_t j = blk; j < s.at.limit && s.dst != nullptr; j += nblk) {
    const std::int64_t r = select_source_row(a.sel, a.n_rows, j, s.per_item);
    if (r < 0) {
      if (t == 0) { block_error = 1; }
      continue;
    }
    copy_row(s.dst + j * a.row_bytes, a.src + static_cast<std::uint64_t>(r) * a.row_bytes, a.row_bytes, a.vec != 0, t,
             nt);
  }
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU body of block `blk` of `nblk` (`nt` threads).
__device__ __forceinline__ void select_rows_block(const select_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                  std::uint32_t t, std::uint32_t nt)
{
  __shared__ int block_error;
  if (t == 0) { block_error = 0; }
  const select_start s = select_start_of(a);
  __syncthreads();
  select_rows_copy(a, s, blk, nblk, t, nt, block_error);
  __syncthreads();  // every store and every error note of the block happen-before thread 0's arrival
  if (t == 0) { entry_arrive(s.at.dst, s.c, nblk, block_error != 0, s.count_ok, s.rows * a.row_bytes); }
}
#endif

/// The host backend's block `blk` of `nblk` (the host runs a block as one thread): the same rows, one memcpy
/// each, then the arrival.
inline void select_rows_block_host(const select_args& a, std::uint32_t blk, std::uint32_t nblk)
{
  const select_start s = select_start_of(a);
  bool block_error = false;
  select_rows_copy(a, s, blk, nblk, 0, 1, block_error);
  entry_arrive(s.at.dst, s.c, nblk, block_error, s.count_ok, s.rows * a.row_bytes);
}

}  // namespace ferry::kernels::d2h
