// SPDX-License-Identifier: Apache-2.0
// Host-backend versions of the D2H kernels: the GPU kernels' order (kernels/detail/d2h_kernels.cuh,
// copy_commit: size, cursor read, commit by the grid's first thread, payload stores), one block at a time
// (the host backend runs a grid's blocks in order), the block join between the copy and the fused release.
#include "../kernels/detail/d2h_kernels.cuh"

#include <ferry/backend/host/backend.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::d2h::detail {

namespace {
using ferry::backend::host_detail::launch_ctx;

void copy_entry_publish_body(const launch_ctx& ctx, copy_args a)
{
  // Phase 1: the (single) block copies, its thread 0 committing the cursor first (copy_commit).
  kernels::d2h::copy_commit_block_host(a, 0, 1, ctx.block_dim.x);
  // Block join, then phase 2: thread 0 publishes.
  if (a.head_n != 0) { kernels::d2h::publish_phase(a.dst.state, a.head, a.head_n); }
}

void copy_entry_body(const launch_ctx& ctx, copy_args a)
{
  kernels::d2h::copy_commit_block_host(a, ctx.block_idx.x, ctx.grid_dim.x, ctx.block_dim.x);
}

void publish_head_body(const launch_ctx& ctx, head_args a)
{
  if (ctx.block_idx.x == 0) { kernels::d2h::publish_head_body(a); }
}

void commit_check_body(const launch_ctx& ctx, commit_check_args a)
{
  if (ctx.block_idx.x == 0) { kernels::d2h::commit_check_body(a); }
}
}  // namespace

// One body per kernel for every copy_form: copy_commit_block_host reads the alignment and V at run time.
host_kernel<copy_args> copy_entry_publish_kernel(host_tag, copy_form) { return {&copy_entry_publish_body, "d2h_copy_entry_publish"}; }
host_kernel<copy_args> copy_entry_kernel(host_tag, copy_form) { return {&copy_entry_body, "d2h_copy_entry"}; }
host_kernel<head_args> publish_head_kernel(host_tag) { return {&publish_head_body, "d2h_publish_head"}; }
host_kernel<commit_check_args> commit_check_kernel(host_tag) { return {&commit_check_body, "d2h_commit_check"}; }

}  // namespace ferry::d2h::detail
