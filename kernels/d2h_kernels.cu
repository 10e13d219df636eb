// SPDX-License-Identifier: Apache-2.0
// GPU wrappers of the D2H kernels (bodies in detail/d2h_kernels.cuh; getters in ferry/d2h/detail/kernels.hpp).
// Kernels that publish have "publish" in their name: tests/ptx/check_ptx.cmake asserts they contain
// st.release.sys and no __threadfence / volatile store.
#include "detail/d2h_kernels.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

// Every kernel here may be launched programmatically (launch_config::programmatic): each thread first lets
// the next kernel on the stream be scheduled, then waits until the kernel ahead of it has completed and
// its writes are visible (backend/grid_dependency.hpp) -- the same join as a kernel boundary -- before
// touching the cursor, the source or the ring. Without the launch attribute both are no-ops.
using ferry::backend::grid_dependency_launch_dependents;
using ferry::backend::grid_dependency_wait;

/// One block. Copy, join the block, then (if head_n > 0) thread 0 publishes. No grid join is needed:
/// the block barrier joins every writer of this entry, and earlier entries' writers are joined by the
/// kernel boundaries (or grid_dependency_wait) before this kernel touched anything (stream order).
__global__ void copy_entry_publish(copy_args a)
{
  grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { grid_dependency_wait(); }
  copy_commit_phase(a, 0U, 1U, threadIdx.x, blockDim.x);
  if (a.head_n != 0) {
    __syncthreads();  // the writer join: every payload store of the block happens-before thread 0's release
    if (threadIdx.x == 0) { publish_phase(a.dst.state, a.head, a.head_n); }
  }
}

/// Any grid; copy only. The publication that covers this entry is a later kernel on the same stream.
__global__ void copy_entry(copy_args a)
{
  grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { grid_dependency_wait(); }
  copy_commit_phase(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

/// One thread. Stream order (the kernel boundary, or grid_dependency_wait under a programmatic launch) is
/// the join: every kernel enqueued before it on the stream has completed, and its writes happen-before
/// this thread's release.
__global__ void publish_head(head_args a)
{
  grid_dependency_launch_dependents();
  grid_dependency_wait();
  if (threadIdx.x == 0 && blockIdx.x == 0) { publish_head_body(a); }
}

__global__ void commit_check(ferry::d2h::detail::commit_check_args a)
{
  grid_dependency_wait();  // launched plainly (a no-op then); every D2H kernel carries the join (tests/ptx)
  if (threadIdx.x == 0 && blockIdx.x == 0) { commit_check_body(a); }
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<copy_args> copy_entry_publish_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::copy_entry_publish), "d2h_copy_entry_publish"};
}
FERRY_KERNEL_HANDLE<copy_args> copy_entry_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::copy_entry), "d2h_copy_entry"};
}
FERRY_KERNEL_HANDLE<head_args> publish_head_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::publish_head), "d2h_publish_head"};
}

FERRY_KERNEL_HANDLE<commit_check_args> commit_check_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::commit_check), "d2h_commit_check"};
}

}  // namespace ferry::d2h::detail
