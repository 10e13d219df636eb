// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the test/benchmark checksum kernel (ferry/testing/checksum.hpp; part of ferry::testing,
// never installed).
#include "../detail/gpu_kernel.cuh"
#include "detail/checksum.cuh"

namespace ferry::testing::kernels {

__global__ void checksum(ferry::testing::checksum_params p)
{
  checksum_share(p, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace ferry::testing::kernels

namespace ferry::testing {

FERRY_KERNEL_HANDLE<checksum_params> checksum_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::testing::kernels::checksum), "h2d_checksum"};
}

}  // namespace ferry::testing
