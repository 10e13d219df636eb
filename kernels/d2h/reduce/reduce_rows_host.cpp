// SPDX-License-Identifier: Apache-2.0
// Host-backend wrapper of the reduce_rows kernel: the GPU kernel's order (reduce_rows.cuh), one block at a time.
#include "d2h/reduce/reduce_rows.cuh"

#include <ferry/backend/kernel.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::d2h::detail {

namespace {
void reduce_rows_host(const ferry::backend::host_launch_ctx& ctx, reduce_args a)
{
  kernels::d2h::reduce_rows_block_host(a, ctx.block_idx.x, ctx.grid_dim.x);
}
}  // namespace

host_kernel<reduce_args> reduce_rows_kernel(host_tag, reduce_op) { return {&reduce_rows_host, "d2h_reduce_rows"}; }

}  // namespace ferry::d2h::detail
