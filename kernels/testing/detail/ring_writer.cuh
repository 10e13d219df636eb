// SPDX-License-Identifier: Apache-2.0
// Body of the test writer kernel (<ferry/testing/ring_writer.hpp>), shared by the GPU wrapper
// (kernels/testing/ring_writer.cu) and the host backend (tests/support/src/ring_writer_host.cpp). Phase
// functions take a thread index; the wrappers put the block join between them.
#pragma once

#include <ferry/d2h/ring_ref.hpp>
#include <ferry/testing/pattern.hpp>

#include <cstdint>

namespace ferry::testing::kernels {

/// Thread `thread` of `threads` writes its share of the entry's bytes (bounded by the reservation).
FERRY_HD inline void ring_writer_fill(const ferry::d2h::ring_ref& ref, std::uint64_t seq, std::uint64_t bytes,
                                      std::uint32_t thread, std::uint32_t threads)
{
  auto* dst = reinterpret_cast<std::uint8_t*>(ref.data());
  const std::uint64_t n = bytes < ref.capacity() ? bytes : ref.capacity();
  for (std::uint64_t i = thread; i < n; i += threads) { dst[i] = ferry::testing::pattern_byte(seq, i); }
}

/// After the block join, one thread: commits the entry, or (commit == 0) forgets to.
FERRY_HD inline void ring_writer_commit(const ferry::d2h::ring_ref& ref, std::uint64_t bytes, std::uint64_t commit)
{
  if (commit != 0) { ref.commit(bytes); }
}

}  // namespace ferry::testing::kernels
