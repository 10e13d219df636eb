// SPDX-License-Identifier: Apache-2.0
// CUDA versions of the GPU stress kernels (see gpu_stress_kernels.hpp). No fmt / error headers here.
#include "gpu_stress_kernels.hpp"

namespace ferry::gpu_stress::gpu {

/// One block per slot of the window: every thread writes its share of the slot's words, thread 0 the size.
__global__ void stress_fill(fill_args a)
{
  const std::uint32_t slot = static_cast<std::uint32_t>((static_cast<std::uint64_t>(a.first_slot) + blockIdx.x) % a.table);
  const std::uint64_t seq = a.first_seq + blockIdx.x;
  const std::uint64_t cap = a.caps[slot];
  auto* w = reinterpret_cast<std::uint64_t*>(a.src + a.offsets[slot]);
  const std::uint64_t words = (cap + 7) / 8;
  for (std::uint64_t i = threadIdx.x; i < words; i += blockDim.x) { w[i] = ferry::testing::pattern_word(seq, i); }
  if (threadIdx.x == 0) { a.actual[slot] = dyn_actual(seq, cap); }
}

__global__ void stress_hammer(hammer_args a)
{
  const std::uint64_t nt = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t t = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  hammer_thread(a, t, nt, [](std::uint64_t* p, std::uint64_t v) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  });
}

}  // namespace ferry::gpu_stress::gpu

namespace ferry::gpu_stress {

cuda_kernel<fill_args> fill_kernel(ferry::backend::cuda_tag)
{
  return {reinterpret_cast<const void*>(&gpu::stress_fill), "gpu_stress_fill"};
}
cuda_kernel<hammer_args> hammer_kernel(ferry::backend::cuda_tag)
{
  return {reinterpret_cast<const void*>(&gpu::stress_hammer), "gpu_stress_hammer"};
}

}  // namespace ferry::gpu_stress
