// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the gather kernel (body in detail/d2h_gather.cuh; getter in ferry/d2h/detail/gather.hpp).
// Its name contains "publish": tests/ptx/check_ptx.cmake asserts it contains st.release.sys, no
// __threadfence / volatile store, and griddepcontrol.wait.
#include "detail/d2h_gather.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>

namespace ferry::kernels::d2h {

/// One launch per flushed batch: block b copies its share of its entry (gather_commit), then, when the
/// launch publishes, the block barrier joins the block's threads and the acq_rel join counter joins the
/// blocks; the last block's thread 0 releases published_head (system scope). Earlier writers on the stream
/// are joined by the kernel boundary (or grid_dependency_wait) before any block touches the cursor.
/// One instantiation per V (copy_form; a.vecs_per_thread is V).
template <int V>
__global__ void gather_publish(gather_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { ferry::backend::grid_dependency_wait(); }
  gather_block_phase<V>(a, blockIdx.x, threadIdx.x, blockDim.x);
  if (a.head_n != 0) {
    __syncthreads();  // this block's stores happen-before its thread 0's arrival (release)
    if (threadIdx.x == 0 && gather_join_arrive(a.dst.state, gridDim.x)) {
      gather_release(a);  // the last arrival acquired every block's stores (and cursor reads)
    }
  }
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<gather_args> gather_publish_kernel(FERRY_KERNEL_TAG, copy_form f)
{
  namespace k = ferry::kernels::d2h;
  switch (f) {
    case copy_form::v2: return {reinterpret_cast<const void*>(&k::gather_publish<2>), "d2h_gather_publish_v2"};
    case copy_form::v4: return {reinterpret_cast<const void*>(&k::gather_publish<4>), "d2h_gather_publish_v4"};
    case copy_form::v8: return {reinterpret_cast<const void*>(&k::gather_publish<8>), "d2h_gather_publish_v8"};
    case copy_form::v1:
    case copy_form::bytes: break;  // unaligned entries take the byte path inside every form
    case copy_form::v1_once:
    case copy_form::v2_once:
    case copy_form::v4_once:
    case copy_form::v8_once: break;  // copy_entry_kernel's forms only
  }
  return {reinterpret_cast<const void*>(&k::gather_publish<1>), "d2h_gather_publish_v1"};
}

}  // namespace ferry::d2h::detail
