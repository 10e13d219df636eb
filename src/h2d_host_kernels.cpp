// SPDX-License-Identifier: Apache-2.0
// Host-backend version of the H2D scatter kernel: the same body, the block's threads run one after another.
#include "../kernels/detail/h2d_scatter.cuh"

#include <ferry/backend/host/backend.hpp>
#include <ferry/h2d/detail/kernels.hpp>

namespace ferry::h2d::detail {

namespace {
void scatter_body(const ferry::backend::host_detail::launch_ctx& ctx, scatter_params p)
{
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) {
    kernels::h2d::scatter_share(p, ctx.block_idx.x, ctx.grid_dim.x, t, ctx.block_dim.x);
  }
}
}  // namespace

ferry::backend::host_kernel<scatter_params> scatter_kernel(ferry::backend::host_tag)
{
  return {&scatter_body, "h2d_scatter"};
}

}  // namespace ferry::h2d::detail
