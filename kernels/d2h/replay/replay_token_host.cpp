// SPDX-License-Identifier: Apache-2.0
// Host-backend wrapper of the replay token's one-thread kernels arm_replay and claim_replay: the same bodies
// (replay_token.cuh), run by block 0.
#include "d2h/replay/replay_token.cuh"

#include <ferry/backend/kernel.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::d2h::detail {

namespace {
template <void (*Body)(const replay_token_args&) noexcept>
void first_block(const ferry::backend::host_launch_ctx& ctx, replay_token_args a)
{
  if (ctx.block_idx.x == 0) { Body(a); }
}
}  // namespace

host_kernel<replay_token_args> arm_replay_kernel(host_tag)
{
  return {&first_block<&kernels::d2h::arm_replay_body>, "d2h_arm_replay"};
}
host_kernel<replay_token_args> claim_replay_kernel(host_tag)
{
  return {&first_block<&kernels::d2h::claim_replay_body>, "d2h_claim_replay"};
}

}  // namespace ferry::d2h::detail
