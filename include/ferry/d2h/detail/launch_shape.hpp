// SPDX-License-Identifier: Apache-2.0
// The copy kernels' dispatch (copy_entry / copy_entry_publish, kernels/d2h/copy/): their code form and
// launch shape as pure functions of the configuration and the entry, on the launch rules of
// ferry/detail/launch_rules.hpp. Used by the channel's producer to launch capture()'s copy and by bench/d2h to
// launch the same shape for its copy-only baselines (one definition, so the two cannot drift). Unit-tested
// in tests/d2h.
#pragma once

#include <ferry/d2h/types.hpp>
#include <ferry/detail/launch_rules.hpp>

#include <algorithm>
#include <cstdint>

namespace ferry::d2h::detail {

/// Which copy kernel and what grid: `one_block` selects copy_entry_publish_kernel (one block; it may fuse
/// the batch release after its block barrier), otherwise copy_entry_kernel on `blocks` blocks.
struct launch_shape {
  bool one_block{true};
  std::uint32_t blocks{1};
  std::uint32_t threads{32};
  std::uint32_t vecs_per_thread{1};  ///< 16-byte vectors per thread per pass: 1, 2, 4 or 8
  friend constexpr bool operator==(const launch_shape&, const launch_shape&) = default;
};

/// The copy kernels' code form (kernels.hpp): each form is its own small kernel on the GPU. `vN`: the source
/// is 16-byte aligned and each thread moves N 16-byte vectors per pass; `bytes`: any other source.
/// `vN_lean`, the lean form (copy_entry_kernel only; config::lean_copy_kernel): the same for an entry its grid
/// copies in ONE pass, of a static size that is a multiple of 16: no pass loop, no byte tail, no size load (the
/// smallest code: in a model's graph a hook's copy kernel is fetched cold). lean_form() picks it.
enum class copy_form : std::uint32_t {
  bytes = 0,
  v1 = 1,
  v2 = 2,
  v4 = 4,
  v8 = 8,
  v1_lean = 0x11,
  v2_lean = 0x12,
  v4_lean = 0x14,
  v8_lean = 0x18,
};

/// The vectors per thread of form `f` (0 for bytes) and whether it is a lean form.
[[nodiscard]] constexpr std::uint32_t form_vecs(copy_form f) noexcept { return static_cast<std::uint32_t>(f) & 0xFU; }
[[nodiscard]] constexpr bool is_lean(copy_form f) noexcept { return (static_cast<std::uint32_t>(f) & 0x10U) != 0; }

/// tuning::copy_vecs_per_thread normalised to a supported value (launch_rules: 1, 2, 4, 8; anything else is 1).
[[nodiscard]] constexpr std::uint32_t vecs_per_thread(const config& cfg) noexcept
{
  return ferry::detail::launch_rules::vecs_per_thread(cfg.tuning.copy_vecs_per_thread);
}

/// The vector form of `vecs_per_thread` (1, 2, 4 or 8; anything else is 1).
[[nodiscard]] constexpr copy_form vec_form(std::uint32_t vecs_per_thread) noexcept
{
  switch (vecs_per_thread) {
    case 8: return copy_form::v8;
    case 4: return copy_form::v4;
    case 2: return copy_form::v2;
    default: return copy_form::v1;
  }
}

/// The form that copies from `src` with `vecs_per_thread`: vec_form, or bytes for a source that is not
/// 16-byte aligned.
[[nodiscard]] inline copy_form copy_form_of(const void* src, std::uint32_t vecs_per_thread) noexcept
{
  return (reinterpret_cast<std::uintptr_t>(src) & 15U) != 0 ? copy_form::bytes : vec_form(vecs_per_thread);
}

/// The form copy_entry_kernel launches for a copy of `bytes` with shape `sh` from a source of form `f`: the
/// lean form when cfg.tuning.lean_copy_kernel is on, the source is 16-byte aligned (`f` a vector form), the entry
/// is static (`dynamic` false) with a size that is a multiple of 16, and one pass of the grid covers it;
/// otherwise `f`.
[[nodiscard]] constexpr copy_form lean_form(const config& cfg, copy_form f, const launch_shape& sh, std::uint64_t bytes,
                                            bool dynamic) noexcept
{
  if (!cfg.tuning.lean_copy_kernel || sh.one_block || dynamic || f == copy_form::bytes || bytes % 16 != 0) { return f; }
  const std::uint64_t pass = static_cast<std::uint64_t>(sh.blocks) * sh.threads * sh.vecs_per_thread;
  if (bytes / 16 > pass) { return f; }
  return static_cast<copy_form>(static_cast<std::uint32_t>(f) | 0x10U);
}

/// Whether the entry of `reserved` bytes is copied by the one-block kernel: always up to
/// single_block_copy_max_bytes, and up to fused_copy_max_bytes when it completes a batch of K
/// (`publish_now`) and branch releases are off (the release then fuses into the copy).
[[nodiscard]] constexpr bool one_block_copy(const config& cfg, std::uint64_t reserved, bool publish_now) noexcept
{
  return reserved <= cfg.tuning.single_block_copy_max_bytes ||
         (publish_now && reserved <= cfg.tuning.fused_copy_max_bytes);
}

/// The grid for copying `bytes` payload bytes (launch_rules). `one_block`: one block of enough threads for
/// one pass (block_threads: 32..1024); else blocks of block_threads(copy_block_threads), enough for one pass
/// over the entry and at most one wave (one_wave_blocks: `sm_count` x 2048 threads).
[[nodiscard]] constexpr launch_shape copy_launch_shape(const config& cfg, std::uint64_t bytes, bool one_block,
                                                      int sm_count) noexcept
{
  namespace rules = ferry::detail::launch_rules;
  launch_shape s;
  s.one_block = one_block;
  s.vecs_per_thread = vecs_per_thread(cfg);
  const std::uint64_t vecs = (bytes + 15) / 16;
  const std::uint64_t per_thread = (vecs + s.vecs_per_thread - 1) / s.vecs_per_thread;
  if (one_block) {
    s.blocks = 1;
    s.threads = static_cast<std::uint32_t>(rules::block_threads(per_thread));
    return s;
  }
  const std::uint64_t threads = rules::block_threads(cfg.tuning.copy_block_threads);
  s.threads = static_cast<std::uint32_t>(threads);
  s.blocks = static_cast<std::uint32_t>(
    std::clamp<std::uint64_t>((per_thread + threads - 1) / threads, 1, rules::one_wave_blocks(sm_count, threads)));
  return s;
}

}  // namespace ferry::d2h::detail
