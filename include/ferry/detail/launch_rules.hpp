// SPDX-License-Identifier: Apache-2.0
// The launch rules every ferry kernel follows (the tuning layer under the shapes of
// d2h/detail/launch_shape.hpp: copy_entry, d2h/detail/gather.hpp: gather_publish, and
// h2d/detail/plan.hpp: scatter_grid): how many 16-byte vectors a thread moves per pass, how many
// threads a block has, and how many blocks fill the GPU once. Pure and constexpr; unit-tested through
// those shapes (tests/d2h/d2h_units_test.cpp, tests/h2d/plan_test.cpp). Device-safe.
#pragma once

#include <ferry/detail/align.hpp>

#include <algorithm>
#include <cstdint>

namespace ferry::detail::launch_rules {

/// Resident threads per SM that one wave counts on (2048: sm_80, sm_90; a GPU holding fewer runs the
/// excess blocks as a second wave).
inline constexpr std::uint64_t threads_per_sm = 2048;

/// The vectors a thread moves per pass, from the requested count: 1, 2, 4 or 8 (anything else is 1).
/// Each value has its own small kernel on the GPU (copy_form), so no other value is compiled.
[[nodiscard]] constexpr std::uint32_t vecs_per_thread(std::uint32_t requested) noexcept
{
  return requested == 8 || requested == 4 || requested == 2 ? requested : 1;
}

/// Threads of a block from the wanted count: a multiple of 32 (whole warps), at least 32, at most 1024.
[[nodiscard]] constexpr std::uint64_t block_threads(std::uint64_t wanted) noexcept
{
  return std::clamp<std::uint64_t>(align_up(wanted, 32), 32, 1024);
}

/// The most blocks a one-wave launch takes: the one-entry row kernels count their blocks' arrivals in 16 bits
/// (kernels/detail/rows.cuh, entry_arrive). A GPU with that many resident blocks runs the rest as a second wave.
inline constexpr std::uint64_t max_wave_blocks = 0xffff;

/// The most blocks of `threads` threads that are resident at once on `sm_count` SMs (one wave; at least
/// one block per SM, and one SM when the count is unknown, i.e. <= 0), at most max_wave_blocks.
[[nodiscard]] constexpr std::uint64_t one_wave_blocks(int sm_count, std::uint64_t threads) noexcept
{
  const std::uint64_t sms = sm_count > 0 ? static_cast<std::uint64_t>(sm_count) : 1;
  return std::min(max_wave_blocks, sms * std::max<std::uint64_t>(1, threads_per_sm / threads));
}

}  // namespace ferry::detail::launch_rules
