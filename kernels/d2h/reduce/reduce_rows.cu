// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the reduce_rows kernel (body in reduce_rows.cuh; getter declared in
// ferry/d2h/detail/kernels.hpp). tests/ptx/check_ptx.cmake names it: it executes griddepcontrol.wait (it may be
// launched programmatically, as the copy kernels) and publishes nothing.
#include "d2h/reduce/reduce_rows.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

/// One instantiation per reducer (a.r.op is Op).
template <ferry::d2h::reduce_op Op>
__global__ void __launch_bounds__(ferry::d2h::detail::reduce_threads, ferry::d2h::detail::reduce_min_blocks)
    reduce_rows(reduce_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  ferry::backend::grid_dependency_wait();  // the cursor, the selection and the source after the kernel ahead
  reduce_rows_block<Op>(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<reduce_args> reduce_rows_kernel(FERRY_KERNEL_TAG, reduce_op op)
{
  using ferry::kernels::d2h::reduce_rows;
  const void* fn =
    ferry::kernels::form_instance<reduce_op::topk, reduce_op::fp8_e4m3, reduce_op::mean, reduce_op::stats>(
      op, [](auto Op) { return reinterpret_cast<const void*>(&reduce_rows<decltype(Op)::value>); });
  return {fn, "d2h_reduce_rows"};
}

}  // namespace ferry::d2h::detail
