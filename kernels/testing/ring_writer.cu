// SPDX-License-Identifier: Apache-2.0
// GPU wrapper of the test writer kernel (see <ferry/testing/ring_writer.hpp>); part of ferry::testing, not
// of ferry.
#include "../detail/gpu_kernel.cuh"
#include "detail/ring_writer.cuh"

#include <ferry/testing/ring_writer.hpp>

namespace ferry::testing::kernels {

__global__ void ring_writer(ferry::d2h::ring_ref ref, std::uint64_t seq, std::uint64_t bytes, std::uint64_t commit)
{
  if (blockIdx.x != 0) { return; }
  ring_writer_fill(ref, seq, bytes, threadIdx.x, blockDim.x);
  // Not needed for the entry's visibility (the channel's release is stream-ordered after this kernel);
  // keeps the commit after every read of the cursor slot, as a real writer would.
  __syncthreads();
  if (threadIdx.x == 0) { ring_writer_commit(ref, bytes, commit); }
}

}  // namespace ferry::testing::kernels

namespace ferry::testing {

FERRY_KERNEL_HANDLE<ferry::d2h::ring_ref, std::uint64_t, std::uint64_t, std::uint64_t> ring_writer_kernel(
    FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&kernels::ring_writer), "test_ring_writer"};
}

}  // namespace ferry::testing
