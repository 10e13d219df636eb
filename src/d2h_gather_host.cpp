// SPDX-License-Identifier: Apache-2.0
// Host-backend version of the gather kernel: the GPU order (kernels/detail/d2h_gather.cuh: entry lookup,
// cursor read, commit by block 0, payload stores, block join, acq_rel arrival, release by the last block),
// one block at a time (the host backend runs a grid's blocks in order).
#include "../kernels/detail/d2h_gather.cuh"

#include <ferry/backend/host/backend.hpp>
#include <ferry/d2h/detail/gather.hpp>

namespace ferry::d2h::detail {

namespace {
using ferry::backend::host_detail::launch_ctx;

void gather_publish_body(const launch_ctx& ctx, gather_args a)
{
  kernels::d2h::gather_block_host(a, ctx.block_idx.x, ctx.grid_dim.x, ctx.block_dim.x);
}
}  // namespace

host_kernel<gather_args> gather_publish_kernel(ferry::backend::host_tag, copy_form)
{
  return {&gather_publish_body, "d2h_gather_publish"};
}

}  // namespace ferry::d2h::detail
