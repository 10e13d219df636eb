// SPDX-License-Identifier: Apache-2.0
// One record of a reducer (ferry/d2h/reducer.hpp) computed by a whole block (reduce_rows, kernels/d2h/reduce):
//   topk_record    the k largest elements, ties by the lowest indices: a filter by group maxima, else a radix
//                  select (topk_block.cuh);
//   fp8_record     by one warp (the block's warps take rows of their own): the row's amax (a warp max), then
//                  every code of x / scale;
//   mean_record    columns [c0, c1) of an item's record: a lane takes a 16-byte vector's columns, the block's row
//                  groups take rows (group g the rows j = g mod groups), each an f32 sum in row order; the groups'
//                  sums are added in group order and divided by the count (the host's one thread: every row in order);
//                  the request offsets of a last_token or window selection are staged in shared memory first;
//   stats_record   per column, Welford over every selected row in row order, and max |x|.
// Every thread of the block calls each function but fp8_record with the same arguments (its branches are
// block-uniform, so its barriers are met by all); every lane of a warp calls fp8_record with its row; `b` is a
// gpu_block or the host backend's host_block (block_ops.cuh).
#pragma once

#include "block_ops.cuh"  // host_block, gpu_block
#include "float_bits.cuh"
#include "reduce_shared.cuh"  // reduce_shared, the tile and batch sizes
#include "row_vec.cuh"        // vec16, vec_ok: fp8_record's rows read by vectors
#include "rows.cuh"           // select_source_row
#include "topk_block.cuh"     // topk_record

#include <ferry/d2h/reducer.hpp>
#include <ferry/d2h/row_selection.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::kernels::d2h {

/// The fp8 record of `row` by ONE warp (lane `lane` of Blk::lanes; no barrier, no shared memory, so the warps of a
/// block take rows of their own): the row's amax (each lane's, then the warp's max), its scale, then every code of
/// x / scale, zero-padded to `rec` bytes.
template <class Blk>
FERRY_HD void fp8_record(const Blk& b, std::uint32_t lane, const std::byte* row, std::uint64_t width,
                         ferry::d2h::reduce_input in, std::uint64_t rec, std::byte* out)
{
  constexpr std::uint32_t lanes = Blk::lanes;
  std::uint32_t local = 0;  // |x| as bits: the unsigned order of non-negative floats (NaN above +inf)
  bool by_vec = false;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  // A row of at most fp8_vec_regs vectors a lane, 16-byte aligned and of whole vectors, with 4-byte aligned codes:
  // read once into registers (one load per vector), then 4 codes per 4-byte store.
  const std::uint32_t pv = per_vec(in);
  const std::uint64_t nv = width / pv;
  by_vec = vec_ok(row, width, in) && nv <= std::uint64_t{fp8_vec_regs} * lanes &&
           (reinterpret_cast<std::uintptr_t>(out) & 3U) == 0;
  vec16 v[fp8_vec_regs];
  if (by_vec) {
#pragma unroll
    for (std::uint32_t r = 0; r < fp8_vec_regs; ++r) {
      const std::uint64_t i = lane + static_cast<std::uint64_t>(r) * lanes;
      if (i < nv) { v[r] = vec_at(row, i); }
    }
#pragma unroll
    for (std::uint32_t r = 0; r < fp8_vec_regs; ++r) {
      if (lane + static_cast<std::uint64_t>(r) * lanes < nv) {
        for_each_in_vec(v[r], in, [&](std::uint32_t, std::uint32_t bits) {
          const std::uint32_t a = bits_of_float(float_of(bits, in)) & 0x7fffffffU;
          local = a > local ? a : local;
        });
      }
    }
  }
#pragma unroll 8
#endif
  for (std::uint64_t c = lane; c < width && !by_vec; c += lanes) {
    const std::uint32_t a = bits_of_float(load_element(row, c, in)) & 0x7fffffffU;
    local = a > local ? a : local;
  }
  const float amax = float_of_bits(b.warp_max(local));
  const float scale = amax > 0.0F && amax <= 3.4028234663852886e38F ? amax / ferry::d2h::fp8_e4m3_max : 1.0F;
  if (lane == 0) { std::memcpy(out, &scale, 4); }
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  if (by_vec) {
#pragma unroll
    for (std::uint32_t r = 0; r < fp8_vec_regs; ++r) {
      const std::uint64_t i = lane + static_cast<std::uint64_t>(r) * lanes;
      if (i >= nv) { continue; }
      std::uint32_t word[2] = {0, 0};  // the vector's codes, 4 a word
      for_each_in_vec(v[r], in, [&](std::uint32_t e, std::uint32_t bits) {
        word[e >> 2] |= static_cast<std::uint32_t>(e4m3fn_of(float_of(bits, in) / scale)) << (8 * (e & 3U));
      });
      for (std::uint32_t q = 0; q < pv / 4; ++q) {
        *reinterpret_cast<std::uint32_t*>(out + 4 + i * pv + 4 * q) = word[q];
      }
    }
    return;  // width a multiple of 4: no padding
  }
#pragma unroll 8
#endif
  for (std::uint64_t c = lane; c < width; c += lanes) {
    out[4 + c] = static_cast<std::byte>(e4m3fn_of(load_element(row, c, in) / scale));
  }
  for (std::uint64_t c = width + lane; c + 4 < rec; c += lanes) { out[4 + c] = std::byte{0}; }
}

/// mean_record's rows on the GPU: one 16-byte vector of each of the `n` rows at p, p + stride, .. added into `acc`
/// in row order, mean_batch loads in flight (one pointer bumped a load, no 64-bit address kept per load); `In` a
/// constant, so that an element is one conversion. The host never calls it (its one thread adds every row in
/// mean_record).
template <ferry::d2h::reduce_input In>
FERRY_HD void mean_vec_rows(const std::byte* p, std::uint64_t stride, std::uint64_t n, float (&acc)[8])
{
  for (std::uint64_t k = 0; k < n; k += mean_batch) {
    vec16 v[mean_batch];
FERRY_UNROLL
    for (std::uint32_t u = 0; u < mean_batch; ++u) {
      if (k + u < n) {
        v[u] = vec_at(p, 0);
        p += stride;
      }
    }
FERRY_UNROLL
    for (std::uint32_t u = 0; u < mean_batch; ++u) {
      if (k + u < n) {
        for_each_in_vec(v[u], In, [&](std::uint32_t e, std::uint32_t bits) { acc[e] += float_of(bits, In); });
      }
    }
  }
}

/// Columns [c0, c1) (at most mean_chunk_cols) of the mean record of item `item` (rows item x per .. + per - 1 of
/// the selection), into `out`; chunk 0 writes the count. False when the item is invalid (nothing written, no row
/// read). The host's one thread adds every row in order. On the GPU the item's rows follow its first
/// (select_item_first); a lane takes per_vec(in) columns (one 16-byte vector of a row when vec_ok, else elements)
/// and the threads of one column range form `groups` row groups: group g adds the rows g, g + groups, .. in order,
/// mean_batch loads in flight; then the groups' sums are added in group order.
template <class Blk>
FERRY_HD bool mean_record(const Blk& b, reduce_shared& sh, const ferry::d2h::row_selection& sel, const std::byte* src,
                          std::uint64_t n_rows, std::uint64_t width, ferry::d2h::reduce_input in, std::uint64_t item,
                          std::uint64_t per, std::uint64_t c0, std::uint64_t c1, std::byte* out)
{
  constexpr std::uint64_t cols = ferry::d2h::mean_chunk_cols;
  const std::uint64_t ib = ferry::d2h::input_bytes(in), row_bytes = width * ib;
  if constexpr (Blk::lanes == 1) {  // the host's one thread: every row in order
    float acc[cols] = {};
    for (std::uint64_t j = 0; j < per; ++j) {
      const std::int64_t r = select_source_row(sel, n_rows, item * per + j, per);
      if (r < 0) { return false; }
      for (std::uint64_t c = c0; c < c1; ++c) { acc[c - c0] += load_element(src + r * row_bytes, c, in); }
    }
    for (std::uint64_t c = c0; c < c1; ++c) {
      const float m = acc[c - c0] / static_cast<float>(per);
      std::memcpy(out + 4 * c, &m, 4);
    }
  } else {
    // Every thread reads the same first row: an invalid item returns false in the whole block, after one barrier
    // and before any scratch but the offsets (the unit before ended with a barrier). A selection of requests whose
    // offsets fit the block has them staged in `hist`, loaded beside the item's request id: the first row waits for
    // one global load, not a request id and then its offsets.
    std::int64_t first;
    if (sel.form != ferry::d2h::selection_form::rows && sel.n_requests < b.nt) {
      if (b.t <= sel.n_requests) {
        sh.hist[b.t] = static_cast<std::uint32_t>(load_evict_last(sel.query_start_loc + b.t));
      }
      const std::int32_t q = select_request(sel, item);
      b.sync();
      first = select_request_row(sel, n_rows, item * per, per, q, [&](std::uint32_t r) {
        return static_cast<std::int64_t>(static_cast<std::int32_t>(sh.hist[r]));
      });
    } else {
      first = select_item_first(sel, n_rows, item, per);
    }
    if (first < 0) {
      b.sync();  // the next unit's offsets are stored after every thread read these
      return false;
    }
    const std::uint32_t pv = per_vec(in), row_lanes = static_cast<std::uint32_t>(cols) / pv;
    const std::uint32_t groups = b.nt / row_lanes < mean_groups ? b.nt / row_lanes : mean_groups;
    const std::uint32_t g = b.t / row_lanes;
    const std::uint64_t cl = c0 + (b.t % row_lanes) * pv;  // this thread's first column
    const bool live = g < groups && cl < c1;
    const std::byte* rows = src + static_cast<std::uint64_t>(first) * row_bytes;
    float acc[8] = {};
    if (live && vec_ok(src, width, in)) {
      using ferry::d2h::reduce_input;
      const std::byte* p = rows + static_cast<std::uint64_t>(g) * row_bytes + cl * ib;  // row g's vector
      const std::uint64_t n = g < per ? (per - g + groups - 1) / groups : 0;  // rows g, g + groups, ..
      const std::uint64_t stride = groups * row_bytes;
      switch (in) {  // the element type out of the loop: one conversion an element
        case reduce_input::f32: mean_vec_rows<reduce_input::f32>(p, stride, n, acc); break;
        case reduce_input::f16: mean_vec_rows<reduce_input::f16>(p, stride, n, acc); break;
        default: mean_vec_rows<reduce_input::bf16>(p, stride, n, acc);
      }
    } else if (live) {
      for (std::uint64_t i = g; i < per; i += groups) {
        const std::byte* row = rows + i * row_bytes;
FERRY_UNROLL
        for (std::uint32_t e = 0; e < 8; ++e) {  // constant indices: acc stays in registers
          if (e < pv && cl + e < c1) { acc[e] += load_element(row, cl + e, in); }
        }
      }
    }
    if (live) {
FERRY_UNROLL
      for (std::uint32_t e = 0; e < 8; ++e) {
        if (e < pv) { sh.part[g * cols + (cl - c0) + e] = acc[e]; }
      }
    }
    b.sync();
    for (std::uint64_t c = c0 + b.t; c < c1; c += b.nt) {
      float sum = 0.0F;
      for (std::uint32_t x = 0; x < groups; ++x) { sum += sh.part[x * cols + (c - c0)]; }
      const float m = sum / static_cast<float>(per);
      std::memcpy(out + 4 * c, &m, 4);
    }
  }
  if (b.t == 0 && c0 == 0) {
    const auto n = static_cast<std::uint32_t>(per);
    std::memcpy(out + 4 * width, &n, 4);
  }
  b.sync();  // the next unit reuses the sums
  return true;
}

/// The stats record over the selection's first `rows` rows: false when one of them is invalid (nothing read).
template <class Blk>
FERRY_HD bool stats_record(const Blk& b, const ferry::d2h::row_selection& sel, const std::byte* src,
                           std::uint64_t n_rows, std::uint64_t width, ferry::d2h::reduce_input in, std::uint64_t rows,
                           std::uint64_t per, std::byte* out)
{
  const std::uint64_t row_bytes = width * input_bytes(in);
  for (std::uint64_t j = 0; j < rows; ++j) {
    if (select_source_row(sel, n_rows, j, per) < 0) { return false; }
  }
  for (std::uint64_t c = b.t; c < width; c += b.nt) {
    float mean = 0.0F;
    float m2 = 0.0F;
    std::uint32_t maxabs = 0;
    for (std::uint64_t j = 0; j < rows; ++j) {
      const auto r = static_cast<std::uint64_t>(select_source_row(sel, n_rows, j, per));
      const float x = load_element(src + r * row_bytes, c, in);
      const float d = x - mean;
      mean += d / static_cast<float>(j + 1);
      m2 += d * (x - mean);
      const std::uint32_t a = bits_of_float(x) & 0x7fffffffU;
      maxabs = a > maxabs ? a : maxabs;
    }
    const float mx = float_of_bits(maxabs);
    std::memcpy(out + 4 * c, &mean, 4);
    std::memcpy(out + 4 * (width + c), &m2, 4);
    std::memcpy(out + 4 * (2 * width + c), &mx, 4);
  }
  if (b.t == 0) {
    const auto n = static_cast<std::uint32_t>(rows);
    std::memcpy(out + 12 * width, &n, 4);
  }
  return true;
}

}  // namespace ferry::kernels::d2h
