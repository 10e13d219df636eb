// SPDX-License-Identifier: Apache-2.0
// Body of the gather_rows_publish kernel (channel::capture_rows_deferred), shared by the GPU wrapper
// (gather_rows_publish.cu) and the host backend's (gather_rows_publish_host.cpp). ONE launch per flushed batch
// of row-selected deferred entries sharing one selection (arguments: gather_rows_args, kernel_args.hpp). The
// order of every block:
//   1. the item count (CPU-known, or the GPU-resolved *device_count, refused above max_count) and the cursor
//      slot[parity] (one load; cursor_unplanned: a graph launch no plan() armed stores nothing); block 0's
//      thread 0 writes slot[parity ^ 1] = the batch's end and the size slot after its n entries, from that same
//      cursor value (no thread of this kernel reads that slot; the next writer reads it after the kernel
//      boundary);
//   2. work items blk, blk + nblk, ... over (entry i, row j, chunk k): the source row from the selection
//      (validated as select_rows validates it: an invalid item is not read, its row not written, the block notes
//      the error), chunk k of the row's bytes into entry i (gather_offset) at row j;
//   3. block barrier, then thread 0 ORs a block error into device_state::select_error and arrives at the join
//      counter (acq_rel, device scope: gather_join_arrive); the block that arrives last reads the error flag
//      (acquired by the arrival), resets it, writes every entry's size slot (rows x row_bytes[i], or
//      selection_error_size for every entry) and, when head_n > 0, releases published_head at system scope
//      (gather_release: cumulative over every block's stores and its own size-slot stores).
// Without an in-kernel release the batch's release is a later kernel on the stream or the branch (the kernel
// boundary joins every block's stores and the size slots).
// Captured into a graph (gather_rows_args::planned), a replay whose plan() gave forward_meta::selected places the
// batch as plan() did: entry i takes row_reserved(items, rows per item, row_bytes[i]) (rows_layout), writes
// at most those rows and reports its true size (above the plan: size_overflow at the drain).
#pragma once

#include "../../detail/gather_chain.cuh"   // gather_offset, gather_end, gather_join_arrive, gather_release
#include "../../detail/prefix_search.cuh"  // prefix_find
#include "../../detail/rows.cuh"           // select_items, select_source_row, note_select_error, copy_row

#include <ferry/d2h/detail/kernel_args.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace ferry::kernels::d2h {

using ferry::d2h::detail::gather_rows_args;

/// How a row batch's prefix sums pre[0..n] of its reservations are formed in this launch: the captured ones
/// (a.pre), or a plan()'s (row_reserved of each entry): `unit` x a.rpre16[i] (every row a 16-byte multiple:
/// closed form), `unit` x i (no row planned: 16 bytes each), or the sums a block computed (`sums`).
enum class rows_pre_form : std::uint32_t { captured, closed, uniform, summed };
/// The batch's layout in this launch: how its prefix sums are formed, and the rows each entry may write (`limit`:
/// at most the planned ones). It holds no pointer to the kernel's parameters (one would put them in local memory):
/// rows_view reads them.
struct rows_layout {
  rows_pre_form form{rows_pre_form::captured};
  std::uint64_t unit{0};
  const std::uint64_t* sums{nullptr};
  std::uint64_t limit{0};
};
/// gather_offset / gather_end's view of a row batch laid out by `l` (their fields: dst.ring_bytes, pre, n), made
/// where it is used.
struct rows_view {
  struct ring_size {
    std::uint64_t ring_bytes;
  } dst;
  struct prefix {
    const gather_rows_args& a;
    const rows_layout& l;
    FERRY_HD std::uint64_t operator[](std::uint32_t i) const noexcept
    {
      switch (l.form) {
        case rows_pre_form::captured: return a.pre[i];
        case rows_pre_form::closed: return l.unit * a.rpre16[i];
        case rows_pre_form::uniform: return l.unit * i;
        default: return l.sums[i];
      }
    }
  } pre;
  std::uint32_t n;
};
FERRY_HD inline rows_view rows_view_of(const gather_rows_args& a, const rows_layout& l) noexcept
{
  return rows_view{{a.dst.ring_bytes}, {a, l}, a.n};
}
/// The layout of a batch of `rows` rows per entry. A replay's plan()'d items (device_state::planned_items) place a
/// captured batch; without the closed form `sums` (n + 1 words) receives the prefix sums when `fill` (the GPU: thread
/// 0, before the block barrier).
FERRY_HD inline rows_layout gather_rows_layout(const gather_rows_args& a, std::uint64_t rows, std::uint64_t* sums,
                                               bool fill) noexcept
{
  rows_layout l{rows_pre_form::captured, 0, sums, rows};
  const std::uint64_t items = a.planned != 0 ? a.dst.state->planned_items : ferry::d2h::no_planned_items;
  if (items == ferry::d2h::no_planned_items) { return l; }
  const std::uint64_t per = items * a.sel.rows_per_item();
  l.limit = rows < per ? rows : per;
  if (per == 0) {
    l.form = rows_pre_form::uniform;
    l.unit = ferry::d2h::entry_alignment;
  } else if (a.rpre16_ok != 0) {
    l.form = rows_pre_form::closed;
    l.unit = per * 16;
  } else {
    if (fill) {
      sums[0] = 0;
      for (std::uint32_t i = 0; i < a.n; ++i) {
        sums[i + 1] = sums[i] + ferry::d2h::detail::row_reserved(items, a.sel.rows_per_item(), a.row_bytes[i]);
      }
    }
    l.form = rows_pre_form::summed;
  }
  return l;
}

/// Step 1's next cursor: the batch's end and the size slot after its n dynamic entries (no division unless the
/// size ring is smaller than the batch).
FERRY_HD inline ferry::d2h::cursor gather_rows_next(const gather_rows_args& a, const rows_layout& l,
                                                    ferry::d2h::cursor c) noexcept
{
  if (!ferry::d2h::cursor_live(c)) { return c; }
  std::uint64_t slot = ferry::d2h::cursor_size_slot(c.dyn_slot) + a.n;
  const std::uint64_t count = a.dst.size_slot_count;
  if (count != 0 && slot >= count) { slot %= count; }
  return ferry::d2h::cursor{gather_end(rows_view_of(a, l), c.phys),
                            slot | (c.dyn_slot & ~std::uint64_t{0xffffffffULL})};
}

/// Step 3 by thread 0 of the block that arrived last: the error flag, every size slot, the release.
FERRY_HD inline void gather_rows_commit(const gather_rows_args& a, ferry::d2h::cursor c, std::uint64_t rows,
                                        bool count_ok) noexcept
{
  ferry::d2h::device_state* st = a.dst.state;
  const bool bad = !count_ok || st->select_error != 0;  // every block's OR is ordered before its arrival
  st->select_error = 0;
  const std::uint64_t count = a.dst.size_slot_count;
  if (ferry::d2h::cursor_live(c) && count != 0) {
    std::uint64_t slot = ferry::d2h::cursor_size_slot(c.dyn_slot);
    for (std::uint32_t i = 0; i < a.n; ++i) {
      a.dst.size_slots[slot] = bad ? ferry::d2h::selection_error_size : rows * a.row_bytes[i];
      slot = slot + 1 >= count ? 0 : slot + 1;
    }
  }
  if (a.rel.head_n != 0) { gather_release(a.rel, a.dst); }
}

/// Step 1 for block `blk`: the cursor and (block 0, thread `t` 0) the next cursor, placed by `l`.
FERRY_HD inline ferry::d2h::cursor gather_rows_start(const gather_rows_args& a, const rows_layout& l, std::uint32_t blk,
                                                     std::uint32_t t) noexcept
{
  const ferry::d2h::cursor c = a.dst.load();
  if (blk == 0 && t == 0) {
    ferry::d2h::store_cursor(&a.dst.state->slot[a.dst.parity ^ 1U], gather_rows_next(a, l, c));
  }
  return c;
}

/// Step 2's work item `w` of `rows` rows per entry: where its row comes from and goes (null from: invalid).
struct gather_rows_item {
  const std::byte* from{nullptr};
  std::byte* to{nullptr};
  std::uint64_t bytes{0};
};
/// Work items are (entry i, row j, chunk k), entry-major then row-major: entry i's start at rows x cpre[i], `rows`
/// the rows each entry writes (rows_layout::limit).
FERRY_HD inline gather_rows_item gather_rows_at(const gather_rows_args& a, const rows_layout& l, ferry::d2h::cursor c,
                                                std::uint64_t w, std::uint64_t rows) noexcept
{
  const std::uint32_t i = prefix_find(a.cpre, a.n, w / rows);  // cpre[i] <= w / rows < cpre[i + 1]
  const std::uint64_t chunks = a.cpre[i + 1] - a.cpre[i];
  const std::uint64_t local = w - rows * a.cpre[i];
  const std::uint64_t j = local / chunks;
  const std::uint64_t k = local - j * chunks;
  const std::uint64_t rb = a.row_bytes[i];
  const std::uint64_t at = k * a.chunk_bytes;
  const std::uint64_t n = rb - at < a.chunk_bytes ? rb - at : a.chunk_bytes;
  const std::int64_t r = select_source_row(a.sel, a.n_rows, j, a.sel.rows_per_item());
  if (r < 0) { return {nullptr, nullptr, n}; }
  return {a.src[i] + static_cast<std::uint64_t>(r) * rb + at,
          a.dst.ring + gather_offset(rows_view_of(a, l), c.phys, i) + j * rb + at, n};
}

/// Step 2 for block `blk` of `nblk` (thread `t` of `nt`): work items blk, blk + nblk, ... (every thread of the block
/// walks the same items, each by the whole block: copy_row). Thread 0 sets `block_error` when one of them names an
/// invalid item (not read, its row not written).
template <class Flag>
FERRY_HD inline void gather_rows_copy(const gather_rows_args& a, const rows_layout& l, ferry::d2h::cursor c,
                                      std::uint32_t blk, std::uint32_t nblk, std::uint32_t t, std::uint32_t nt,
                                      Flag& block_error) noexcept
{
  const std::uint64_t total = ferry::d2h::cursor_live(c) ? l.limit * a.cpre[a.n] : 0;
  for (std::uint64_t w = blk; w < total; w += nblk) {
    const gather_rows_item it = gather_rows_at(a, l, c, w, l.limit);
    if (it.from == nullptr) {
      if (t == 0) { block_error = 1; }
      continue;
    }
    copy_row(it.to, it.from, it.bytes, a.vec != 0, t, nt);
  }
}

/// Step 3 by thread 0 after the block barrier: the block's error note, its arrival, and the last block's commit.
FERRY_HD inline void gather_rows_arrive(const gather_rows_args& a, ferry::d2h::cursor c, std::uint32_t nblk,
                                        bool block_error, std::uint64_t rows, bool count_ok) noexcept
{
  if (block_error) { note_select_error(a.dst.state); }
  if (gather_join_arrive(a.dst.state, nblk)) { gather_rows_commit(a, c, rows, count_ok); }
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU body of block `blk` of `nblk` (`nt` threads) of a row batch's kernel: steps 1 and 3 here, step 2 by
/// `work(layout, cursor, block_error)` (every thread; the copy here, a record per row in reduce_rows_publish.cuh).
template <class Work>
__device__ __forceinline__ void rows_batch_block(const gather_rows_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                 std::uint32_t t, Work&& work)
{
  __shared__ int block_error;
  __shared__ std::uint64_t sums[ferry::d2h::detail::gather_max_entries + 1];
  if (t == 0) { block_error = 0; }
  bool count_ok = true;
  const std::uint64_t rows = select_items(a.sel, count_ok) * a.sel.rows_per_item();
  const rows_layout l = gather_rows_layout(a, rows, sums, t == 0);
  const ferry::d2h::cursor c = gather_rows_start(a, l, blk, t);
  __syncthreads();  // thread 0's sums before any placement
  work(l, c, block_error);
  __syncthreads();  // every store and error note of the block happen-before thread 0's arrival
  if (t == 0) { gather_rows_arrive(a, c, nblk, block_error != 0, rows, count_ok); }
}

/// The GPU body of gather_rows_publish's block `blk` of `nblk` (`nt` threads).
__device__ __forceinline__ void gather_rows_block(const gather_rows_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                  std::uint32_t t, std::uint32_t nt)
{
  rows_batch_block(a, blk, nblk, t, [&](const rows_layout& l, ferry::d2h::cursor c, int& block_error) {
    gather_rows_copy(a, l, c, blk, nblk, t, nt, block_error);
  });
}
#endif

/// The host backend's block `blk` of `nblk` (one thread) of a row batch's kernel: rows_batch_block's steps, step 2
/// by `work(layout, cursor, block_error)`.
template <class Work>
inline void rows_batch_block_host(const gather_rows_args& a, std::uint32_t blk, std::uint32_t nblk, Work&& work)
{
  bool count_ok = true;
  const std::uint64_t rows = select_items(a.sel, count_ok) * a.sel.rows_per_item();
  std::uint64_t sums[ferry::d2h::detail::gather_max_entries + 1];
  const rows_layout l = gather_rows_layout(a, rows, sums, true);
  const ferry::d2h::cursor c = gather_rows_start(a, l, blk, 0);
  bool block_error = false;
  work(l, c, block_error);
  gather_rows_arrive(a, c, nblk, block_error, rows, count_ok);
}

/// The host backend's gather_rows_publish block: the same rows, one memcpy each, then the arrival.
inline void gather_rows_block_host(const gather_rows_args& a, std::uint32_t blk, std::uint32_t nblk)
{
  rows_batch_block_host(a, blk, nblk, [&](const rows_layout& l, ferry::d2h::cursor c, bool& block_error) {
    gather_rows_copy(a, l, c, blk, nblk, 0, 1, block_error);
  });
}

}  // namespace ferry::kernels::d2h
