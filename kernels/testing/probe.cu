// SPDX-License-Identifier: Apache-2.0
// GPU wrappers of the probe kernels (see <ferry/testing/probe.hpp>); part of ferry::testing, not of ferry.
#include "../detail/gpu_kernel.cuh"
#include "detail/probe.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/testing/device_clock.cuh>
#include <ferry/testing/probe.hpp>

namespace ferry::testing::probe::kernels {

__global__ void publish(std::uint64_t* payload, std::uint64_t words, std::uint64_t* flag, std::uint64_t seq)
{
  publish_write(payload, words, seq, threadIdx.x, blockDim.x);
  __syncthreads();  // the join: every payload store of the block happens-before thread 0's release
  if (threadIdx.x == 0) { publish_release(flag, seq); }
}

__global__ void consume(const std::uint64_t* flag, std::uint64_t seq, const std::uint64_t* src, std::uint64_t* dst,
                        std::uint64_t words)
{
  if (threadIdx.x == 0) { consume_acquire(flag, seq); }
  __syncthreads();  // extends thread 0's acquire to the block
  consume_copy(src, dst, words, threadIdx.x, blockDim.x);
}

__global__ void late_fill(std::uint64_t* dst, std::uint64_t words, std::uint64_t seq, std::uint64_t delay_ns)
{
  ferry::backend::grid_dependency_launch_dependents();
#if defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  ferry::testing::spin_until(ferry::testing::globaltimer_ns(), delay_ns);
#endif
  publish_write(dst, words, seq, threadIdx.x, blockDim.x);
}

}  // namespace ferry::testing::probe::kernels

namespace ferry::testing::probe {

FERRY_KERNEL_HANDLE<std::uint64_t*, std::uint64_t, std::uint64_t*, std::uint64_t> publish_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&kernels::publish), "probe_publish"};
}

FERRY_KERNEL_HANDLE<const std::uint64_t*, std::uint64_t, const std::uint64_t*, std::uint64_t*, std::uint64_t>
consume_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&kernels::consume), "probe_consume"};
}

FERRY_KERNEL_HANDLE<std::uint64_t*, std::uint64_t, std::uint64_t, std::uint64_t> late_fill_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&kernels::late_fill), "probe_late_fill"};
}

}  // namespace ferry::testing::probe
