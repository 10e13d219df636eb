// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the H2D scatter kernel (body in scatter.cuh; getter declared in ferry/h2d/detail/kernels.hpp).
// One compiled scatter kernel serves every group; its destination and tile tables are fixed device arrays
// built at initialization.
#include "detail/gpu_kernel.cuh"
#include "h2d/scatter/scatter.cuh"

#include <ferry/h2d/detail/kernels.hpp>

namespace ferry::kernels::h2d {

__global__ void scatter(ferry::h2d::detail::scatter_params p)
{
  scatter_share(p, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

}  // namespace ferry::kernels::h2d

namespace ferry::h2d::detail {

FERRY_KERNEL_HANDLE<scatter_params> scatter_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::h2d::scatter), "h2d_scatter"};
}

}  // namespace ferry::h2d::detail
