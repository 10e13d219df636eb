// SPDX-License-Identifier: Apache-2.0
// Host-backend wrapper of the select_rows kernel: the GPU kernel's order (select_rows.cuh), one block at a time.
#include "d2h/select/select_rows.cuh"

#include <ferry/backend/kernel.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::d2h::detail {

namespace {
void select_rows_host(const ferry::backend::host_launch_ctx& ctx, select_args a)
{
  kernels::d2h::select_rows_block_host(a, ctx.block_idx.x, ctx.grid_dim.x);
}
}  // namespace

host_kernel<select_args> select_rows_kernel(host_tag) { return {&select_rows_host, "d2h_select_rows"}; }

}  // namespace ferry::d2h::detail
