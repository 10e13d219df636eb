// SPDX-License-Identifier: Apache-2.0
// The H2D scatter kernel's getter, one per backend family: scatter_kernel, the kernel scatter in
// kernels/h2d/scatter/ (body scatter.cuh, wrappers scatter.cu for CUDA and HIP, scatter_host.cpp for the host
// backend). Grid-stride over the tile table (grid: scatter_grid, plan.hpp); each tile copies its share of one
// member's published prefix from the arena to the member's fixed device address (16-byte moves when aligned).
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/h2d/detail/scatter_params.hpp>

namespace ferry::h2d::detail {

ferry::backend::host_kernel<scatter_params> scatter_kernel(ferry::backend::host_tag);
ferry::backend::cuda_kernel<scatter_params> scatter_kernel(ferry::backend::cuda_tag);
ferry::backend::hip_kernel<scatter_params> scatter_kernel(ferry::backend::hip_tag);

}  // namespace ferry::h2d::detail
