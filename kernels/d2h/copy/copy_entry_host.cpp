// SPDX-License-Identifier: Apache-2.0
// Host-backend wrapper of the copy kernels copy_entry and copy_entry_publish: the GPU kernels' order
// (copy_entry.cuh, copy_commit: size, cursor read, commit by the grid's first thread, payload stores), one
// block at a time (the host backend runs a grid's blocks in order), the block join between the copy and the
// fused release.
#include "d2h/copy/copy_entry.cuh"

#include <ferry/backend/kernel.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::d2h::detail {

namespace {
using ferry::backend::host_launch_ctx;

void copy_entry_host(const host_launch_ctx& ctx, copy_args a)
{
  kernels::d2h::copy_commit_block_host(a, ctx.block_idx.x, ctx.grid_dim.x, ctx.block_dim.x);
}

void copy_entry_publish_host(const host_launch_ctx& ctx, copy_args a)
{
  // Phase 1: the (single) block copies, its thread 0 committing the cursor first (copy_commit).
  kernels::d2h::copy_commit_block_host(a, 0, 1, ctx.block_dim.x);
  // Block join, then phase 2: thread 0 publishes.
  if (a.head_n != 0) { kernels::d2h::publish_phase(a.dst.state, a.head, a.head_n); }
}
}  // namespace

// One body per kernel for every copy_form: copy_block_host reads the alignment and V at run time.
host_kernel<copy_args> copy_entry_kernel(host_tag, copy_form) { return {&copy_entry_host, "d2h_copy_entry"}; }
host_kernel<copy_args> copy_entry_publish_kernel(host_tag, copy_form)
{
  return {&copy_entry_publish_host, "d2h_copy_entry_publish"};
}

}  // namespace ferry::d2h::detail
