// SPDX-License-Identifier: Apache-2.0
// Test and benchmark instrumentation (not installed): the checksum kernel, a realistic cheap "first
// consumer" of published H2D data. Block b reads chunk b (its share of one member, 16-byte loads when
// aligned, several in flight per thread) and XORs it; each thread writes its partial to
// out[b * blockDim + thread]. The first `inline_max` chunks travel in the kernel parameters (no dependent
// table load); chunks beyond come from the device table `more`.
// Defined in kernels/testing/checksum.cu (CUDA, HIP) and tests/support/src/checksum_host.cpp (host);
// link ferry::testing. No fmt / error headers here: kernel translation units include this file.
#pragma once

#include <ferry/backend/types.hpp>

#include <cstdint>

namespace ferry::testing {

/// One block of the checksum: `bytes` bytes at device address `src`.
struct checksum_chunk {
  std::uint64_t src;
  std::uint64_t bytes;
};

/// Parameters of the checksum kernel (trivially copyable).
struct checksum_params {
  static constexpr std::uint32_t inline_max = 96;
  checksum_chunk chunk[inline_max];
  const checksum_chunk* more;  ///< chunks [inline_max, count) (device), or null
  std::uint32_t count;
  std::uint64_t* out;          ///< count * threads partials
};

/// The checksum kernel of each backend family (launch with one block per chunk).
ferry::backend::host_kernel<checksum_params> checksum_kernel(ferry::backend::host_tag);
ferry::backend::cuda_kernel<checksum_params> checksum_kernel(ferry::backend::cuda_tag);
ferry::backend::hip_kernel<checksum_params> checksum_kernel(ferry::backend::hip_tag);

}  // namespace ferry::testing
