// SPDX-License-Identifier: Apache-2.0
// row_selection: which rows of a [n_rows, row_bytes] device tensor one entry holds (channel::capture_rows).
// Device-resident: the selection kernel (kernels/d2h/select) reads it at every launch, so a graph replay
// captures the rows its step selected (the selection lives at a fixed device address, rewritten each step,
// e.g. by an h2d::publisher). Three forms, in the engine's own metadata:
//   rows        an explicit row-index list, int32 or int64 (indices[0..count))
//   last_token  the last token of each selected request: row query_start_loc[r + 1] - 1 for r in
//               requests[0..count) (query_start_loc: int32 cumulative token offsets [n_requests + 1], as vLLM and
//               ATOM keep it)
//   window      the token window [window_begin, window_end) of each selected request, relative to its first
//               token: rows query_start_loc[r] + window_begin .. query_start_loc[r] + window_end - 1
// The count of selected items (rows, or requests) is CPU-known (`count`: the entry reserves exactly its rows) or
// GPU-resolved (`device_count`, an int32 in device memory, bounded by `max_count`: the entry reserves the bound
// and its actual size travels in the size ring). The entry's rows are in selection order. The kernel validates
// every item (a row outside [0, n_rows), a request outside [0, n_requests), a window past its request's span,
// a device count above max_count): such an entry is delivered with entry_status::selection_error, and nothing
// outside the source is read. No fmt / error.hpp: device code includes it.
#pragma once

#include <cstdint>

namespace ferry::d2h {

/// How a row_selection names its rows.
enum class selection_form : std::uint32_t { rows, last_token, window };

struct row_selection {
  selection_form form{selection_form::rows};
  std::uint32_t index_bytes{4};         ///< rows: 4 (int32 indices) or 8 (int64)
  const void* indices{nullptr};         ///< rows: the row indices; last_token / window: the request ids (int32)
  const std::int32_t* query_start_loc{nullptr};  ///< last_token / window: [n_requests + 1] token offsets
  std::uint32_t n_requests{0};          ///< last_token / window: requests in query_start_loc
  std::int64_t window_begin{0};         ///< window: first row, relative to the request's first token (>= 0)
  std::int64_t window_end{0};           ///< window: one past the last row (> window_begin)
  std::uint64_t count{0};               ///< CPU-known item count (device_count null)
  const std::int32_t* device_count{nullptr};  ///< GPU-resolved item count (device memory), at most max_count
  std::uint64_t max_count{0};           ///< with device_count: the reservation bound (items)
  friend constexpr bool operator==(const row_selection&, const row_selection&) = default;

  /// Rows `indices[0..count)` (int32 or int64 device memory).
  static constexpr row_selection rows(const std::int32_t* indices, std::uint64_t count) noexcept
  {
    return {selection_form::rows, 4, indices, nullptr, 0, 0, 0, count, nullptr, count};
  }
  static constexpr row_selection rows(const std::int64_t* indices, std::uint64_t count) noexcept
  {
    return {selection_form::rows, 8, indices, nullptr, 0, 0, 0, count, nullptr, count};
  }
  /// The last token of each request `requests[0..count)`.
  static constexpr row_selection last_token(const std::int32_t* query_start_loc, std::uint32_t n_requests,
                                            const std::int32_t* requests, std::uint64_t count) noexcept
  {
    return {selection_form::last_token, 4, requests, query_start_loc, n_requests, 0, 0, count, nullptr, count};
  }
  /// The window [begin, end) of each request `requests[0..count)`.
  static constexpr row_selection window(const std::int32_t* query_start_loc, std::uint32_t n_requests,
                                        const std::int32_t* requests, std::uint64_t count, std::int64_t begin,
                                        std::int64_t end) noexcept
  {
    return {selection_form::window, 4, requests, query_start_loc, n_requests, begin, end, count, nullptr, count};
  }
  /// The same selection with a GPU-resolved item count: `*device_count` items, at most `max_items`.
  [[nodiscard]] constexpr row_selection counted_on_device(const std::int32_t* dev_count,
                                                          std::uint64_t max_items) const noexcept
  {
    row_selection s = *this;
    s.device_count = dev_count;
    s.max_count = max_items;
    s.count = 0;
    return s;
  }

  /// Rows per selected item (1, or the window's length).
  [[nodiscard]] constexpr std::uint64_t rows_per_item() const noexcept
  {
    return form == selection_form::window && window_end > window_begin
               ? static_cast<std::uint64_t>(window_end - window_begin)
               : 1;
  }
  /// The most items the entry can hold (its reservation): count, or max_count with a device count.
  [[nodiscard]] constexpr std::uint64_t item_bound() const noexcept
  {
    return device_count != nullptr ? max_count : count;
  }
};

/// The size slot value of an entry whose selection the kernel refused (entry_status::selection_error).
inline constexpr std::uint64_t selection_error_size = ~std::uint64_t{0} - 1;

}  // namespace ferry::d2h
