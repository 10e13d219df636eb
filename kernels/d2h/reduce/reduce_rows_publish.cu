// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the reduce_rows_publish kernel (body in reduce_rows_publish.cuh; getter declared in
// ferry/d2h/detail/kernels.hpp). tests/ptx/check_ptx.cmake names it: st.release.sys (the optional release in its
// last block, as the row gather's), no __threadfence / volatile store, and griddepcontrol.wait.
#include "d2h/reduce/reduce_rows_publish.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

/// One instantiation per reducer with a record per row (a.r.op is Op: topk, fp8_e4m3).
template <ferry::d2h::reduce_op Op>
__global__ void __launch_bounds__(ferry::d2h::detail::reduce_threads, ferry::d2h::detail::reduce_min_blocks)
    reduce_rows_publish(gather_rows_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { ferry::backend::grid_dependency_wait(); }  // the cursor, selection and sources
  reduce_rows_publish_block<Op>(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<gather_rows_args> reduce_rows_publish_kernel(FERRY_KERNEL_TAG, reduce_op op)
{
  using ferry::kernels::d2h::reduce_rows_publish;
  const void* fn = ferry::kernels::form_instance<reduce_op::topk, reduce_op::fp8_e4m3>(
    op, [](auto Op) { return reinterpret_cast<const void*>(&reduce_rows_publish<decltype(Op)::value>); });
  return {fn, "d2h_reduce_rows_publish"};
}

}  // namespace ferry::d2h::detail
