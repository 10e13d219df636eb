// SPDX-License-Identifier: Apache-2.0
// Vocabulary types shared by every backend: strong device id, attributes, launch shape, call kinds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::backend {

/// A device ordinal (strong type: an int is not silently a device).
struct device_id {
  int value{0};
  friend constexpr bool operator==(device_id, device_id) = default;
};

/// What ferry needs to know about a device to pick placements and validate configurations.
struct device_attributes {
  device_id device{};
  std::string name;
  bool concurrent_managed_access{false};     ///< GPU and CPU may touch managed memory concurrently
  bool host_native_atomic_supported{false};  ///< GPU RMW atomics on host memory are atomic
  bool pageable_memory_access{false};
  bool stream_mem_ops_64{false};             ///< cuStreamWriteValue64 / hipStreamWriteValue64 usable
  int sm_count{0};
  int compute_capability_major{0};
  int compute_capability_minor{0};
  std::size_t total_memory{0};
};

/// Grid shape of a launch. 1-D in x is enough for ferry's kernels; y/z exist for user kernels.
struct dim3 {
  std::uint32_t x{1}, y{1}, z{1};
};

struct launch_config {
  dim3 grid{};
  dim3 block{};
  std::size_t shared_bytes{0};
  /// Programmatic dependent launch (CUDA on sm_90+; HIP and host: ignored, plain stream order): the
  /// kernel may be SCHEDULED before the kernel ahead of it on the stream completes. Only for kernels that
  /// execute ferry::backend::grid_dependency_wait() (backend/grid_dependency.hpp) in every thread before
  /// any memory access that the earlier work may produce or consume: that wait returns once the
  /// preceding grid has completed and its writes are visible, so it joins exactly as stream order does.
  /// Use only where the kernel's code was compiled with the wait (preload() reports the architecture).
  bool programmatic{false};
};

enum class memcpy_kind { host_to_device, device_to_host, device_to_device, host_to_host, automatic };

/// Memory advice for managed allocations (cudaMemAdvise / hipMemAdvise).
enum class mem_advice {
  preferred_location_host,
  preferred_location_device,
  accessed_by_host,
  accessed_by_device,
  read_mostly,
};

/// Event creation flags.
enum class event_flags : unsigned {
  timing = 0,             ///< default: can be used with elapsed_ms
  disable_timing = 1u,    ///< cheaper; completion only
};

/// Which kind of backend call a fault injector may fail; also used in error messages.
enum class call_kind : unsigned {
  device,
  allocate,
  free,
  stream,
  event_record,
  event,
  wait,
  copy,
  launch,
  graph,
  query,
};

[[nodiscard]] constexpr std::string_view to_string(call_kind k) noexcept
{
  switch (k) {
    case call_kind::device: return "device";
    case call_kind::allocate: return "allocate";
    case call_kind::free: return "free";
    case call_kind::stream: return "stream";
    case call_kind::event_record: return "event_record";
    case call_kind::event: return "event";
    case call_kind::wait: return "wait";
    case call_kind::copy: return "copy";
    case call_kind::launch: return "launch";
    case call_kind::graph: return "graph";
    case call_kind::query: return "query";
  }
  return "?";
}

/// Tags naming a backend family. Kernels are looked up per tag (see backend/kernel.hpp).
struct host_tag {};
struct cuda_tag {};
struct hip_tag {};

/// Kernel handles, one per backend family. A GPU handle is the host stub of a __global__ function
/// (launched through cudaLaunchKernel / hipLaunchKernel); the host handle is defined in backend/kernel.hpp.
/// Kept here, free of fmt and runtime headers, so the .cu files that define kernels stay light.
template <class... Args>
struct host_kernel;
template <class... Args>
struct cuda_kernel {
  const void* fn{nullptr};  ///< the __global__ function's host stub
  const char* name{"?"};    ///< for error messages
};
template <class... Args>
struct hip_kernel {
  const void* fn{nullptr};  ///< the __global__ function's host stub
  const char* name{"?"};    ///< for error messages
};

}  // namespace ferry::backend
