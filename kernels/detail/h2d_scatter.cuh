// SPDX-License-Identifier: Apache-2.0
// Bodies of the H2D scatter and checksum kernels, shared by the GPU wrappers (kernels/h2d_scatter.cu) and
// the host backend (src/h2d_host_kernels.cpp). Per-thread work over a tile: no block barrier needed.
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/h2d/detail/scatter_params.hpp>

#include <cstdint>

namespace ferry::kernels::h2d {

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
using vec16 = ulonglong2;  // one 16-byte load/store (ld.global.v2.u64 / st.global.v2.u64)
#else
struct alignas(16) vec16 {
  std::uint64_t x, y;
};
#endif

/// Copies `len` bytes; 16-byte moves when both ends are 16-byte aligned, otherwise 8/1-byte moves.
/// Thread `thread` of `threads` does its share. Bit-preserving (raw bytes, no conversions).
FERRY_HD inline void copy_share(unsigned char* dst, const unsigned char* src, std::uint64_t len, std::uint32_t thread,
                                std::uint32_t threads)
{
  const auto mis = (reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src));
  std::uint64_t done = 0;
  if ((mis & 15u) == 0) {
    // Up to `unroll` independent 16-byte loads in flight per thread before the stores: the compiler cannot
    // hoist a load above a store that may alias it, and a zero-copy load crosses PCIe (~1 us).
    constexpr std::uint32_t unroll = 4;
    const std::uint64_t vecs = len / 16;
    auto* d = reinterpret_cast<vec16*>(dst);
    const auto* s = reinterpret_cast<const vec16*>(src);
    for (std::uint64_t base = thread; base < vecs; base += static_cast<std::uint64_t>(threads) * unroll) {
      vec16 r[unroll];
      for (std::uint32_t u = 0; u < unroll; ++u) {
        const std::uint64_t i = base + static_cast<std::uint64_t>(u) * threads;
        if (i < vecs) { r[u] = s[i]; }
      }
      for (std::uint32_t u = 0; u < unroll; ++u) {
        const std::uint64_t i = base + static_cast<std::uint64_t>(u) * threads;
        if (i < vecs) { d[i] = r[u]; }
      }
    }
    done = vecs * 16;
  } else if ((mis & 7u) == 0) {
    const std::uint64_t words = len / 8;
    auto* d = reinterpret_cast<std::uint64_t*>(dst);
    const auto* s = reinterpret_cast<const std::uint64_t*>(src);
    for (std::uint64_t i = thread; i < words; i += threads) { d[i] = s[i]; }
    done = words * 8;
  }
  for (std::uint64_t i = done + thread; i < len; i += threads) { dst[i] = src[i]; }
}

/// Scatter: block `block` of `blocks` walks the tile table with a grid stride. A tile beyond the member's
/// published count (from the arena header) is skipped, so bytes past the prefix stay untouched.
FERRY_HD inline void scatter_share(const ferry::h2d::detail::scatter_params& p, std::uint32_t block,
                                   std::uint32_t blocks, std::uint32_t thread, std::uint32_t threads)
{
  for (std::uint32_t t = block; t < p.tile_count; t += blocks) {
    const ferry::h2d::detail::tile_desc td = p.tiles[t];
    const std::int64_t offset = p.header[2 * td.member];
    const std::int64_t count = p.header[2 * td.member + 1];
    const std::uint64_t start = static_cast<std::uint64_t>(td.tile) * p.tile_bytes;
    if (count <= 0 || start >= static_cast<std::uint64_t>(count)) { continue; }
    const std::uint64_t rest = static_cast<std::uint64_t>(count) - start;
    const std::uint64_t len = rest < p.tile_bytes ? rest : p.tile_bytes;
    auto* dst = reinterpret_cast<unsigned char*>(p.dst_table[td.member]) + start;
    const unsigned char* src = p.arena + offset + start;
    copy_share(dst, src, len, thread, threads);
  }
}

/// Checksum: block `member` XORs its member's bytes; each thread writes its own partial (no atomics).
FERRY_HD inline void checksum_share(const ferry::h2d::detail::checksum_params& p, std::uint32_t member,
                                    std::uint32_t thread, std::uint32_t threads)
{
  const auto* src = reinterpret_cast<const unsigned char*>(p.src_table[member]);
  const std::uint64_t len = p.bytes_table[member];
  std::uint64_t acc = 0;
  std::uint64_t done = 0;
  if ((reinterpret_cast<std::uintptr_t>(src) & 15u) == 0) {
    const auto* s = reinterpret_cast<const vec16*>(src);
    const std::uint64_t vecs = len / 16;
    for (std::uint64_t i = thread; i < vecs; i += threads) {
      const vec16 v = s[i];
      acc ^= v.x * 31u + v.y;
    }
    done = vecs * 16;
  }
  for (std::uint64_t i = done + thread; i < len; i += threads) { acc ^= static_cast<std::uint64_t>(src[i]) << (i % 8); }
  p.out[static_cast<std::uint64_t>(member) * threads + thread] = acc;
}

}  // namespace ferry::kernels::h2d
