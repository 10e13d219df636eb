// SPDX-License-Identifier: Apache-2.0
// The GPU's global nanosecond timer, for the deliberate delays of test and benchmark kernels (the probe's
// late producer, the benchmark's simulated layer). CUDA device code only: HIP has no %globaltimer.
// Test instrumentation: not installed; reached through the CMake target ferry::testing.
#pragma once

#include <cstdint>

namespace ferry::testing {

#if defined(__CUDACC__) && !defined(__HIP__) && !defined(__HIPCC__)
/// %globaltimer: nanoseconds, the same clock on every SM.
__device__ inline std::uint64_t globaltimer_ns()
{
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Returns once at least `ns` nanoseconds have passed since `start` (a globaltimer_ns() value).
__device__ inline void spin_until(std::uint64_t start, std::uint64_t ns)
{
  while (globaltimer_ns() - start < ns) {
  }
}
#endif

}  // namespace ferry::testing
