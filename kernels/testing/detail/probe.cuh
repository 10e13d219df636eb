// SPDX-License-Identifier: Apache-2.0
// Bodies of the probe kernels, shared by the GPU wrappers (kernels/testing/probe.cu) and the host backend
// (tests/support/src/probe_host.cpp). Phase functions take a thread index; the wrappers put the block join between.
#pragma once

#include <ferry/backend/system_atomic.hpp>
#include <ferry/testing/pattern.hpp>

#include <cstdint>

namespace ferry::testing::probe::kernels {

FERRY_HD inline void publish_write(std::uint64_t* payload, std::uint64_t words, std::uint64_t seq,
                                   std::uint32_t thread, std::uint32_t threads)
{
  for (std::uint64_t i = thread; i < words; i += threads) { payload[i] = ferry::testing::pattern_word(seq, i); }
}

/// After the block join: one thread publishes with a system-scope release.
FERRY_HD inline void publish_release(std::uint64_t* flag, std::uint64_t seq)
{
  ferry::backend::store_release_system(flag, seq);
}

/// One thread: wait for the CPU's release.
FERRY_HD inline void consume_acquire(const std::uint64_t* flag, std::uint64_t seq)
{
  while (ferry::backend::load_acquire_system(flag) < seq) {
  }
}

FERRY_HD inline void consume_copy(const std::uint64_t* src, std::uint64_t* dst, std::uint64_t words,
                                  std::uint32_t thread, std::uint32_t threads)
{
  for (std::uint64_t i = thread; i < words; i += threads) { dst[i] = src[i]; }
}

}  // namespace ferry::testing::probe::kernels
