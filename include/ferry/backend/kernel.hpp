// SPDX-License-Identifier: Apache-2.0
// Kernels on ferry's backends: how a kernel is named for a backend, and how a user writes one for the
// host-emulated device so the same launch code runs in CI without a GPU.
//
// Every backend launches a kernel handle of its own family (backend::kernel_type<Args...>):
//   cuda_backend: cuda_kernel<Args...>{&my_global_fn, "name"}   (the host stub of a __global__ function)
//   hip_backend : hip_kernel<Args...>{&my_global_fn, "name"}
//   host_backend: host_kernel<Args...>{&my_host_fn, "name"}      (a host function run once per block)
// and b.launch(kernel, launch_config{grid, block, shared_bytes}, stream.handle(), args...) enqueues it in
// stream order (b.preload(kernel) first, when the kernel may queue behind a kernel that waits on the CPU).
//
// A host kernel is `void fn(const host_launch_ctx& ctx, Args... args)`: the host backend calls it once per
// block of the grid, in order, on the stream's worker thread; ctx names the block (block_idx) and the
// launch shape (grid_dim, block_dim). The body loops over the block's threads itself. A GPU kernel's
// phases separated by __syncthreads() become loops over threads run one after another (the block join is
// the end of each loop); system-scope publication uses ferry/backend/system_atomic.hpp on both sides:
//
//   void fill(const ferry::backend::host_launch_ctx& ctx, std::uint32_t* dst, std::uint32_t n)
//   {
//     const std::uint32_t threads = ctx.block_dim.x;
//     for (std::uint32_t t = 0; t < threads; ++t) {                      // threadIdx.x == t
//       for (std::uint32_t i = ctx.block_idx.x * threads + t; i < n; i += ctx.grid_dim.x * threads) { dst[i] = i; }
//     }
//   }
//   b.launch(ferry::backend::host_kernel<std::uint32_t*, std::uint32_t>{&fill, "fill"},
//            {{4}, {128}, 0}, stream.handle(), ptr, n);
#pragma once

#include <ferry/backend/types.hpp>

namespace ferry::backend {

/// What a host kernel body sees: its block and the launch shape (the host backend's blockIdx, gridDim and
/// blockDim).
struct host_launch_ctx {
  dim3 block_idx;  ///< the block being run
  dim3 grid_dim;   ///< launch_config::grid
  dim3 block_dim;  ///< launch_config::block (the body runs these threads itself)
};

/// A host kernel: a function run once per block (the body loops over its threads itself).
template <class... Args>
struct host_kernel {
  void (*fn)(const host_launch_ctx&, Args...){nullptr};  ///< the body
  const char* name{"?"};                                 ///< for error messages
};

}  // namespace ferry::backend
