// SPDX-License-Identifier: Apache-2.0
// One record of a reducer (ferry/d2h/reducer.hpp) computed by a whole block (reduce_rows, kernels/d2h/reduce):
//   topk_record    radix select of the k-th largest order_key (8-bit digits: 2 passes for 16-bit types, 4 for
//                  f32); when the k-th value has more equal elements than places left, a second radix select over
//                  ~index among those ties takes the lowest indices; the k winners are collected, then
//                  bitonic-sorted in shared memory (value descending, index ascending);
//   fp8_record     the row's amax (a block max), then every code of x / scale;
//   mean_record    columns [c0, c1) of an item's record: a warp's lanes take columns, the block's warps take rows
//                  (warp w the rows j = w mod warps), each an f32 sum in row order; the warps' sums are added in
//                  warp order and divided by the count (the host's one-thread block: every row in order);
//   stats_record   per column, Welford over every selected row in row order, and max |x|.
// Every thread of the block calls each function with the same arguments (its branches are block-uniform, so
// its barriers are met by all); `b` is a gpu_block or the host backend's host_block (block_ops.cuh).
#pragma once

#include "block_ops.cuh"  // host_block, gpu_block
#include "float_bits.cuh"
#include "rows.cuh"  // select_source_row

#include <ferry/d2h/reducer.hpp>
#include <ferry/d2h/row_selection.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::kernels::d2h {

inline constexpr std::uint32_t reduce_warps = 8;  ///< of a reduce_rows block (256 threads): mean_record's row groups
inline constexpr std::uint32_t mean_tile_rows = 256;  ///< mean_record's rows resolved at a time (a block's threads)

/// The block's shared scratch (about 15 KiB).
struct reduce_shared {
  float part[reduce_warps * ferry::d2h::mean_chunk_cols];  ///< mean_record: each warp's column sums
  std::int64_t rows[mean_tile_rows];                         ///< mean_record: the tile's source rows
  std::uint32_t hist[256];
  std::uint32_t key[ferry::d2h::topk_max];
  std::int32_t idx[ferry::d2h::topk_max];
  std::uint32_t prefix;
  std::uint32_t krem;
  std::uint32_t n_eq;
  std::uint32_t n_taken;
  std::uint32_t amax;
  std::uint32_t bad;
};

/// Radix select over the elements of [0, width) that `key_of(c, key)` admits: afterwards sh.prefix is the
/// `want`-th largest key (`bits` wide), sh.krem how many elements equal to it are among the `want` largest and
/// sh.n_eq how many equal it. Ends with a barrier.
template <class Blk, class KeyOf>
FERRY_HD void radix_select(const Blk& b, reduce_shared& sh, std::uint64_t width, std::uint32_t bits, std::uint32_t want,
                           KeyOf key_of)
{
  if (b.t == 0) {
    sh.prefix = 0;
    sh.krem = want;
  }
  std::uint32_t mask = 0;
  for (int shift = static_cast<int>(bits) - 8; shift >= 0; shift -= 8) {
    for (std::uint32_t i = b.t; i < 256; i += b.nt) { sh.hist[i] = 0; }
    b.sync();
    const std::uint32_t prefix = sh.prefix;
    b.histogram(sh.hist, width, [&](std::uint64_t c) {
      std::uint32_t key = 0;
      return key_of(c, key) && (key & mask) == prefix ? (key >> shift) & 255U : 256U;
    });
    b.sync();
    if (b.t == 0) {  // the digit where the count from the top reaches what is left to take
      std::uint32_t above = 0;
      for (int d = 255; d >= 0; --d) {
        if (above + sh.hist[d] >= sh.krem) {
          sh.krem -= above;
          sh.n_eq = sh.hist[d];
          sh.prefix |= static_cast<std::uint32_t>(d) << shift;
          break;
        }
        above += sh.hist[d];
      }
    }
    mask |= 255U << shift;
    b.sync();
  }
}

/// The top-k record of `row` (k values as f32, then k int32 indices) into `out` (4-byte aligned).
template <class Blk>
FERRY_HD void topk_record(const Blk& b, reduce_shared& sh, const std::byte* row, std::uint64_t width,
                          ferry::d2h::reduce_input in, std::uint32_t k, std::byte* out)
{
  auto key_at = [&](std::uint64_t c) { return order_key(element_bits(row, c, in), in); };
  const std::uint32_t bits = in == ferry::d2h::reduce_input::f32 ? 32U : 16U;
  radix_select(b, sh, width, bits, k, [&](std::uint64_t c, std::uint32_t& key) {
    key = key_at(c);
    return true;
  });
  const std::uint32_t kth = sh.prefix;
  const std::uint32_t need = sh.krem;
  const bool every_tie = need == sh.n_eq;
  b.sync();  // every thread read the first select's result before the second one starts over
  std::uint32_t last_index = 0;  // ~index of the last tie taken: the ties of ~index >= it, the lowest indices
  if (!every_tie) {
    radix_select(b, sh, width, 32U, need, [&](std::uint64_t c, std::uint32_t& key) {
      key = ~static_cast<std::uint32_t>(c);
      return key_at(c) == kth;
    });
    last_index = sh.prefix;
    b.sync();
  }
  if (b.t == 0) { sh.n_taken = 0; }
  b.sync();
  for (std::uint64_t c = b.t; c < width; c += b.nt) {
    const std::uint32_t key = key_at(c);
    if (key > kth || (key == kth && (every_tie || ~static_cast<std::uint32_t>(c) >= last_index))) {
      const std::uint32_t slot = b.add(&sh.n_taken, 1);
      sh.key[slot] = key;
      sh.idx[slot] = static_cast<std::int32_t>(c);
    }
  }
  std::uint32_t n2 = 1;
  while (n2 < k) { n2 <<= 1; }
  for (std::uint32_t i = k + b.t; i < n2; i += b.nt) {  // padding: after every element
    sh.key[i] = 0;
    sh.idx[i] = 0x7fffffff;
  }
  b.sync();
  auto before = [&](std::uint32_t x, std::uint32_t y) {  // x goes first: larger value, or equal and lower index
    return sh.key[x] > sh.key[y] || (sh.key[x] == sh.key[y] && sh.idx[x] < sh.idx[y]);
  };
  for (std::uint32_t size = 2; size <= n2; size <<= 1) {  // bitonic sort into `before` order
    for (std::uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (std::uint32_t i = b.t; i < n2; i += b.nt) {
        const std::uint32_t j = i ^ stride;
        if (j > i && ((i & size) == 0 ? before(j, i) : before(i, j))) {
          const std::uint32_t kk = sh.key[i];
          const std::int32_t ii = sh.idx[i];
          sh.key[i] = sh.key[j];
          sh.idx[i] = sh.idx[j];
          sh.key[j] = kk;
          sh.idx[j] = ii;
        }
      }
      b.sync();
    }
  }
  for (std::uint32_t i = b.t; i < k; i += b.nt) {
    const float v = float_of(bits_of_key(sh.key[i], in), in);
    std::memcpy(out + 4ULL * i, &v, 4);
    std::memcpy(out + 4ULL * (k + i), &sh.idx[i], 4);
  }
  b.sync();  // the next record reuses the scratch
}

/// The fp8 record of `row`: its scale, then its codes, zero-padded to `rec` bytes.
template <class Blk>
FERRY_HD void fp8_record(const Blk& b, reduce_shared& sh, const std::byte* row, std::uint64_t width,
                         ferry::d2h::reduce_input in, std::uint64_t rec, std::byte* out)
{
  if (b.t == 0) { sh.amax = 0; }
  b.sync();
  std::uint32_t local = 0;  // |x| as bits: the unsigned order of non-negative floats (NaN above +inf)
  for (std::uint64_t c = b.t; c < width; c += b.nt) {
    const std::uint32_t a = bits_of_float(load_element(row, c, in)) & 0x7fffffffU;
    local = a > local ? a : local;
  }
  b.max(&sh.amax, local);
  b.sync();
  const float amax = float_of_bits(sh.amax);
  const float scale = amax > 0.0F && amax <= 3.4028234663852886e38F ? amax / ferry::d2h::fp8_e4m3_max : 1.0F;
  if (b.t == 0) { std::memcpy(out, &scale, 4); }
  for (std::uint64_t c = b.t; c < width; c += b.nt) {
    out[4 + c] = static_cast<std::byte>(e4m3fn_of(load_element(row, c, in) / scale));
  }
  for (std::uint64_t c = width + b.t; c + 4 < rec; c += b.nt) { out[4 + c] = std::byte{0}; }
  b.sync();  // the next record resets amax
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
#pragma unroll 4
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
