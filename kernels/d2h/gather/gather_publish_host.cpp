// SPDX-License-Identifier: Apache-2.0
// Host-backend wrapper of the gather_publish kernel: the GPU order (gather_publish.cuh: entry lookup, cursor
// read, commit by block 0, payload stores, block join, acq_rel arrival, release by the last block), one block
// at a time (the host backend runs a grid's blocks in order).
#include "d2h/gather/gather_publish.cuh"

#include <ferry/backend/kernel.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::d2h::detail {

namespace {
void gather_publish_host(const ferry::backend::host_launch_ctx& ctx, gather_args a)
{
  kernels::d2h::gather_block_host(a, ctx.block_idx.x, ctx.grid_dim.x, ctx.block_dim.x);
}
}  // namespace

host_kernel<gather_args> gather_publish_kernel(host_tag, copy_form)
{
  return {&gather_publish_host, "d2h_gather_publish"};
}

}  // namespace ferry::d2h::detail
