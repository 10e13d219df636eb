// SPDX-License-Identifier: Apache-2.0
// The publication primitives: system-scope release store / acquire load of a naturally aligned u64.
//
// Device side (compiled by nvcc / hipcc for the device):
//   CUDA: cuda::atomic_ref<u64, thread_scope_system>::store(v, release)  ->  st.release.sys.b64
//         cuda::atomic_ref<u64, thread_scope_system>::load(acquire)      ->  ld.acquire.sys.b64
//   HIP : __hip_atomic_store/load(..., __ATOMIC_RELEASE/ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM)
// Host side (the CPU thread that polls, and the host-emulated device): std::atomic_ref operations.
// Never a standalone fence: ThreadSanitizer ignores fences, and a device-scope fence (__threadfence)
// followed by a volatile store is not a release that a CPU acquire can synchronize with.
//
// The CI check tests/ptx_check asserts the device versions compile to st.release.sys / ld.acquire.sys.
#pragma once

#include <atomic>
#include <cstdint>

#if defined(__HIP__) && !defined(__CUDACC__)
#include <hip/hip_runtime.h>  // __host__/__device__ and the __hip_atomic builtins' scopes
#endif

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define FERRY_HD __host__ __device__
#define FERRY_DEVICE __device__
#else
#define FERRY_HD
#define FERRY_DEVICE
#endif

#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
#include <cuda/atomic>
#endif

namespace ferry::backend {

/// Release store with system scope: every write this thread performed before it (and every write
/// that happened-before it, e.g. through a kernel boundary on the same stream) becomes visible to a
/// CPU thread whose acquire load reads `v`. `p` must be 8-byte aligned and in memory both sides reach
/// (managed or pinned mapped host memory).
FERRY_HD inline void store_release_system(std::uint64_t* p, std::uint64_t v) noexcept
{
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
  cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>{*p}.store(v, cuda::std::memory_order_release);
#elif defined(__HIP_DEVICE_COMPILE__)
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  std::atomic_ref<std::uint64_t>{*p}.store(v, std::memory_order_release);
#endif
}

namespace detail {

/// Load with system scope and `Order` (std::memory_order_acquire or std::memory_order_relaxed), spelled as
/// each side spells it: the one body of load_acquire_system and load_relaxed_system.
template <std::memory_order Order>
FERRY_HD inline std::uint64_t load_system(const std::uint64_t* p) noexcept
{
  constexpr bool acquire = Order == std::memory_order_acquire;
  static_assert(acquire || Order == std::memory_order_relaxed);
  auto* q = const_cast<std::uint64_t*>(p);  // atomic_ref<T> needs a non-const T before C++26
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
  constexpr auto order = acquire ? cuda::std::memory_order_acquire : cuda::std::memory_order_relaxed;
  return cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>{*q}.load(order);
#elif defined(__HIP_DEVICE_COMPILE__)
  return __hip_atomic_load(q, acquire ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  return std::atomic_ref<std::uint64_t>{*q}.load(Order);
#endif
}

}  // namespace detail

/// Acquire load with system scope; pairs with store_release_system on the other side.
FERRY_HD inline std::uint64_t load_acquire_system(const std::uint64_t* p) noexcept
{
  return detail::load_system<std::memory_order_acquire>(p);
}

/// Relaxed load (for counters read only for statistics / progress hints).
FERRY_HD inline std::uint64_t load_relaxed_system(const std::uint64_t* p) noexcept
{
  return detail::load_system<std::memory_order_relaxed>(p);
}

/// Host-side names for the CPU half of the hand-off (same operations; named for readability at call sites).
inline std::uint64_t host_load_acquire(const std::uint64_t* p) noexcept
{
  return std::atomic_ref<std::uint64_t>{*const_cast<std::uint64_t*>(p)}.load(std::memory_order_acquire);
}
inline void host_store_release(std::uint64_t* p, std::uint64_t v) noexcept
{
  std::atomic_ref<std::uint64_t>{*p}.store(v, std::memory_order_release);
}

}  // namespace ferry::backend
