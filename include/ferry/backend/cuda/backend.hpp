// SPDX-License-Identifier: Apache-2.0
// The CUDA backend: ferry::backend::cuda_backend over the CUDA runtime (link ferry::cuda).
// Device-side publication primitives live in ferry/backend/system_atomic.hpp
// (cuda::atomic_ref<u64, thread_scope_system>).
#pragma once

#include <ferry/backend/detail/gpu_prelude.hpp>

#include <cuda_runtime_api.h>

/// Throws ferry::cuda_error naming the call, the CUDA error and file:line (RMM_CUDA_TRY style).
#define FERRY_CUDA_TRY(call) FERRY_DETAIL_GPU_TRY(cuda, ::ferry::cuda_error, call, #call)

/// For destructors and other noexcept paths: never throws; a failure is reported on stderr.
#define FERRY_ASSERT_CUDA_SUCCESS(call)                                                                \
  do {                                                                                                 \
    const cudaError_t ferry_status_ = (call);                                                          \
    if (ferry_status_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "ferry: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__,               \
                   cudaGetErrorName(ferry_status_));                                                   \
    }                                                                                                  \
  } while (0)

namespace ferry::backend::cuda_detail {

inline cudaError_t mem_advise(void* p, std::size_t bytes, mem_advice advice, int device)
{
  cudaMemoryAdvise a{};
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = device;
  switch (advice) {
    case mem_advice::preferred_location_host:
      a = cudaMemAdviseSetPreferredLocation;
      loc = {cudaMemLocationTypeHost, 0};
      break;
    case mem_advice::preferred_location_device: a = cudaMemAdviseSetPreferredLocation; break;
    case mem_advice::accessed_by_host:
      a = cudaMemAdviseSetAccessedBy;
      loc = {cudaMemLocationTypeHost, 0};
      break;
    case mem_advice::accessed_by_device: a = cudaMemAdviseSetAccessedBy; break;
    case mem_advice::read_mostly: a = cudaMemAdviseSetReadMostly; break;
  }
#if CUDART_VERSION >= 12020
  return cudaMemAdvise(p, bytes, a, loc);
#else
  return cudaMemAdvise(p, bytes, a, loc.type == cudaMemLocationTypeHost ? cudaCpuDeviceId : loc.id);
#endif
}

/// cudaLaunchKernelExC with programmatic stream serialization allowed (see launch_config::programmatic).
inline cudaError_t launch_programmatic(const void* fn, ::dim3 grid, ::dim3 block, void** argv, std::size_t shmem,
                                       cudaStream_t s)
{
  cudaLaunchAttribute attr[1]{};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = grid;
  lc.blockDim = block;
  lc.dynamicSmemBytes = shmem;
  lc.stream = s;
  lc.attrs = attr;
  lc.numAttrs = 1;
  return cudaLaunchKernelExC(&lc, fn, argv);
}

/// True when this build's runtime has cudaMemcpyBatchAsync (CUDA 12.8+).
inline constexpr bool batch_native = CUDART_VERSION >= 12080;

/// One batched H2D submission of `n` copies (cudaMemcpyBatchAsync), source access in stream order: the
/// sources may be reused only after the stream passed this point, as with cudaMemcpyAsync. Not capturable.
inline cudaError_t memcpy_batch_h2d(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t n,
                                    int device, cudaStream_t s)
{
#if CUDART_VERSION >= 12080
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.srcLocHint.type = cudaMemLocationTypeHost;
  attr.srcLocHint.id = 0;
  attr.dstLocHint.type = cudaMemLocationTypeDevice;
  attr.dstLocHint.id = device;
  attr.flags = 0;
  std::size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &attr_idx, 1, s);
#else
  std::size_t fail_idx = 0;
  return cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs), const_cast<std::size_t*>(sizes), n,
                              &attr, &attr_idx, 1, &fail_idx, s);
#endif
#else
  (void)dsts, (void)srcs, (void)sizes, (void)n, (void)device, (void)s;
  return cudaErrorNotSupported;
#endif
}

inline bool stream_mem_ops_64(int device)
{
  // cudaDeviceAttr shares the driver's numbering; 122 is CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS.
  int v = 0;
  if (cudaDeviceGetAttribute(&v, static_cast<cudaDeviceAttr>(122), device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return v != 0;
}

}  // namespace ferry::backend::cuda_detail

#define FERRY_GPU(name) cuda##name
#define FERRY_GPU_BACKEND cuda_backend
#define FERRY_GPU_KERNEL cuda_kernel  // defined in types.hpp
#define FERRY_GPU_TAG cuda_tag
#define FERRY_GPU_ERROR ::ferry::cuda_error
#define FERRY_GPU_NAME "cuda"
#define FERRY_GPU_TRY FERRY_CUDA_TRY
#define FERRY_GPU_ATTR_CONCURRENT_MANAGED cudaDevAttrConcurrentManagedAccess
#define FERRY_GPU_ATTR_HOST_NATIVE_ATOMIC cudaDevAttrHostNativeAtomicSupported
#define FERRY_GPU_ATTR_PAGEABLE_ACCESS cudaDevAttrPageableMemoryAccess
#define FERRY_GPU_STREAM_MEM_OPS_64(dev) ::ferry::backend::cuda_detail::stream_mem_ops_64(dev)
#define FERRY_GPU_HOST_ALLOC cudaHostAlloc
#define FERRY_GPU_DEVICE_PROP cudaDeviceProp
#define FERRY_GPU_HOST_ALLOC_MAPPED cudaHostAllocMapped
#define FERRY_GPU_HOST_FREE cudaFreeHost
#define FERRY_GPU_MEM_ADVISE ::ferry::backend::cuda_detail::mem_advise
#define FERRY_GPU_EVENT_RECORD_EXTERNAL(e, s) cudaEventRecordWithFlags(e, s, cudaEventRecordExternal)
#if CUDART_VERSION >= 13000
#define FERRY_GPU_CAPTURE_DEPS(s, status, deps, n) \
  cudaStreamGetCaptureInfo(s, status, nullptr, nullptr, deps, nullptr, n)
#else
#define FERRY_GPU_CAPTURE_DEPS(s, status, deps, n) cudaStreamGetCaptureInfo_v2(s, status, nullptr, nullptr, deps, n)
#endif
#define FERRY_GPU_COMPILED_ARCH(attr) (attr).ptxVersion
#define FERRY_GPU_PROGRAMMATIC_LAUNCH(fn, grid, block, argv, shmem, s) \
  FERRY_GPU_TRY(::ferry::backend::cuda_detail::launch_programmatic(fn, grid, block, argv, shmem, s))
#define FERRY_GPU_BATCH_NATIVE ::ferry::backend::cuda_detail::batch_native
#define FERRY_GPU_MEMCPY_BATCH_H2D ::ferry::backend::cuda_detail::memcpy_batch_h2d

#include <ferry/backend/detail/gpu_backend.inl>

#include <ferry/backend/detail/gpu_backend_undef.inl>
