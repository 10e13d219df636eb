// SPDX-License-Identifier: Apache-2.0
// Consumer check for ferry::cuda: compiles and links against the CUDA backend and its kernels.
#include <ferry/backend.hpp>
#include <ferry/backend/cuda/backend.hpp>
#include <ferry/backend/probe.hpp>

#include <cstdio>

int main()
{
  using B = ferry::backend::cuda_backend;
  static_assert(ferry::backend::backend<B>);
  const auto k = ferry::backend::probe::publish_kernel(ferry::backend::cuda_tag{});
  std::printf("ferry cuda consumer: kernel %s linked, %d device(s)\n", k.name, B{}.device_count());
  return k.fn != nullptr ? 0 : 1;
}
