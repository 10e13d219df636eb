// SPDX-License-Identifier: Apache-2.0
// Body of the test/benchmark checksum kernel (ferry/testing/checksum.hpp), shared by the GPU wrapper
// (kernels/testing/checksum.cu) and the host backend's (tests/support/src/checksum_host.cpp).
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/testing/checksum.hpp>

#include <cstdint>

namespace ferry::testing::kernels {

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
using vec16 = ulonglong2;  // one 16-byte load (ld.global.v2.u64)
#else
struct alignas(16) vec16 {
  std::uint64_t x, y;
};
#endif

/// Block `block` XORs its chunk with 16-byte loads (all of a thread's loads issued before the first use);
/// each thread writes its own partial (no atomics).
FERRY_HD inline void checksum_share(const checksum_params& p, std::uint32_t block, std::uint32_t thread,
                                    std::uint32_t threads)
{
  if (block >= p.count) { return; }
  const checksum_chunk c =
      block < checksum_params::inline_max ? p.chunk[block] : p.more[block - checksum_params::inline_max];
  const auto* src = reinterpret_cast<const unsigned char*>(static_cast<std::uintptr_t>(c.src));
  const std::uint64_t len = c.bytes;
  std::uint64_t acc = 0;
  std::uint64_t done = 0;
  if ((reinterpret_cast<std::uintptr_t>(src) & 15u) == 0) {
    const auto* s = reinterpret_cast<const vec16*>(src);
    const std::uint64_t vecs = len / 16;
    for (std::uint64_t base = thread; base < vecs; base += static_cast<std::uint64_t>(threads) * 4) {
      vec16 r[4];
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#pragma unroll
#endif
      for (std::uint32_t u = 0; u < 4; ++u) {
        const std::uint64_t i = base + static_cast<std::uint64_t>(u) * threads;
        r[u] = i < vecs ? s[i] : vec16{0, 0};
      }
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#pragma unroll
#endif
      for (std::uint32_t u = 0; u < 4; ++u) { acc ^= r[u].x * 31u + r[u].y; }
    }
    done = vecs * 16;
  }
  for (std::uint64_t i = done + thread; i < len; i += threads) { acc ^= static_cast<std::uint64_t>(src[i]) << (i % 8); }
  p.out[static_cast<std::uint64_t>(block) * threads + thread] = acc;
}

}  // namespace ferry::testing::kernels
