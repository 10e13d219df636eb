// SPDX-License-Identifier: Apache-2.0
// Body of the H2D scatter kernel, shared by the GPU wrapper (scatter.cu) and the host backend's
// (scatter_host.cpp). Per-thread work over a tile: no block barrier needed. Parameters:
// ferry/h2d/detail/scatter_params.hpp; grid: scatter_grid (ferry/h2d/detail/plan.hpp, on the launch rules of
// ferry/detail/launch_rules.hpp); the vector copy: kernels/detail/vector_copy.cuh.
#pragma once

#include "../../detail/vector_copy.cuh"

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/h2d/detail/scatter_params.hpp>

#include <cstdint>

namespace ferry::kernels::h2d {

/// Copies `len` bytes; 16-byte moves when both ends are 16-byte aligned, otherwise 8/1-byte moves.
/// Thread `thread` of `threads` does its share. Bit-preserving (raw bytes, no conversions).
FERRY_HD inline void copy_share(unsigned char* dst, const unsigned char* src, std::uint64_t len, std::uint32_t thread,
                                std::uint32_t threads)
{
  const auto mis = (reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src));
  const auto store = [](auto* d, std::uint64_t i, const auto& v) { d[i] = v; };
  std::uint64_t done = 0;
  if ((mis & 15u) == 0) {
    // Up to `unroll` independent 16-byte loads in flight per thread before the stores (vector_pass).
    constexpr std::uint32_t unroll = 4;
    const std::uint64_t vecs = len / 16;
    auto* d = reinterpret_cast<vec16*>(dst);
    vector_loop<unroll>(reinterpret_cast<const vec16*>(src), std::uint64_t{thread}, std::uint64_t{threads},
                        static_cast<std::uint64_t>(threads) * unroll, vecs, [d] { return d; }, store);
    done = vecs * 16;
  } else if ((mis & 7u) == 0) {
    const std::uint64_t words = len / 8;
    auto* d = reinterpret_cast<std::uint64_t*>(dst);
    vector_loop<1>(reinterpret_cast<const std::uint64_t*>(src), std::uint64_t{thread}, std::uint64_t{threads},
                   std::uint64_t{threads}, words, [d] { return d; }, store);
    done = words * 8;
  }
  copy_tail(dst, src, done + thread, len, threads);
}

/// Most 16-byte loads a thread issues before its first store (registers: 2 x max_inflight x 64 bit).
inline constexpr std::uint32_t max_inflight = 8;

/// Stores the first `n` (< 16) bytes of `v` (kept in registers: no address taken).
FERRY_HD inline void store_partial(unsigned char* dst, const vec16& v, std::uint32_t n)
{
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint64_t w = k < 8 ? v.x : v.y;
    dst[k] = static_cast<unsigned char>(w >> (8 * (k & 7u)));
  }
}

/// Copies the first avail() bytes of [0, load_len) with 16-byte moves (a partial last vector by bytes):
/// every load of a pass is issued before avail() is consulted (vector_pass), so with a speculative
/// `load_len` the count's load overlaps the payload's.
template <class Avail>
FERRY_HD inline void scatter_vecs(unsigned char* dst, const unsigned char* src, std::uint32_t load_len,
                                  std::uint32_t thread, std::uint32_t threads, Avail&& avail_fn)
{
  const std::uint32_t vecs = (load_len + 15u) / 16u;
  vector_loop<max_inflight>(reinterpret_cast<const vec16*>(src), thread, threads, threads * max_inflight, vecs,
                            avail_fn, [dst](std::uint32_t avail, std::uint32_t i, const vec16& v) {
                              const std::uint32_t lo = i * 16u;
                              if (lo + 16u <= avail) {
                                reinterpret_cast<vec16*>(dst)[i] = v;
                              } else if (lo < avail) {
                                store_partial(dst + lo, v, avail - lo);
                              }
                            });
}

/// One tile: bytes [0, min(td.len, count - td.start)) of the tile, `count_of()` giving the member's
/// published count. With `speculative`, the payload loads (up to the capacity-clipped tile, padded to 16
/// bytes: inside the arena) are issued before the count is loaded, so a zero-copy tile costs one PCIe
/// round trip instead of two.
template <class CountFn>
FERRY_HD inline void scatter_tile(const ferry::h2d::detail::scatter_params& p, const ferry::h2d::detail::tile_desc& td,
                                  CountFn&& count_of, bool speculative, std::uint32_t thread, std::uint32_t threads)
{
  const unsigned char* src = p.arena + td.src;
  auto* dst = reinterpret_cast<unsigned char*>(static_cast<std::uintptr_t>(td.dst));
  auto avail_of = [&](std::int64_t c) -> std::uint32_t {
    if (c <= 0 || static_cast<std::uint64_t>(c) <= td.start) { return 0; }
    const std::uint64_t rest = static_cast<std::uint64_t>(c) - td.start;
    return rest < td.len ? static_cast<std::uint32_t>(rest) : td.len;
  };
  if ((td.dst & 15u) != 0) {
    // A misaligned bound destination (e.g. a tensor view): count first, then 8- or 1-byte moves.
    copy_share(dst, src, avail_of(count_of()), thread, threads);
    return;
  }
  // Two code paths, not one loop bounded by `speculative ? len : avail_of(count)`: that bound made every
  // payload load wait for the count (probe bench/device/probes/h2d_scatter_probe.cu).
  if (speculative) {
    scatter_vecs(dst, src, td.len, thread, threads, [&] { return avail_of(count_of()); });
  } else {
    const std::uint32_t avail = avail_of(count_of());
    scatter_vecs(dst, src, avail, thread, threads, [avail] { return avail; });
  }
}

/// Scatter: block `block` of `blocks` walks the tile table with a grid stride (the grid covers every tile
/// in one wave unless the table is very large). Bytes past a member's published count stay untouched.
FERRY_HD inline void scatter_share(const ferry::h2d::detail::scatter_params& p, std::uint32_t block,
                                   std::uint32_t blocks, std::uint32_t thread, std::uint32_t threads)
{
  for (std::uint32_t t = block; t < p.tile_count; t += blocks) {
    const ferry::h2d::detail::tile_desc td = p.tiles[t];
    if (p.counts_inline != 0) {
      // Eager: the count travelled in the parameters; a tile past it reads nothing.
      const auto count = static_cast<std::int64_t>(p.count[td.member]);
      if (count <= 0 || static_cast<std::uint64_t>(count) <= td.start) { continue; }
      scatter_tile(p, td, [count] { return count; }, true, thread, threads);
      continue;
    }
    const bool speculative = p.spec >= 2 || (p.spec == 1 && td.start == 0);
    const std::int64_t* word = p.header + 2 * td.member + 1;
    // The load happens where count_of() is called: inside the copy loop, after the payload loads of the
    // pass. The loop's stores may alias the header, so the compiler cannot hoist it (or, through it, the
    // count's uses) above them -- it did hoist avail_of(count) when the count was loaded out here, and the
    // GPU issues in order: a use of a pending load stalls the warp, so every payload load waited for the
    // header's PCIe round trip (probe h2d_scatter_probe, docs/perf/journal.md). A volatile load in the loop
    // is no cure: the probe measured it far slower (same journal entry).
    scatter_tile(p, td, [word] { return *word; }, speculative, thread, threads);
  }
}

}  // namespace ferry::kernels::h2d
