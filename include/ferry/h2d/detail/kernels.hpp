// SPDX-License-Identifier: Apache-2.0
// The H2D scatter kernel, one getter per backend family. Defined in kernels/h2d_scatter.cu (CUDA, HIP) and
// src/h2d_host_kernels.cpp (host). Grid-stride over the tile table; each tile copies its share of one
// member's published prefix from the arena to the member's fixed device address (16-byte moves when
// aligned).
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/h2d/detail/scatter_params.hpp>

namespace ferry::h2d::detail {

ferry::backend::host_kernel<scatter_params> scatter_kernel(ferry::backend::host_tag);
ferry::backend::cuda_kernel<scatter_params> scatter_kernel(ferry::backend::cuda_tag);
ferry::backend::hip_kernel<scatter_params> scatter_kernel(ferry::backend::hip_tag);

}  // namespace ferry::h2d::detail
