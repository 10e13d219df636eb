// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the gather_publish kernel (body in gather_publish.cuh; getter declared in
// ferry/d2h/detail/kernels.hpp). tests/ptx/check_ptx.cmake names it: st.release.sys, no __threadfence /
// volatile store, and griddepcontrol.wait.
#include "d2h/gather/gather_publish.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

using ferry::d2h::detail::copy_form;

/// One launch per flushed batch: block b copies its share of its entry (gather_commit), then, when the
/// launch publishes, the block barrier joins the block's threads and the acq_rel join counter joins the
/// blocks; the last block's thread 0 releases published_head (system scope). Earlier writers on the stream
/// are joined by the kernel boundary (or grid_dependency_wait) before any block touches the cursor.
/// One instantiation per vector form (copy_form vN; a.vecs_per_thread is N).
template <copy_form F>
__global__ void gather_publish(gather_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { ferry::backend::grid_dependency_wait(); }
  gather_block_phase<static_cast<int>(ferry::d2h::detail::form_vecs(F))>(a, blockIdx.x, threadIdx.x, blockDim.x);
  if (a.rel.head_n != 0) {
    __syncthreads();  // this block's stores happen-before its thread 0's arrival (release)
    if (threadIdx.x == 0 && gather_join_arrive(a.dst.state, gridDim.x)) {
      gather_release(a.rel, a.dst);  // the last arrival acquired every block's stores (and cursor reads)
    }
  }
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

/// Unaligned entries take the byte path inside every form; bytes and the lean forms get v1.
FERRY_KERNEL_HANDLE<gather_args> gather_publish_kernel(FERRY_KERNEL_TAG, copy_form f)
{
  using ferry::kernels::d2h::gather_publish;
  const void* fn = ferry::kernels::form_instance<copy_form::v1, copy_form::v2, copy_form::v4, copy_form::v8>(
    f, [](auto F) { return reinterpret_cast<const void*>(&gather_publish<decltype(F)::value>); });
  return {fn, "d2h_gather_publish"};
}

}  // namespace ferry::d2h::detail
