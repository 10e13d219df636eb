// SPDX-License-Identifier: Apache-2.0
// Trivially copyable kernel parameters shared by the host and GPU scatter kernels.
// No fmt / error headers here: kernel translation units include this file.
#pragma once

#include <cstdint>

namespace ferry::h2d::detail {

/// One tile of the scatter grid: `tile`-th tile_bytes chunk of member `member`'s capacity.
struct tile_desc {
  std::uint32_t member;
  std::uint32_t tile;
};

/// Arena layout (one per group and slot, 16-byte aligned everywhere):
///   [ member_count x { int64 offset_in_arena, int64 count_bytes } ][ payload 0 ][ payload 1 ] ...
/// The scatter reads the pairs from the arena it scatters (the device copy, or the mapped pinned arena).
struct scatter_params {
  const std::int64_t* header;      ///< arena header as the device sees it
  const unsigned char* arena;      ///< arena base as the device sees it
  const std::uint64_t* dst_table;  ///< per member: device destination address (fixed at initialization)
  const tile_desc* tiles;          ///< precomputed from capacities at initialization
  std::uint32_t tile_count;
  std::uint32_t tile_bytes;
};

/// Reader used by tests and benchmarks as a "first consumer": block m XORs member m's first bytes[m]
/// bytes (16-byte loads when aligned) and each thread writes its partial to out[m * blockDim + thread].
struct checksum_params {
  const std::uint64_t* src_table;    ///< per member: device address
  const std::uint64_t* bytes_table;  ///< per member: bytes to read
  std::uint64_t* out;                ///< members * threads partials
};

}  // namespace ferry::h2d::detail
