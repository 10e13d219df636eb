// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the copy kernels copy_entry and copy_entry_publish (body in copy_entry.cuh; getters declared
// in ferry/d2h/detail/kernels.hpp). tests/ptx/check_ptx.cmake names both: each executes griddepcontrol.wait,
// and copy_entry_publish contains st.release.sys and no __threadfence / volatile store.
#include "d2h/copy/copy_entry.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

// Every kernel here may be launched programmatically (launch_config::programmatic): each thread first lets
// the next kernel on the stream be scheduled, then waits until the kernel ahead of it has completed and
// its writes are visible (backend/grid_dependency.hpp) -- the same join as a kernel boundary -- before
// touching the cursor, the source or the ring. Without the launch attribute both are no-ops.
// One small kernel per copy form (launch_shape.hpp, copy_form): no run-time dispatch on V or on the alignment.

/// Any grid; copy only. The publication that covers this entry is a later kernel on the same stream.
template <copy_form F>
__global__ void copy_entry(copy_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { ferry::backend::grid_dependency_wait(); }
  copy_by_form<F>(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

/// One block. Copy, join the block, then (if head_n > 0) thread 0 publishes. No grid join is needed:
/// the block barrier joins every writer of this entry, and earlier entries' writers are joined by the
/// kernel boundaries (or grid_dependency_wait) before this kernel touched anything (stream order).
template <copy_form F>
__global__ void copy_entry_publish(copy_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { ferry::backend::grid_dependency_wait(); }
  copy_by_form<F>(a, 0U, 1U, threadIdx.x, blockDim.x);
  if (a.head_n != 0) {
    __syncthreads();  // the writer join: every payload store of the block happens-before thread 0's release
    if (threadIdx.x == 0) { publish_phase(a.dst.state, a.head, a.head_n); }
  }
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<copy_args> copy_entry_kernel(FERRY_KERNEL_TAG, copy_form f)
{
  using ferry::kernels::d2h::copy_entry;
  const void* fn = ferry::kernels::form_instance<copy_form::bytes, copy_form::v1, copy_form::v2, copy_form::v4,
                                                 copy_form::v8, copy_form::v1_lean, copy_form::v2_lean,
                                                 copy_form::v4_lean, copy_form::v8_lean>(
    f, [](auto F) { return reinterpret_cast<const void*>(&copy_entry<decltype(F)::value>); });
  return {fn, "d2h_copy_entry"};
}

/// The lean forms are copy_entry's only: they get the byte form here.
FERRY_KERNEL_HANDLE<copy_args> copy_entry_publish_kernel(FERRY_KERNEL_TAG, copy_form f)
{
  using ferry::kernels::d2h::copy_entry_publish;
  const void* fn = ferry::kernels::form_instance<copy_form::bytes, copy_form::v1, copy_form::v2, copy_form::v4,
                                                 copy_form::v8>(
    f, [](auto F) { return reinterpret_cast<const void*>(&copy_entry_publish<decltype(F)::value>); });
  return {fn, "d2h_copy_entry_publish"};
}

}  // namespace ferry::d2h::detail
