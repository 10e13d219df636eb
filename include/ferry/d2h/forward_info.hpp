// SPDX-License-Identifier: Apache-2.0
// Attribution: what the engine says about one forward (channel::begin_forward, or channel::plan per graph
// replay), and what every delivered entry of that forward carries (entry_view::tag(), forward_index(), meta(),
// rows_of()). Under continuous batching one forward holds many requests: the scheduler knows at step time which
// requests want capture and which rows of a row-selected entry hold each one (request_rows), so the consumer
// reads the rows of request R of an entry without a copy and without a guess (DMI's issue #68: activations
// attributed to the wrong request). Host-only (the GPU never sees it): the producer hands it to the drainer
// through the forward log (detail/forward_log.hpp), once per forward, never per entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace ferry::d2h {

/// The rows of one request in a forward's row-selected entries: rows [first_row, first_row + rows) of the entry
/// (e.g. a last-token selection of requests q0, q1, ...: request qi at row i; a window of w rows: at row i * w).
struct request_rows {
  std::uint64_t request{0};    ///< the engine's request id
  std::uint64_t first_row{0};  ///< first row of the request in the entry
  std::uint64_t rows{0};       ///< its row count
  friend constexpr bool operator==(const request_rows&, const request_rows&) = default;
};

/// What the engine attaches to one forward: a tag (its step id), the request layout of its row entries, and
/// opaque bytes (anything the consumer needs: request ids, sampling state, ...). All optional; a forward with
/// none of them costs nothing.
struct forward_meta {
  std::optional<std::uint64_t> tag;   ///< the engine's step id (entry_view::tag(); none: the forward's index)
  std::vector<request_rows> requests;  ///< the row layout of the forward's row-selected entries, in row order
  std::vector<std::byte> user;         ///< opaque bytes, delivered as given (entry_view::meta()->user)
  /// plan() only: the items the replay's row selections hold, when the CPU knows them (e.g. the requests that want
  /// capture this step). Each row entry of the replay then reserves exactly those rows (16-byte aligned) and the
  /// replay's kernels place them there, so the drain copies a batch of them with one D2H; a device count below it
  /// is delivered right, one above it as size_overflow (nothing written past the entry).
  std::optional<std::uint64_t> selected;

  [[nodiscard]] bool empty() const noexcept { return !tag && requests.empty() && user.empty() && !selected; }
  /// The layout of `count` requests `ids[0..count)` holding `rows_each` consecutive rows each (a last-token
  /// selection: 1; a window [a, b): b - a), in that order.
  template <class Id>
  static std::vector<request_rows> consecutive(const Id* ids, std::size_t count, std::uint64_t rows_each = 1)
  {
    std::vector<request_rows> r(count);
    for (std::size_t i = 0; i < count; ++i) { r[i] = {static_cast<std::uint64_t>(ids[i]), i * rows_each, rows_each}; }
    return r;
  }
};

}  // namespace ferry::d2h
