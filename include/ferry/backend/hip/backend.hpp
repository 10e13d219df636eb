// SPDX-License-Identifier: Apache-2.0
// The HIP backend: ferry::backend::hip_backend over the HIP runtime (link ferry::hip). Same
// implementation as the CUDA backend (detail/gpu_backend.inl); only spellings differ.
// Device-side publication primitives: __hip_atomic_store/load with __HIP_MEMORY_SCOPE_SYSTEM
// (ferry/backend/system_atomic.hpp).
#pragma once

#include <ferry/backend/detail/gpu_prelude.hpp>

#include <hip/hip_runtime_api.h>

/// Throws ferry::hip_error naming the call, the HIP error and file:line.
#define FERRY_HIP_TRY(call) FERRY_DETAIL_GPU_TRY(hip, ::ferry::hip_error, call, #call)

namespace ferry::backend::hip_detail {

inline hipError_t mem_advise(void* p, std::size_t bytes, mem_advice advice, int device)
{
  switch (advice) {
    case mem_advice::preferred_location_host:
      return hipMemAdvise(p, bytes, hipMemAdviseSetPreferredLocation, hipCpuDeviceId);
    case mem_advice::preferred_location_device: return hipMemAdvise(p, bytes, hipMemAdviseSetPreferredLocation, device);
    case mem_advice::accessed_by_host: return hipMemAdvise(p, bytes, hipMemAdviseSetAccessedBy, hipCpuDeviceId);
    case mem_advice::accessed_by_device: return hipMemAdvise(p, bytes, hipMemAdviseSetAccessedBy, device);
    case mem_advice::read_mostly: return hipMemAdvise(p, bytes, hipMemAdviseSetReadMostly, device);
  }
  return hipErrorInvalidValue;
}

}  // namespace ferry::backend::hip_detail

#define FERRY_GPU(name) hip##name
#define FERRY_GPU_BACKEND hip_backend
#define FERRY_GPU_KERNEL hip_kernel  // defined in types.hpp
#define FERRY_GPU_TAG hip_tag
#define FERRY_GPU_ERROR ::ferry::hip_error
#define FERRY_GPU_NAME "hip"
#define FERRY_GPU_TRY FERRY_HIP_TRY
#define FERRY_GPU_ATTR_CONCURRENT_MANAGED hipDeviceAttributeConcurrentManagedAccess
#define FERRY_GPU_ATTR_HOST_NATIVE_ATOMIC hipDeviceAttributeHostNativeAtomicSupported
#define FERRY_GPU_ATTR_PAGEABLE_ACCESS hipDeviceAttributePageableMemoryAccess
#define FERRY_GPU_STREAM_MEM_OPS_64(dev) false
#define FERRY_GPU_HOST_ALLOC hipHostMalloc
#define FERRY_GPU_DEVICE_PROP hipDeviceProp_t
#define FERRY_GPU_HOST_ALLOC_MAPPED hipHostMallocMapped
#define FERRY_GPU_HOST_FREE hipHostFree
#define FERRY_GPU_MEM_ADVISE ::ferry::backend::hip_detail::mem_advise
// ROCm 5.2 has no hipEventRecordWithFlags; a plain record is a graph node under HIP capture.
#define FERRY_GPU_EVENT_RECORD_EXTERNAL(e, s) hipEventRecord(e, s)
#define FERRY_GPU_CAPTURE_DEPS(s, status, deps, n) hipStreamGetCaptureInfo_v2(s, status, nullptr, nullptr, deps, n)
#define FERRY_GPU_COMPILED_ARCH(attr) 0  // no programmatic launch on HIP: launch_config::programmatic is ignored
#define FERRY_GPU_BATCH_NATIVE false      // no batched copy API: memcpy_batch_h2d_async issues one copy per range
#define FERRY_GPU_MEMCPY_BATCH_H2D(...) hipErrorNotSupported

#include <ferry/backend/detail/gpu_backend.inl>

#include <ferry/backend/detail/gpu_backend_undef.inl>
