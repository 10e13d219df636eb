// SPDX-License-Identifier: Apache-2.0
// TRANSITIONAL: the device clock is test/benchmark instrumentation and lives in the testing tree,
// <ferry/testing/device_clock.cuh> (namespace ferry::testing; link ferry::testing). This keeps benchmark
// kernels that include it by its old name compiling. Delete it once none does.
#pragma once

#include <ferry/testing/device_clock.cuh>

#if defined(__CUDACC__) && !defined(__HIP__) && !defined(__HIPCC__)
namespace ferry::kernels {
using ferry::testing::globaltimer_ns;
using ferry::testing::spin_until;
}  // namespace ferry::kernels
#endif
