// SPDX-License-Identifier: Apache-2.0
// reducer: a function of the selected rows that an entry holds instead of the rows (channel::capture_reduced).
// The reduce_rows kernel (kernels/d2h/reduce) runs it on the GPU, inside the capture, eager and in graphs, and the
// entry is published like any row entry: a dynamic entry of fixed-size records (entry_view::row_bytes() = the
// record's bytes, rows() = its records). Four reducers, over rows of `width` elements of f32, f16 or bf16:
//   topk(k)    one record per selected row: the k largest values as f32 (exact for every input type), then their
//              int32 column indices; ordered by value, descending; among equal values the lower index first
//              (NaN above every number). k in [1, min(width, topk_max)].
//   fp8_e4m3   one record per selected row: its scale (f32: amax / 448, or 1 for a row of zeros), then the row's
//              float8_e4m3fn codes of x / scale (torch's cast: round to nearest even, |x / scale| >= 464 -> NaN),
//              zero-padded to a 4-byte multiple.
//   mean       one record per selected item (a window: its rows; last_token / rows: one row): the f32 mean per
//              column (f32 sums: on the GPU eight in row order over rows j mod 8, added in order; on the host one
//              in row order), then the rows it averaged (uint32). Records of one request
//              from several steps combine as sum(mean * count) / sum(count).
//   stats      one record per entry, over every selected row: per column the mean, M2 (the sum of squared
//              deviations: variance = M2 / count) and max |x| (f32, Welford in row order), then the count.
// record_fields() names each part of a record (what sinks and readers decode). Device-safe: no fmt, no error.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ferry::d2h {

enum class reduce_op : std::uint32_t { topk, fp8_e4m3, mean, stats };
/// The element types a reducer reads.
enum class reduce_input : std::uint32_t { f32, f16, bf16 };

/// The largest k of topk (the kernel sorts its k candidates in shared memory).
inline constexpr std::uint32_t topk_max = 1024;
/// float8_e4m3fn's largest finite value: a row's amax maps to it.
inline constexpr float fp8_e4m3_max = 448.0F;

struct reducer {
  reduce_op op{reduce_op::fp8_e4m3};
  std::uint32_t k{0};  ///< topk: values per row
  friend constexpr bool operator==(const reducer&, const reducer&) = default;

  static constexpr reducer topk(std::uint32_t k) noexcept { return {reduce_op::topk, k}; }
  static constexpr reducer fp8_e4m3() noexcept { return {reduce_op::fp8_e4m3, 0}; }
  static constexpr reducer mean() noexcept { return {reduce_op::mean, 0}; }
  static constexpr reducer stats() noexcept { return {reduce_op::stats, 0}; }
};

/// Bytes of one element of `in`.
[[nodiscard]] constexpr std::uint32_t input_bytes(reduce_input in) noexcept { return in == reduce_input::f32 ? 4 : 2; }

/// Bytes of one record of `r` over rows of `width` elements (a multiple of 4).
[[nodiscard]] constexpr std::uint64_t record_bytes(const reducer& r, std::uint64_t width) noexcept
{
  switch (r.op) {
    case reduce_op::topk: return 8ULL * r.k;
    case reduce_op::fp8_e4m3: return 4 + ((width + 3) & ~std::uint64_t{3});
    case reduce_op::mean: return 4 * width + 4;
    default: return 12 * width + 4;
  }
}

/// Records per selected item of `per_item` rows: one per row (topk, fp8), one per item (mean); 0 for stats,
/// whose one record does not depend on the items.
[[nodiscard]] constexpr std::uint64_t records_per_item(const reducer& r, std::uint64_t per_item) noexcept
{
  return r.op == reduce_op::stats ? 0 : r.op == reduce_op::mean ? 1 : per_item;
}

/// Whether `r` makes one record per selected row (topk, fp8): the reducers a deferred batch takes
/// (capture_reduced_deferred: one reduce_rows_publish launch per batch).
[[nodiscard]] constexpr bool record_per_row(const reducer& r) noexcept
{
  return r.op == reduce_op::topk || r.op == reduce_op::fp8_e4m3;
}

/// The records of an entry of `items` items of `per_item` rows.
[[nodiscard]] constexpr std::uint64_t records_of(const reducer& r, std::uint64_t items, std::uint64_t per_item) noexcept
{
  return r.op == reduce_op::stats ? 1 : items * records_per_item(r, per_item);
}

/// Columns of a mean record one block computes at a time (8 lanes of 16-byte bf16 vectors, 16 of f32): a record of
/// `width` columns is mean_chunks(width) work units, so a few requests' means still spread over the device (16
/// requests of 1024 columns: 256 blocks; kernels/detail/reduce_block.cuh).
inline constexpr std::uint64_t mean_chunk_cols = 64;
[[nodiscard]] constexpr std::uint64_t mean_chunks(std::uint64_t width) noexcept
{
  return width == 0 ? 1 : (width + mean_chunk_cols - 1) / mean_chunk_cols;
}

/// The work units of `records` records of rows of `width` elements (the reduce_rows grid's loop, and its size):
/// a record each, a mean record mean_chunks(width) each.
[[nodiscard]] constexpr std::uint64_t work_units(const reducer& r, std::uint64_t records, std::uint64_t width) noexcept
{
  return r.op == reduce_op::mean ? records * mean_chunks(width) : records;
}

/// One part of a record: its name, safetensors dtype name, byte offset in the record and element count, and whether
/// it is one value per record whatever the width (a scale, a count: readers give it as a column, not a row).
struct record_field {
  std::string_view name;
  std::string_view dtype;
  std::uint64_t offset{0};
  std::uint64_t count{0};
  bool scalar{false};
};

/// The parts of one record of `r` over rows of `width` elements (`n` of the 4 are set).
struct record_layout {
  std::array<record_field, 4> fields{};
  std::uint32_t n{0};
};
[[nodiscard]] constexpr record_layout record_fields(const reducer& r, std::uint64_t width) noexcept
{
  const std::uint64_t w = width;
  switch (r.op) {
    case reduce_op::topk: return {{{{"values", "F32", 0, r.k}, {"indices", "I32", 4ULL * r.k, r.k}}}, 2};
    case reduce_op::fp8_e4m3: return {{{{"scale", "F32", 0, 1, true}, {"codes", "F8_E4M3", 4, w}}}, 2};
    case reduce_op::mean: return {{{{"mean", "F32", 0, w}, {"count", "U32", 4 * w, 1, true}}}, 2};
    default:
      return {{{{"mean", "F32", 0, w},
                {"m2", "F32", 4 * w, w},
                {"maxabs", "F32", 8 * w, w},
                {"count", "U32", 12 * w, 1, true}}},
              4};
  }
}

/// The reducer's name as the Python spelling and the sinks' metadata write it: "topk(64)", "fp8_e4m3", "mean",
/// "stats" (topk's k is appended by the caller).
[[nodiscard]] constexpr std::string_view reduce_op_name(reduce_op op) noexcept
{
  switch (op) {
    case reduce_op::topk: return "topk";
    case reduce_op::fp8_e4m3: return "fp8_e4m3";
    case reduce_op::mean: return "mean";
    default: return "stats";
  }
}

/// The reducer `spec` names in the Python spelling: "topk(K)" (K decimal, at most 10 digits), "fp8_e4m3", "mean"
/// or "stats"; false for anything else (the range of K is checked where the width is known: capture_reduced).
[[nodiscard]] constexpr bool parse_reducer(std::string_view spec, reducer& out) noexcept
{
  for (const reduce_op op : {reduce_op::fp8_e4m3, reduce_op::mean, reduce_op::stats}) {
    if (spec == reduce_op_name(op)) {
      out = {op, 0};
      return true;
    }
  }
  constexpr std::string_view head = "topk(";
  if (spec.size() <= head.size() + 1 || spec.substr(0, head.size()) != head || spec.back() != ')' ||
      spec.size() > head.size() + 11) {
    return false;
  }
  std::uint64_t k = 0;
  for (const char c : spec.substr(head.size(), spec.size() - head.size() - 1)) {
    if (c < '0' || c > '9') { return false; }
    k = k * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (k > 0xffffffffULL) { return false; }
  out = reducer::topk(static_cast<std::uint32_t>(k));
  return true;
}

}  // namespace ferry::d2h
