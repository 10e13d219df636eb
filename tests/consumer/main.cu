// SPDX-License-Identifier: Apache-2.0
// Consumer check (.cu, nvcc, C++20 from ferry::cuda's usage requirements): ferry's public headers compile
// in a CUDA translation unit; both sides run on the host backend (no GPU needed), and on the CUDA backend
// when a device is present. A user kernel writes into a d2h ring through ring_ref.
#include "both_sides.hpp"

#include <ferry/backend/cuda/backend.hpp>

#include <cstdio>

__global__ void consumer_fill(ferry::d2h::ring_ref ref)
{
  if (threadIdx.x == 0) { ref.commit(); }
}

int main()
{
  static_assert(ferry::backend::backend<ferry::backend::cuda_backend>);
  int failures = consumer::run_both_sides<ferry::backend::host_backend>("cuda tu, host backend");
  if (ferry::backend::cuda_backend{}.device_count() > 0) {
    failures += consumer::run_both_sides<ferry::backend::cuda_backend>("cuda tu, cuda backend");
  } else {
    std::printf("ferry consumer (cuda tu): no CUDA device, the cuda backend is linked but not run\n");
  }
  (void)&consumer_fill;
  return failures == 0 ? 0 : 1;
}
