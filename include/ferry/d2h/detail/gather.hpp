// SPDX-License-Identifier: Apache-2.0
// The gather kernel's argument block, its launch shape (blocks apportioned by entry size) and its getters.
// ONE launch copies a flushed batch of deferred entries: they are placed consecutively from the device
// cursor (the same two-slot cursor and place_phys chain as one entry per kernel, so graph replays land
// where plan() put them), each entry is copied by its own range of blocks, and when `head_n` > 0 the last
// block to arrive at the join counter publishes published_head (system-scope release).
// Bodies: kernels/detail/d2h_gather.cuh (shared), kernels/d2h_gather.cu (CUDA/HIP), src/d2h_gather_host.cpp.
// Device-safe (no fmt, no error.hpp).
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/types.hpp>

#include <algorithm>
#include <cstdint>

namespace ferry::d2h::detail {

/// The most entries one gather launch copies (the descriptor table travels in the kernel parameters:
/// 32 x 16 bytes + 33 x 4 bytes of block offsets, well under the 4 KiB parameter limit).
inline constexpr std::uint32_t gather_max_entries = 32;

/// One deferred entry: `bytes` (fixed size) from device memory `src`.
struct gather_entry {
  const std::byte* src{nullptr};
  std::uint64_t bytes{0};
};

/// The gather kernel's arguments (trivially copyable, passed by value; a captured graph keeps its copy).
///   dst            ring, state block, ring size and the cursor parity of this writer (reserved: unused)
///   e[0..n)        the batch, in entry order; entry i is placed after entry i - 1 (place_phys chain)
///   first_block    entry i is copied by blocks [first_block[i], first_block[i + 1]); first_block[n] = grid
///   head_n         > 0: after the cross-block join the last block releases produced += head_n
struct gather_args {
  ring_ref dst;
  std::uint64_t* head{nullptr};  ///< device address of published_head
  std::uint64_t head_n{0};
  std::uint32_t n{0};
  std::uint32_t vecs_per_thread{1};
  std::uint32_t test_skip_wait{0};  ///< test hook (debug_fault::programmatic_without_wait): omit the join
  gather_entry e[gather_max_entries]{};
  std::uint32_t first_block[gather_max_entries + 1]{};
};

/// The grid of one gather launch.
struct gather_shape {
  std::uint32_t blocks{1};
  std::uint32_t threads{128};
  std::uint32_t vecs_per_thread{1};
};

/// Apportions blocks to `a.e[0..a.n)` by size and fills `a.first_block`: every entry gets at least one
/// block and about one block per pass (threads x V x 16 bytes); when the batch needs more than one wave
/// (`sm_count` x 2048 threads) the pass doubles until it fits, so one large entry gets many blocks and
/// each small one its own block, all in one launch.
[[nodiscard]] constexpr gather_shape apportion_gather(const config& cfg, gather_args& a, int sm_count) noexcept
{
  gather_shape s;
  const std::uint32_t v = cfg.copy_vecs_per_thread;
  s.vecs_per_thread = v == 8 || v == 4 || v == 2 ? v : 1;
  s.threads = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(align_up(cfg.copy_block_threads, 32), 32, 1024));
  const std::uint64_t sms = sm_count > 0 ? static_cast<std::uint64_t>(sm_count) : 1;
  const std::uint64_t max_blocks =
    std::max<std::uint64_t>(a.n, sms * std::max<std::uint64_t>(1, 2048 / s.threads));
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

/// Where the gather's entry `i` starts (physical offset) and where the batch ends, from cursor phys
/// `phys`: the place_phys chain every thread of the gather and the CPU's place() agree on.
FERRY_HD constexpr std::uint64_t gather_offset(const gather_args& a, std::uint64_t phys, std::uint32_t i) noexcept
{
  std::uint64_t off = 0;
  for (std::uint32_t k = 0; k <= i; ++k) {
    const std::uint64_t r = align_up(a.e[k].bytes, entry_alignment);
    off = place_phys(phys, r, a.dst.ring_bytes);
    phys = off + r == a.dst.ring_bytes ? 0 : off + r;
  }
  return off;
}

using ferry::backend::cuda_kernel;
using ferry::backend::hip_kernel;
using ferry::backend::host_kernel;

/// The gather kernel (kernels/d2h_gather.cu; host: src/d2h_gather_host.cpp).
host_kernel<gather_args> gather_publish_kernel(ferry::backend::host_tag);
cuda_kernel<gather_args> gather_publish_kernel(ferry::backend::cuda_tag);
hip_kernel<gather_args> gather_publish_kernel(ferry::backend::hip_tag);

}  // namespace ferry::d2h::detail
