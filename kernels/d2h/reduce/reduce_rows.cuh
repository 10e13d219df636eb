// SPDX-License-Identifier: Apache-2.0
// Body of the reduce_rows kernel (channel::capture_reduced), shared by the GPU wrapper (reduce_rows.cu) and the
// host backend's (reduce_rows_host.cpp). One launch per reduced entry: the records of a reducer
// (ferry/d2h/reducer.hpp) over the rows a row_selection names, into one dynamic entry, one record per block at a
// time (kernels/detail/reduce_block.cuh). The order of every block is select_rows' (select_rows.cuh):
//   1. the item count (CPU-known, or the GPU-resolved *device_count, refused above max_count), the entry's place
//      and the cursor slot[parity] (one load; cursor_unplanned: a graph launch no plan() armed stores nothing);
//   2. work units blk, blk + nblk, ... (ferry::d2h::work_units): topk a record per selected row, mean
//      mean_chunk_cols columns of a record per item, stats one record for the entry; fp8 a record per selected row
//      by one warp (warp w of block blk the rows (blk x warps + w) + k x nblk x warps); a unit whose rows name an
//      invalid item reads nothing and writes nothing, and the block notes the error;
//   3. the commit: the entry's size slot (records x record_bytes, or selection_error_size) and the next cursor, from
//      the cursor value read in step 1. A launch that reads at most reduce_threads items (first_block_commits: a
//      step's requests, a few hundred rows) has no join: block 0's threads check every item the launch reads
//      (items_valid, the check the reading blocks make), AND it in one barrier and its thread 0 commits; the
//      other blocks only write their records. A larger launch joins: block barrier, then thread 0 arrives at the
//      join counter (entry_arrive, as select_rows: its error in the count), and the last block commits.
// The entry's release is a later kernel (the release chain): the kernel boundary joins every block's stores.
// Captured into a graph (reduce_args::planned), a replay whose plan() gave forward_meta::selected places the entry
// with exactly that many items (row_reserved of records_per_item x record_bytes, as plan() placed it), writes at
// most those records and reports its true size (above the plan: size_overflow at the drain). A stats entry's one
// record does not depend on the items: it keeps its captured reservation (the producer does not set `planned`).
#pragma once

#include "../../detail/reduce_block.cuh"  // the records
#include "../../detail/rows.cuh"          // select_items, select_source_row, entry_arrive

#include <ferry/d2h/detail/kernel_args.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>  // integral_constant: the GPU body's reducer

namespace ferry::kernels::d2h {

using ferry::d2h::detail::reduce_args;

/// Step 1 of every block: the item count, the entry's records and place, and where it starts (`dst` null: a launch
/// no plan() armed).
struct reduce_start {
  ferry::d2h::ring_ref at;
  std::uint64_t per_item{1};
  std::uint64_t items{0};
  std::uint64_t records{0};
  std::uint64_t limit{0};  ///< the records this launch writes: every one, or at most the planned ones
  std::uint64_t chunks{1};  ///< work units per record (mean: column chunks)
  std::uint64_t rec{0};
  bool count_ok{true};
  ferry::d2h::cursor c{};  ///< the cursor slot's value, read once (the commit's too)
  std::byte* dst{nullptr};
};
FERRY_HD inline reduce_start reduce_start_of(const reduce_args& a) noexcept
{
  reduce_start s;
  s.per_item = a.sel.rows_per_item();
  s.items = select_items(a.sel, s.count_ok);
  s.records = ferry::d2h::records_of(a.r, s.items, s.per_item);
  s.rec = ferry::d2h::record_bytes(a.r, a.width);
  s.chunks = ferry::d2h::work_units(a.r, 1, a.width);
  s.at = a.dst;
  s.limit = s.records;
  const std::uint64_t planned = a.planned != 0 ? a.dst.state->planned_items : ferry::d2h::no_planned_items;
  if (planned != ferry::d2h::no_planned_items) {
    const std::uint64_t per_rec = ferry::d2h::records_per_item(a.r, s.per_item);
    s.at.reserved = ferry::d2h::detail::row_reserved(planned, per_rec, s.rec);
    s.limit = s.records < planned * per_rec ? s.records : planned * per_rec;
  }
  s.c = s.at.load();
  s.dst = ferry::d2h::cursor_live(s.c) ? s.at.ring + s.at.offset(s.c) : nullptr;
  return s;
}

/// The items the launch reads (none when it writes nothing): a mean's record is an item, stats' one record reads
/// every item, a top-k or fp8 record is a row (an item's rows are consecutive records).
FERRY_HD inline std::uint64_t items_read(const reduce_args& a, const reduce_start& s) noexcept
{
  if (s.dst == nullptr) { return 0; }
  switch (a.r.op) {
    case ferry::d2h::reduce_op::mean: return s.limit;
    case ferry::d2h::reduce_op::stats: return s.items;
    default: return (s.limit + s.per_item - 1) / s.per_item;
  }
}

/// Step 3's rule: block 0 commits without a join when the launch reads at most reduce_threads items (its threads
/// check them in one pass on the GPU).
FERRY_HD inline bool first_block_commits(const reduce_args& a, const reduce_start& s) noexcept
{
  return items_read(a, s) <= ferry::d2h::detail::reduce_threads;
}

/// Whether the items `from`, `from + step`, .. of those the launch reads are valid (select_item_first: the checks
/// are of the item), and a GPU-resolved count was taken (on the GPU, one item a thread of block 0).
FERRY_HD inline bool items_valid(const reduce_args& a, const reduce_start& s, std::uint64_t from,
                                 std::uint64_t step) noexcept
{
  bool ok = s.count_ok;
  for (std::uint64_t i = from, n = items_read(a, s); i < n; i += step) {
    ok &= select_item_first(a.sel, a.n_rows, i, s.per_item) >= 0;
  }
  return ok;
}

/// Step 2 for block `blk` of `nblk`, by every thread of the block (`b`): its work units; thread 0 sets
/// `block_error` when one of them names an invalid item. `op` is a.r.op: on the GPU a compile-time constant (an
/// integral_constant), so that a kernel holds its own reducer's body only.
template <class Blk, class Flag, class Op>
FERRY_HD void reduce_records(const Blk& b, reduce_shared& sh, const reduce_args& a, const reduce_start& s,
                             std::uint32_t blk, std::uint32_t nblk, Flag& block_error, Op op)
{
  const std::uint64_t row_bytes = a.width * ferry::d2h::input_bytes(a.input);
  if (op == ferry::d2h::reduce_op::fp8_e4m3) {  // a record per warp: the block's warps take rows of their own
    const std::uint32_t lane = b.t % Blk::lanes, warps = b.nt / Blk::lanes;
    for (std::uint64_t g = blk * warps + b.t / Blk::lanes; g < s.limit && s.dst != nullptr; g += nblk * warps) {
      const std::int64_t r = select_source_row(a.sel, a.n_rows, g, s.per_item);
      if (r < 0) {
        if (lane == 0) { block_error = 1; }
        continue;
      }
      fp8_record(b, lane, a.src + static_cast<std::uint64_t>(r) * row_bytes, a.width, a.input, s.rec,
                 s.dst + g * s.rec);
    }
  } else {  // a record (a mean: a column chunk of one) per block
    for (std::uint64_t u = blk; u < s.limit * s.chunks && s.dst != nullptr; u += nblk) {
      const std::uint64_t g = u / s.chunks;  // the record
      std::byte* out = s.dst + g * s.rec;
      bool ok = true;
      switch (static_cast<ferry::d2h::reduce_op>(op)) {
        case ferry::d2h::reduce_op::mean: {
          constexpr std::uint64_t cols = ferry::d2h::mean_chunk_cols;
          const std::uint64_t c0 = (u % s.chunks) * cols;
          const std::uint64_t c1 = c0 + cols < a.width ? c0 + cols : a.width;
          ok = mean_record(b, sh, a.sel, a.src, a.n_rows, a.width, a.input, g, s.per_item, c0, c1, out);
          break;
        }
        case ferry::d2h::reduce_op::stats:
          ok = stats_record(b, a.sel, a.src, a.n_rows, a.width, a.input, s.items * s.per_item, s.per_item, out);
          break;
        default: {
          const std::int64_t r = select_source_row(a.sel, a.n_rows, g, s.per_item);
          ok = r >= 0;
          if (!ok) { break; }
          const std::byte* row = a.src + static_cast<std::uint64_t>(r) * row_bytes;
          topk_record(b, sh, row, a.width, a.input, a.r.k, out);
        }
      }
      if (!ok && b.t == 0) { block_error = 1; }
    }
  }
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU body of block `blk` of `nblk` (`nt` threads), reducer Op.
template <ferry::d2h::reduce_op Op>
__device__ __forceinline__ void reduce_rows_block(const reduce_args& a, std::uint32_t blk, std::uint32_t nblk,
                                                  std::uint32_t t, std::uint32_t nt)
{
  __shared__ int block_error;
  __shared__ reduce_scratch<Op> scratch;  // what Op's records touch
  auto& sh = *reinterpret_cast<reduce_shared*>(scratch.bytes);
  if (t == 0) { block_error = 0; }
  const reduce_start s = reduce_start_of(a);
  const gpu_block b{t, nt};
  __syncthreads();
  reduce_records(b, sh, a, s, blk, nblk, block_error, std::integral_constant<ferry::d2h::reduce_op, Op>{});
  if (first_block_commits(a, s)) {  // block-uniform
    if (blk != 0) { return; }
    const bool ok = __syncthreads_and(items_valid(a, s, t, nt) ? 1 : 0) != 0;
    if (t == 0) { s.at.commit(s.c, ok ? s.records * s.rec : ferry::d2h::selection_error_size); }
    return;
  }
  __syncthreads();  // every store and every error note of the block happen-before thread 0's arrival
  if (t == 0) { entry_arrive(s.at, s.c, nblk, block_error != 0, s.count_ok, s.records * s.rec); }
}
#endif

/// The host backend's block `blk` of `nblk` (one thread): the same records, then the same commit.
inline void reduce_rows_block_host(const reduce_args& a, std::uint32_t blk, std::uint32_t nblk)
{
  const reduce_start s = reduce_start_of(a);
  static thread_local reduce_shared sh;
  bool block_error = false;
  reduce_records(host_block{}, sh, a, s, blk, nblk, block_error, a.r.op);
  if (first_block_commits(a, s)) {
    if (blk == 0) { s.at.commit(s.c, items_valid(a, s, 0, 1) ? s.records * s.rec : ferry::d2h::selection_error_size); }
    return;
  }
  entry_arrive(s.at, s.c, nblk, block_error, s.count_ok, s.records * s.rec);
}

}  // namespace ferry::kernels::d2h
