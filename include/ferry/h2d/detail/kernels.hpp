// SPDX-License-Identifier: Apache-2.0
// H2D kernels, one getter per backend family. Defined in kernels/h2d_scatter.cu (CUDA, HIP) and
// src/h2d_host_kernels.cpp (host).
//   scatter_kernel : grid-stride over the tile table; each tile copies its share of one member's published
//                    prefix from the arena to the member's fixed device address (16-byte moves when aligned).
//   checksum_kernel: a first consumer for tests/benchmarks (reads every byte it is told to).
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/h2d/detail/scatter_params.hpp>

namespace ferry::h2d::detail {

ferry::backend::host_kernel<scatter_params> scatter_kernel(ferry::backend::host_tag);
ferry::backend::cuda_kernel<scatter_params> scatter_kernel(ferry::backend::cuda_tag);
ferry::backend::hip_kernel<scatter_params> scatter_kernel(ferry::backend::hip_tag);

ferry::backend::host_kernel<checksum_params> checksum_kernel(ferry::backend::host_tag);
ferry::backend::cuda_kernel<checksum_params> checksum_kernel(ferry::backend::cuda_tag);
ferry::backend::hip_kernel<checksum_params> checksum_kernel(ferry::backend::hip_tag);

}  // namespace ferry::h2d::detail
