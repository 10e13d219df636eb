// SPDX-License-Identifier: Apache-2.0
// Body of the reduce_rows_publish kernel (channel::capture_reduced_deferred), shared by the GPU wrapper
// (reduce_rows_publish.cu) and the host backend's (reduce_rows_publish_host.cpp). ONE launch per flushed batch of
// reduced row entries sharing one selection and one reducer with a record per row (fp8_e4m3, topk): the row
// gather's order (gather_rows_publish.cuh, whose steps 1 and 3 it shares) with a record in place of a copy:
//   1. the item count, the layout (a replay's plan()'d items: rows_layout) and the cursor; block 0 writes the next
//      cursor (gather_rows_start);
//   2. work items blk, blk + nblk, ... over (entry i, row j), entry-major, each by the whole block (topk_record), or
//      by one warp for fp8 (fp8_record: warp w of block blk the items (blk x warps + w) + k x nblk x warps): the
//      source row from the selection (an invalid item is not read, its record not written, the block notes the
//      error), its record into entry i (gather_offset) at row j;
//   3. block barrier, then thread 0's arrival; the block that arrives last writes every size slot (rows x the
//      record's bytes, or selection_error_size for every entry) and, when rel.head_n > 0, releases
//      (gather_rows_arrive).
#pragma once

#include "../../detail/reduce_block.cuh"  // reduce_shared, fp8_record, topk_record
#include "../select/gather_rows_publish.cuh"  // rows_layout, rows_batch_block (steps 1 and 3), rows_view_of

#include <ferry/d2h/detail/kernel_args.hpp>

#include <cstdint>
#include <type_traits>  // integral_constant: the GPU body's reducer

namespace ferry::kernels::d2h {

/// Step 2 for block `blk` of `nblk` (every thread of block `b`): its (entry, row) records; thread 0 sets
/// `block_error` when one of them names an invalid item. `op` is a.r.op (on the GPU a compile-time constant).
template <class Blk, class Flag, class Op>
FERRY_HD void reduce_rows_records(const Blk& b, reduce_shared& sh, const gather_rows_args& a, const rows_layout& l,
                                  ferry::d2h::cursor c, std::uint32_t blk, std::uint32_t nblk, Flag& block_error,
                                  Op op)
{
  const std::uint64_t rows = l.limit;
  const std::uint64_t total = ferry::d2h::cursor_live(c) ? rows * a.n : 0;
  const std::uint64_t in_bytes = ferry::d2h::input_bytes(a.in);
  const bool fp8 = op == ferry::d2h::reduce_op::fp8_e4m3;  // a record per warp, else per block
  const std::uint32_t lane = fp8 ? b.t % Blk::lanes : b.t, per = fp8 ? b.nt / Blk::lanes : 1;
  for (std::uint64_t w = blk * per + (fp8 ? b.t / Blk::lanes : 0); w < total; w += nblk * per) {
    const auto i = static_cast<std::uint32_t>(w / rows);
    const std::uint64_t j = w - rows * i;
    const std::int64_t r = select_source_row(a.sel, a.n_rows, j, a.sel.rows_per_item());
    if (r < 0) {
      if (lane == 0) { block_error = 1; }
      continue;
    }
    const std::uint64_t width = a.width[i];
    const std::byte* row = a.src[i] + static_cast<std::uint64_t>(r) * width * in_bytes;
    std::byte* out = a.dst.ring + gather_offset(rows_view_of(a, l), c.phys, i) + j * a.row_bytes[i];
    if (fp8) {
      fp8_record(b, lane, row, width, a.in, a.row_bytes[i], out);
    } else {
      topk_record(b, sh, row, width, a.in, a.r.k, out);
    }
  }
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// The GPU body of block `blk` of `nblk` (`nt` threads): the row batch's steps (rows_batch_block), its records.
template <ferry::d2h::reduce_op Op>
__device__ __forceinline__ void reduce_rows_publish_block(const gather_rows_args& a, std::uint32_t blk,
                                                          std::uint32_t nblk, std::uint32_t t, std::uint32_t nt)
{
  __shared__ reduce_shared sh;
  rows_batch_block(a, blk, nblk, t, [&](const rows_layout& l, ferry::d2h::cursor c, int& block_error) {
    reduce_rows_records(gpu_block{t, nt}, sh, a, l, c, blk, nblk, block_error,
                        std::integral_constant<ferry::d2h::reduce_op, Op>{});
  });
}
#endif

/// The host backend's block `blk` of `nblk` (one thread): the same records, then the arrival.
inline void reduce_rows_publish_block_host(const gather_rows_args& a, std::uint32_t blk, std::uint32_t nblk)
{
  static thread_local reduce_shared sh;
  rows_batch_block_host(a, blk, nblk, [&](const rows_layout& l, ferry::d2h::cursor c, bool& block_error) {
    reduce_rows_records(host_block{}, sh, a, l, c, blk, nblk, block_error, a.r.op);
  });
}

}  // namespace ferry::kernels::d2h
