// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the replay token's one-thread kernels arm_replay and claim_replay (bodies in
// replay_token.cuh; getters declared in ferry/d2h/detail/kernels.hpp). tests/ptx/check_ptx.cmake names both:
// each executes griddepcontrol.wait (launched plainly: a no-op then), and each releases into the host-visible
// report (claim_replay: an unplanned launch; arm_replay: the token queue's overflow), so both contain
// st.release.sys and no __threadfence / volatile store.
#include "d2h/replay/replay_token.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

__global__ void arm_replay(ferry::d2h::detail::replay_token_args a)
{
  ferry::backend::grid_dependency_wait();
  if (threadIdx.x == 0 && blockIdx.x == 0) { arm_replay_body(a); }
}

__global__ void claim_replay(ferry::d2h::detail::replay_token_args a)
{
  ferry::backend::grid_dependency_wait();
  if (threadIdx.x == 0 && blockIdx.x == 0) { claim_replay_body(a); }
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<replay_token_args> arm_replay_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::arm_replay), "d2h_arm_replay"};
}

FERRY_KERNEL_HANDLE<replay_token_args> claim_replay_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::claim_replay), "d2h_claim_replay"};
}

}  // namespace ferry::d2h::detail
