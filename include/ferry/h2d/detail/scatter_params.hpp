// SPDX-License-Identifier: Apache-2.0
// Trivially copyable kernel parameters shared by the host and GPU scatter kernels.
// No fmt / error headers here: kernel translation units include this file.
#pragma once

#include <cstdint>

namespace ferry::h2d::detail {

/// One tile of the scatter grid, fully resolved at initialization so that a block needs a single table load
/// before it issues its payload loads (no dependent header -> offset -> data chain):
///   bytes [start, start + len) of member `member` (len <= tile_bytes, clipped to the member's capacity),
///   read from arena offset `src`, written to device address `dst` (the member's destination + start).
/// The member's published count (header word 2*member+1) is read concurrently with the payload and only
/// the bytes below it are stored.
struct alignas(16) tile_desc {
  std::uint64_t dst;     ///< device address of this tile's first byte
  std::uint64_t src;     ///< arena offset of this tile's first byte (16-byte aligned)
  std::uint64_t start;   ///< byte offset of the tile inside its member
  std::uint32_t member;  ///< header index
  std::uint32_t len;     ///< tile bytes within the member's capacity (the arena is padded to 16 bytes)
};

/// Arena layout (one per group and slot, 16-byte aligned everywhere):
///   [ member_count x { int64 offset_in_arena, int64 count_bytes } ][ payload 0 ][ payload 1 ] ...
/// The scatter reads the counts from the arena it scatters (the device copy, or the mapped pinned arena).
///
/// Where a tile learns its member's count:
///  * eager publication with <= inline_counts_max members: `count[]` in the kernel parameters (the CPU knows
///    the counts; no header read at all), `counts_inline != 0`;
///  * otherwise (graph replay: the counts change after capture) the header word, read concurrently with the
///    payload loads when the tile is speculative (`spec`), or before them otherwise.
/// Speculative loads read up to the member's capacity (always in bounds: the arena is allocated to capacity)
/// and store only the published prefix. spec: 0 = never, 1 = first tile of each member, 2 = every tile.
struct scatter_params {
  static constexpr std::uint32_t inline_counts_max = 64;
  const std::int64_t* header;      ///< arena header as the device sees it
  const unsigned char* arena;      ///< arena base as the device sees it
  const tile_desc* tiles;          ///< precomputed from capacities and destinations at initialization
  std::uint32_t tile_count;
  std::uint32_t tile_bytes;
  std::uint32_t spec;              ///< speculative payload loads (see above)
  std::uint32_t counts_inline;     ///< nonzero: count[] holds every member's published bytes
  std::uint64_t count[inline_counts_max];
};

}  // namespace ferry::h2d::detail
