// SPDX-License-Identifier: Apache-2.0
// GPU wrappers of the H2D kernels (see ferry/h2d/detail/kernels.hpp). One compiled scatter kernel serves
// every group; its destination and tile tables are fixed device arrays built at initialization.
#include "detail/gpu_kernel.cuh"
#include "detail/h2d_scatter.cuh"

#include <ferry/h2d/detail/kernels.hpp>

namespace ferry::kernels::h2d {

__global__ void scatter(ferry::h2d::detail::scatter_params p)
{
  scatter_share(p, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

__global__ void checksum(ferry::h2d::detail::checksum_params p)
{
  checksum_share(p, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace ferry::kernels::h2d

namespace ferry::h2d::detail {

FERRY_KERNEL_HANDLE<scatter_params> scatter_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::h2d::scatter), "h2d_scatter"};
}

FERRY_KERNEL_HANDLE<checksum_params> checksum_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::h2d::checksum), "h2d_checksum"};
}

}  // namespace ferry::h2d::detail
