// SPDX-License-Identifier: Apache-2.0
// The shared scratch of a reduce block (reduce_block.cuh, topk_block.cuh) and the sizes it is made of.
#pragma once

#include <ferry/d2h/reducer.hpp>

#include <cstdint>

namespace ferry::kernels::d2h {

inline constexpr std::uint32_t reduce_warps = 8;  ///< of a reduce_rows block (256 threads): mean_record's row groups
inline constexpr std::uint32_t mean_tile_rows = 256;  ///< mean_record's rows resolved at a time (a block's threads)
inline constexpr std::uint32_t topk_tie_cap = 1024;  ///< topk_record's ties kept in shared memory (else a 2nd select)
inline constexpr std::uint32_t topk_batch = 8;  ///< topk_record's collection: elements a thread loads before using
inline constexpr std::uint32_t topk_vec_batch = 4;  ///< topk_record on the GPU: 16-byte vectors a thread has in flight
inline constexpr std::uint32_t fp8_vec_regs = 16;  ///< fp8_record: 16-byte vectors a lane holds (rows <= 4096 bf16)

/// The block's shared scratch (about 19 KiB).
struct reduce_shared {
  float part[reduce_warps * ferry::d2h::mean_chunk_cols];  ///< mean_record: each warp's column sums
  std::int64_t rows[mean_tile_rows];                         ///< mean_record: the tile's source rows
  std::uint32_t hist[256];
  std::uint32_t key[ferry::d2h::topk_max];
  std::int32_t idx[ferry::d2h::topk_max];
  std::uint32_t ties[topk_tie_cap];  ///< topk_record: the indices of the elements equal to the k-th
  std::uint32_t prefix;
  std::uint32_t krem;
  std::uint32_t n_eq;
  std::uint32_t n_taken;
  std::uint32_t n_ties;
  std::uint32_t bad;
};

}  // namespace ferry::kernels::d2h
