// SPDX-License-Identifier: Apache-2.0
// Host-backend wrapper of the one-thread kernels publish_head and commit_check: the same bodies
// (publish.cuh), run by block 0.
#include "d2h/publish/publish.cuh"

#include <ferry/backend/kernel.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::d2h::detail {

namespace {
/// Block 0 runs `Body` (the kernel's one thread); any further block, as on the GPU, does nothing.
template <class Args, void (*Body)(const Args&) noexcept>
void first_block(const ferry::backend::host_launch_ctx& ctx, Args a)
{
  if (ctx.block_idx.x == 0) { Body(a); }
}
}  // namespace

host_kernel<head_args> publish_head_kernel(host_tag)
{
  return {&first_block<head_args, &kernels::d2h::publish_head_body>, "d2h_publish_head"};
}
host_kernel<commit_check_args> commit_check_kernel(host_tag)
{
  return {&first_block<commit_check_args, &kernels::d2h::commit_check_body>, "d2h_commit_check"};
}

}  // namespace ferry::d2h::detail
