// SPDX-License-Identifier: Apache-2.0
// The gather kernel's dispatch (gather_publish, kernels/d2h/gather/): the batch's descriptor table and its
// launch shape, blocks apportioned by entry size on the launch rules of ferry/detail/launch_rules.hpp. Its
// argument block gather_args is in kernel_args.hpp, its getter gather_publish_kernel in kernels.hpp (both
// included here). Device-safe (no fmt, no error.hpp).
#pragma once

#include <ferry/d2h/detail/kernel_args.hpp>
#include <ferry/d2h/detail/kernels.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/detail/launch_rules.hpp>

#include <algorithm>
#include <cstdint>

namespace ferry::d2h::detail {

/// Fills `a.e[0..n)` from (source, bytes) pairs and `a.pre` from their reserved sizes (align_up to
/// entry_alignment); `a.n` = n.
template <class SrcBytes>
constexpr void set_gather_entries(gather_args& a, std::uint32_t n, SrcBytes&& src_bytes) noexcept
{
  a.n = n;
  a.pre[0] = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    a.e[i] = src_bytes(i);
    a.pre[i + 1] = a.pre[i] + align_up(a.e[i].bytes, entry_alignment);
  }
}

/// The grid of one gather launch.
struct gather_shape {
  std::uint32_t blocks{1};
  std::uint32_t threads{128};
  std::uint32_t vecs_per_thread{1};
};

/// Apportions blocks to `a.e[0..a.n)` by size and fills `a.first_block`: every entry gets at least one
/// block and about one block per pass (threads x V x 16 bytes, launch_rules: block_threads of
/// copy_block_threads, vecs_per_thread of copy_vecs_per_thread); when the batch needs more than one wave
/// (one_wave_blocks: `sm_count` x 2048 threads) the pass doubles until it fits, so one large entry gets
/// many blocks and each small one its own block, all in one launch.
[[nodiscard]] constexpr gather_shape apportion_gather(const config& cfg, gather_args& a, int sm_count) noexcept
{
  namespace rules = ferry::detail::launch_rules;
  gather_shape s;
  s.vecs_per_thread = rules::vecs_per_thread(cfg.tuning.copy_vecs_per_thread);
  s.threads = static_cast<std::uint32_t>(rules::block_threads(cfg.tuning.copy_block_threads));
  const std::uint64_t max_blocks = std::max<std::uint64_t>(a.n, rules::one_wave_blocks(sm_count, s.threads));
  std::uint64_t pass = static_cast<std::uint64_t>(s.threads) * s.vecs_per_thread * 16;
  for (;;) {
    std::uint64_t total = 0;
    for (std::uint32_t i = 0; i < a.n; ++i) {
      a.first_block[i] = static_cast<std::uint32_t>(total);
      total += std::max<std::uint64_t>(1, (a.e[i].bytes + pass - 1) / pass);
    }
    if (total <= max_blocks) {
      a.first_block[a.n] = static_cast<std::uint32_t>(total);
      s.blocks = static_cast<std::uint32_t>(total);
      return s;
    }
    pass *= 2;
  }
}

}  // namespace ferry::d2h::detail
