// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the reduce_rows kernel (body in reduce_rows.cuh; getter declared in
// ferry/d2h/detail/kernels.hpp). tests/ptx/check_ptx.cmake names it: it executes griddepcontrol.wait (it may be
// launched programmatically, as the copy kernels) and publishes nothing.
#include "d2h/reduce/reduce_rows.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

__global__ void reduce_rows(reduce_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  ferry::backend::grid_dependency_wait();  // the cursor, the selection and the source after the kernel ahead
  reduce_rows_block(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<reduce_args> reduce_rows_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::reduce_rows), "d2h_reduce_rows"};
}

}  // namespace ferry::d2h::detail
