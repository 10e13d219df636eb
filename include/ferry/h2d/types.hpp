// SPDX-License-Identifier: Apache-2.0
// Vocabulary of H2D publication: strong handles, count units, upload backends, buffer declarations.
#pragma once

#include <ferry/backend/types.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::h2d {

/// A declared buffer (strong type: an index is not silently a buffer).
struct buffer_handle {
  std::uint32_t value{0xFFFFFFFFu};
  friend constexpr bool operator==(buffer_handle, buffer_handle) = default;
};

/// A declared group (a consumer boundary: everything its first GPU consumer reads).
struct group_handle {
  std::uint32_t value{0xFFFFFFFFu};
  friend constexpr bool operator==(group_handle, group_handle) = default;
};

/// What a producer's count counts.
enum class count_unit { rows, elements, bytes };

[[nodiscard]] constexpr std::string_view to_string(count_unit u) noexcept
{
  switch (u) {
    case count_unit::rows: return "rows";
    case count_unit::elements: return "elements";
    case count_unit::bytes: return "bytes";
  }
  return "?";
}

/// How a group's members reach their device destinations.
enum class upload_backend {
  direct,    ///< one async copy per active member
  batch,     ///< one cudaMemcpyBatchAsync (CUDA >= 12.8); per-member copies elsewhere. Not graph-capturable
  packed,    ///< one H2D DMA of the pinned arena + one scatter kernel (default)
  zerocopy,  ///< one scatter kernel reading the mapped pinned arena (no DMA)
  automatic, ///< per group, the fastest of the above measured at initialization
};

[[nodiscard]] constexpr std::string_view to_string(upload_backend k) noexcept
{
  switch (k) {
    case upload_backend::direct: return "direct";
    case upload_backend::batch: return "batch";
    case upload_backend::packed: return "packed";
    case upload_backend::zerocopy: return "zerocopy";
    case upload_backend::automatic: return "auto";
  }
  return "?";
}

/// Parses a FERRY_H2D_BACKEND value; nullopt when unknown.
[[nodiscard]] inline std::optional<upload_backend> parse_upload_backend(std::string_view s) noexcept
{
  if (s == "direct") { return upload_backend::direct; }
  if (s == "batch") { return upload_backend::batch; }
  if (s == "packed") { return upload_backend::packed; }
  if (s == "zerocopy") { return upload_backend::zerocopy; }
  if (s == "auto") { return upload_backend::automatic; }
  return std::nullopt;
}

/// A buffer, declared once at allocation.
///  - `capacity` is in `unit`s; one unit is `row_size` bytes (rows), `element_size` bytes (elements) or 1 byte.
///  - `device_ptr == nullptr`: ferry allocates the device destination; otherwise it is bound to the caller's
///    storage (e.g. a framework tensor) and must stay valid and fixed until the publisher is destroyed.
///  - `stride` (rows only, bound only): bytes between consecutive rows; 0 or row_size means contiguous.
///    Strided destinations always use direct copies (one per row).
struct buffer_spec {
  std::string name;
  std::vector<std::string> groups;
  count_unit unit{count_unit::elements};
  std::size_t element_size{1};
  std::size_t row_size{0};
  std::size_t capacity{0};
  void* device_ptr{nullptr};
  std::size_t stride{0};
};

/// Initialization settings. The owner stream is passed to initialize() separately (stream argument last).
struct config {
  std::size_t slots{2};                           ///< runner slots (>= 2)
  std::optional<upload_backend> backend{};        ///< nullopt: FERRY_H2D_BACKEND (read once), default packed
  ferry::backend::device_id device{};             ///< the device every publication must run on
  std::size_t tile_bytes{8192};                   ///< scatter tile (multiple of 16)
  std::uint32_t threads_per_tile{256};            ///< scatter block size (multiple of 32, <= 1024)
  int calibration_iterations{25};                 ///< per candidate, for `automatic`
  /// Scatter payload loads issued before the member's count is known (graph replays read the count from
  /// the arena header; eager publications pass the counts in the kernel parameters and never speculate
  /// past them). -1: per backend (packed 2: device-local over-reads are cheap; zerocopy 1: an over-read
  /// crosses PCIe), 0: never, 1: the first tile of each member, 2: every tile (reads whole capacities).
  /// FERRY_H2D_SPECULATION overrides -1.
  int speculation{-1};
  /// Debug check of published sources (detail/source_check.hpp): publish() and stage() copy each member's
  /// published prefix, and the next begin(), resume(), producer(), rewrite(), publish() or stage() throws
  /// ferry::logic_error when a source was written after its publication (until its slot's next begin()).
  /// nullopt: FERRY_H2D_DEBUG_SOURCES (0 | 1, read once), default off. Costs a copy and a compare of the
  /// published bytes per call: for tests and CI.
  std::optional<bool> debug_sources{};
};

/// Per-group facts chosen at initialization (for logs, tests and benchmarks).
struct group_info {
  std::string name;
  upload_backend backend{upload_backend::direct};  ///< what publish() uses for >= 2 active members
  upload_backend graph_backend{upload_backend::direct};  ///< what capture_upload() records
  bool covered{false};             ///< fully covered by a larger packed group: checked direct copies
  bool batch_native{false};        ///< batch runs as one cudaMemcpyBatchAsync (else per-member copies)
  std::size_t arena_bytes{0};      ///< 0 when the group owns no arena
  std::uint32_t tiles{0};
  std::vector<std::string> members;
  std::vector<double> calibration_us;        ///< eager span: direct, batch, packed, zerocopy (auto; <0: not run)
  std::vector<double> calibration_graph_us;  ///< replayed-graph span, same order (batch never)
};

}  // namespace ferry::h2d
