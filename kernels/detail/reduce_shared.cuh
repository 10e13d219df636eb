// SPDX-License-Identifier: Apache-2.0
// The shared scratch of a reduce block (reduce_block.cuh, topk_block.cuh) and the sizes it is made of.
#pragma once

#include <ferry/d2h/detail/kernel_args.hpp>  // reduce_threads
#include <ferry/d2h/reducer.hpp>

#include <cstddef>  // offsetof
#include <cstdint>

namespace ferry::kernels::d2h {

inline constexpr std::uint32_t mean_groups = 32;  ///< mean_record's row groups at most (256 threads, 8 lanes a row)
inline constexpr std::uint32_t mean_batch = 8;  ///< mean_record on the GPU: 16-byte vectors a thread has in flight
inline constexpr std::uint32_t topk_tie_cap = 1024;  ///< topk_radix's ties kept in shared memory (else a 2nd select)
inline constexpr std::uint32_t topk_groups = 1024;  ///< topk_filtered's groups (their maxima bound the k-th key)
inline constexpr std::uint32_t topk_cand_cap = 2048;  ///< topk_filtered's candidates kept (more: topk_radix)
inline constexpr std::uint32_t topk_batch = 8;  ///< topk passes on the GPU: elements a thread loads before using
inline constexpr std::uint32_t topk_vec_batch = 4;  ///< topk_record on the GPU: 16-byte vectors a thread has in flight
inline constexpr std::uint32_t fp8_vec_regs = 16;  ///< fp8_record: 16-byte vectors a lane holds (rows <= 4096 bf16)

/// The block's shared scratch (about 33 KiB).
struct reduce_shared {
  float part[mean_groups * ferry::d2h::mean_chunk_cols];  ///< mean_record: each row group's column sums
  std::uint32_t hist[256];  ///< topk_radix: a digit's histogram; mean_record: its request offsets (query_start_loc)
  std::uint64_t cand[topk_cand_cap];  ///< topk: elements packed as key << 32 | ~index (topk_pack), then sorted
  std::uint32_t gmax[topk_groups];    ///< topk_filtered: each group's max key
  std::uint32_t ties[topk_tie_cap];   ///< topk_radix: the indices of the elements equal to the k-th
  std::uint32_t prefix;
  std::uint32_t krem;
  std::uint32_t n_eq;
  std::uint32_t n_cand;
  std::uint32_t n_ties;
};
static_assert(offsetof(reduce_shared, part) == 0, "the mean's scratch is reduce_shared's first bytes");

static_assert(sizeof(reduce_shared::hist) / 4 >= ferry::d2h::detail::reduce_threads,
              "mean_record stages up to reduce_threads request offsets in hist");

/// The bytes of reduce_shared a reduce block of reducer `op` declares (the GPU's scratch, reduce_rows.cuh): a mean
/// touches `part` and `hist` only, so that its blocks reserve 9 KiB of shared memory and not the top-k's 33 KiB (fp8
/// and stats touch none: their kernels declare nothing).
[[nodiscard]] constexpr std::size_t reduce_shared_bytes(ferry::d2h::reduce_op op) noexcept
{
  return op == ferry::d2h::reduce_op::mean ? offsetof(reduce_shared, hist) + sizeof(reduce_shared::hist)
                                           : sizeof(reduce_shared);
}

/// The GPU's scratch of a block of reducer `Op` (a __shared__ variable): reduce_shared_bytes(Op) bytes, aligned as
/// reduce_shared, read through a reduce_shared reference.
template <ferry::d2h::reduce_op Op>
struct alignas(reduce_shared) reduce_scratch {
  std::byte bytes[reduce_shared_bytes(Op)];
};

}  // namespace ferry::kernels::d2h
