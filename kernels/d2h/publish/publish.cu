// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the one-thread kernels publish_head and commit_check (bodies in publish.cuh; getters declared
// in ferry/d2h/detail/kernels.hpp). tests/ptx/check_ptx.cmake names both: each executes griddepcontrol.wait
// and contains st.release.sys (published_head; the commit flag) and no __threadfence / volatile store.
#include "d2h/publish/publish.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

/// One thread. Stream order (the kernel boundary, or grid_dependency_wait under a programmatic launch) is
/// the join: every kernel enqueued before it on the stream has completed, and its writes happen-before
/// this thread's release.
__global__ void publish_head(ferry::d2h::detail::head_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  ferry::backend::grid_dependency_wait();
  if (threadIdx.x == 0 && blockIdx.x == 0) { publish_head_body(a); }
}

__global__ void commit_check(ferry::d2h::detail::commit_check_args a)
{
  ferry::backend::grid_dependency_wait();  // launched plainly (a no-op then); every D2H kernel carries the join
                                           // (tests/ptx)
  if (threadIdx.x == 0 && blockIdx.x == 0) { commit_check_body(a); }
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<head_args> publish_head_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::publish_head), "d2h_publish_head"};
}

FERRY_KERNEL_HANDLE<commit_check_args> commit_check_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::commit_check), "d2h_commit_check"};
}

}  // namespace ferry::d2h::detail
