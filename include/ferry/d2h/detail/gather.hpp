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
#include <ferry/d2h/detail/launch_shape.hpp>  // copy_form
#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/types.hpp>

#include <algorithm>
#include <cstdint>

namespace ferry::d2h::detail {

/// The most entries one gather launch copies (the descriptor table travels in the kernel parameters:
/// 128 x 16 bytes + 129 x 8 bytes of prefix sums + 129 x 4 bytes of block offsets, under the 4 KiB that every
/// backend passes by value; static_assert below): with one release per forward a vllm-full forward
/// (341 hooks) launches 3 gathers.
inline constexpr std::uint32_t gather_max_entries = 128;

/// One deferred entry: `bytes` (fixed size) from device memory `src`.
struct gather_entry {
  const std::byte* src{nullptr};
  std::uint64_t bytes{0};
};

/// The gather kernel's arguments (trivially copyable, passed by value; a captured graph keeps its copy).
///   dst            ring, state block, ring size and the cursor parity of this writer (reserved: unused)
///   e[0..n)        the batch, in entry order; entry i is placed after entry i - 1 (place_phys chain)
///   pre[0..n]      prefix sums of the reserved sizes (pre[0] = 0): the chain in closed form (gather_offset)
///   first_block    entry i is copied by blocks [first_block[i], first_block[i + 1]); first_block[n] = grid
///   head_n         > 0: after the cross-block join the last block releases produced += head_n
///   normalize      (forward boundary, head_n > 0) the last block copies cursor slot 1 into slot 0 before it
///                  releases, as the boundary's publish kernel does (every block read its cursor before it arrived)
struct gather_args {
  ring_ref dst;
  std::uint64_t* head{nullptr};  ///< device address of published_head
  std::uint64_t head_n{0};
  std::uint32_t n{0};
  std::uint32_t normalize{0};
  std::uint32_t vecs_per_thread{1};
  std::uint32_t test_skip_wait{0};  ///< test hook (debug_fault::programmatic_without_wait): omit the join
  gather_entry e[gather_max_entries]{};
  std::uint64_t pre[gather_max_entries + 1]{};
  std::uint32_t first_block[gather_max_entries + 1]{};
};
static_assert(sizeof(gather_args) <= 4096, "gather_args travels as kernel parameters: at most 4 KiB");

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

/// Where the gather's entry `i` starts (physical offset) from cursor phys `phys`: the place_phys chain
///   off_k = place_phys(phys_k, r_k), phys_{k+1} = (off_k + r_k == ring_bytes ? 0 : off_k + r_k)
/// that the CPU's place() mirrors, in closed form over the prefix sums `pre` (O(1) unless the batch wraps).
/// A batch spans at most ring_bytes (its sizes plus one wrap padding: deferred_batch::needs_flush_before),
/// so the chain wraps at most once: entry i sits at phys + pre[i] while phys + pre[i + 1] <= ring_bytes
/// (every earlier entry then ended before the ring's end), else at pre[i] - pre[s], where s is the first
/// entry placed from offset 0 (the first one that no longer fits, or the one after an entry that ended
/// exactly at the ring's end). Every block computes it from the parameters alone: no dependent chain of
/// parameter loads per entry (tests/d2h/gather.hpp checks it against the chain).
FERRY_HD constexpr std::uint64_t gather_offset(const gather_args& a, std::uint64_t phys, std::uint32_t i) noexcept
{
  const std::uint64_t ring = a.dst.ring_bytes;
  if (phys + a.pre[i + 1] <= ring) { return phys + a.pre[i]; }
  std::uint32_t s = 0;
  while (phys + a.pre[s + 1] <= ring) { ++s; }
  return a.pre[i] - a.pre[s];
}

/// Where the batch ends (the next writer's cursor phys, reduced: 0 at the ring's end).
FERRY_HD constexpr std::uint64_t gather_end(const gather_args& a, std::uint64_t phys) noexcept
{
  const std::uint64_t end = gather_offset(a, phys, a.n - 1) + (a.pre[a.n] - a.pre[a.n - 1]);
  return end == a.dst.ring_bytes ? 0 : end;
}

/// The entry block `blk` copies: blk itself when every entry has one block (the common case of small
/// entries), else a binary search of first_block (nondecreasing, first_block[0] = 0).
FERRY_HD constexpr std::uint32_t gather_entry_of(const gather_args& a, std::uint32_t blk) noexcept
{
  if (a.first_block[a.n] == a.n) { return blk; }
  std::uint32_t lo = 0;
  std::uint32_t hi = a.n;  // first_block[lo] <= blk < first_block[hi]
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (a.first_block[mid] <= blk) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

using ferry::backend::cuda_kernel;
using ferry::backend::hip_kernel;
using ferry::backend::host_kernel;

/// The gather kernel (kernels/d2h_gather.cu; host: src/d2h_gather_host.cpp), one GPU kernel per vector
/// width: `f` is vec_form(gather_args::vecs_per_thread) (an unaligned entry
/// takes the byte path inside every form; the host backend has one body).
host_kernel<gather_args> gather_publish_kernel(ferry::backend::host_tag, copy_form f);
cuda_kernel<gather_args> gather_publish_kernel(ferry::backend::cuda_tag, copy_form f);
hip_kernel<gather_args> gather_publish_kernel(ferry::backend::hip_tag, copy_form f);

}  // namespace ferry::d2h::detail
