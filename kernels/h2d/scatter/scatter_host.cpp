// SPDX-License-Identifier: Apache-2.0
// Host-backend wrapper of the H2D scatter kernel: the same body (scatter.cuh), the block's threads run one
// after another.
#include "h2d/scatter/scatter.cuh"

#include <ferry/backend/kernel.hpp>
#include <ferry/h2d/detail/kernels.hpp>

namespace ferry::h2d::detail {

namespace {
void scatter_host(const ferry::backend::host_launch_ctx& ctx, scatter_params p)
{
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) {
    kernels::h2d::scatter_share(p, ctx.block_idx.x, ctx.grid_dim.x, t, ctx.block_dim.x);
  }
}
}  // namespace

ferry::backend::host_kernel<scatter_params> scatter_kernel(ferry::backend::host_tag)
{
  return {&scatter_host, "h2d_scatter"};
}

}  // namespace ferry::h2d::detail
