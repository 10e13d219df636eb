// SPDX-License-Identifier: Apache-2.0
// One record of a reducer (ferry/d2h/reducer.hpp) computed by a whole block (reduce_rows, kernels/d2h/reduce):
//   topk_record    radix select of the k-th largest element, ties by the lowest indices (topk_block.cuh);
//   fp8_record     by one warp (the block's warps take rows of their own): the row's amax (a warp max), then
//                  every code of x / scale;
//   mean_record    columns [c0, c1) of an item's record: a warp's lanes take columns, the block's warps take rows
//                  (warp w the rows j = w mod warps), each an f32 sum in row order; the warps' sums are added in
//                  warp order and divided by the count (the host's one-thread block: every row in order);
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
        for (std::uint32_t e = 0; e < pv; ++e) {
          const std::uint32_t a = bits_of_float(float_of(vec_bits(v[r], e, in), in)) & 0x7fffffffU;
          local = a > local ? a : local;
        }
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
      for (std::uint32_t q = 0; q < pv / 4; ++q) {
        std::uint32_t word = 0;
        for (std::uint32_t e = 0; e < 4; ++e) {
          const float x = float_of(vec_bits(v[r], 4 * q + e, in), in);
          word |= static_cast<std::uint32_t>(e4m3fn_of(x / scale)) << (8 * e);
        }
        *reinterpret_cast<std::uint32_t*>(out + 4 + i * pv + 4 * q) = word;
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

/// Columns [c0, c1) (at most mean_chunk_cols) of the mean record of item `item` (rows item x per .. + per - 1 of
/// the selection), into `out`; chunk 0 writes the count. False when one of its rows is invalid (nothing written, no
/// invalid row read). The rows go by tiles of the block's threads: each thread resolves one row of the tile once
/// (sh.rows), then a warp's lanes take columns (Blk::lanes apart, in registers) and the warps take the tile's rows
/// w, w + warps, ..: each warp's sum of a column adds its rows in the same order whatever the tile size.
template <class Blk>
FERRY_HD bool mean_record(const Blk& b, reduce_shared& sh, const ferry::d2h::row_selection& sel, const std::byte* src,
                          std::uint64_t n_rows, std::uint64_t width, ferry::d2h::reduce_input in, std::uint64_t item,
                          std::uint64_t per, std::uint64_t c0, std::uint64_t c1, std::byte* out)
{
  constexpr std::uint32_t lanes = Blk::lanes;
  constexpr std::uint32_t per_lane = static_cast<std::uint32_t>(ferry::d2h::mean_chunk_cols) / lanes;
  const std::uint64_t row_bytes = width * input_bytes(in);
  const std::uint32_t warps = b.nt / lanes < reduce_warps ? b.nt / lanes : reduce_warps;
  const std::uint32_t lane = b.t % lanes, w = b.t / lanes;
  const std::uint32_t tile = b.nt < mean_tile_rows ? b.nt : mean_tile_rows;
  float acc[per_lane];
  for (std::uint32_t q = 0; q < per_lane; ++q) { acc[q] = 0.0F; }
  if (b.t == 0) { sh.bad = 0; }
  b.sync();
  for (std::uint64_t j0 = 0; j0 < per; j0 += tile) {
    const std::uint64_t n = per - j0 < tile ? per - j0 : tile;
    if (b.t < n) {
      const std::int64_t r = select_source_row(sel, n_rows, item * per + j0 + b.t, per);
      sh.rows[b.t] = r;
      if (r < 0) { b.max(&sh.bad, 1U); }
    }
    b.sync();
    if (sh.bad == 0 && w < warps) {  // no row of an item with an invalid one is read
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#pragma unroll 8
#endif
      for (std::uint64_t i = w; i < n; i += warps) {
        const std::byte* row = src + static_cast<std::uint64_t>(sh.rows[i]) * row_bytes;
        for (std::uint32_t q = 0; q < per_lane; ++q) {
          const std::uint64_t c = c0 + lane + static_cast<std::uint64_t>(q) * lanes;
          if (c < c1) { acc[q] += load_element(row, c, in); }
        }
      }
    }
    b.sync();  // every warp read the tile's rows (and the flag) before the next tile's
  }
  const bool bad = sh.bad != 0;
  if (bad) {
    b.sync();  // every thread read the flag before a next unit resets it
    return false;
  }
  if (w < warps) {
    for (std::uint32_t q = 0; q < per_lane; ++q) {
      const std::uint64_t c = c0 + lane + static_cast<std::uint64_t>(q) * lanes;
      if (c < c1) { sh.part[w * ferry::d2h::mean_chunk_cols + (c - c0)] = acc[q]; }
    }
  }
  b.sync();
  for (std::uint64_t c = c0 + b.t; c < c1; c += b.nt) {
    float sum = 0.0F;
    for (std::uint32_t x = 0; x < warps; ++x) { sum += sh.part[x * ferry::d2h::mean_chunk_cols + (c - c0)]; }
    const float m = sum / static_cast<float>(per);
    std::memcpy(out + 4 * c, &m, 4);
  }
  if (b.t == 0 && c0 == 0) {
    const auto n = static_cast<std::uint32_t>(per);
    std::memcpy(out + 4 * width, &n, 4);
  }
  b.sync();  // the next unit reuses the sums, the rows and the flag
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
