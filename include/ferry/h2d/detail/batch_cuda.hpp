// SPDX-License-Identifier: Apache-2.0
// cudaMemcpyBatchAsync for the `batch` upload backend. Host-compiled only (includes ferry/error.hpp through
// the CUDA backend header); included by publisher.hpp only in targets that link ferry::cuda (FERRY_HAS_CUDA).
// The backend layer has no batch call, so this lives in the H2D area. Not graph-capturable.
#pragma once

#include <ferry/backend/cuda/backend.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace ferry::h2d::detail {

/// True when this build's runtime has cudaMemcpyBatchAsync (CUDA 12.8+).
[[nodiscard]] constexpr bool cuda_batch_available() noexcept
{
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
  return true;
#else
  return false;
#endif
}

/// One batched H2D submission of `n` copies, source access in stream order (sources may be reused only
/// after the stream passed this point, like cudaMemcpyAsync).
inline void cuda_batch_h2d(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t n,
                           int device, cudaStream_t s)
{
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.srcLocHint.type = cudaMemLocationTypeHost;
  attr.srcLocHint.id = 0;
  attr.dstLocHint.type = cudaMemLocationTypeDevice;
  attr.dstLocHint.id = device;
  attr.flags = 0;
  std::size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
  FERRY_CUDA_TRY(cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &attr_idx, 1, s));
#else
  std::size_t fail_idx = 0;
  FERRY_CUDA_TRY(cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs),
                                      const_cast<std::size_t*>(sizes), n, &attr, &attr_idx, 1, &fail_idx, s));
#endif
#else
  (void)dsts, (void)srcs, (void)sizes, (void)n, (void)device, (void)s;
#endif
}

}  // namespace ferry::h2d::detail
