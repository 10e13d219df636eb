// SPDX-License-Identifier: Apache-2.0
// The host-emulated device: lets CI run ferry's protocols without a GPU.
//
// * "Device" memory is host memory (256-byte aligned, filled with a 0xCD poison pattern on allocation,
//   so code that reads memory nothing wrote sees garbage, as on a GPU).
// * Each stream is a worker thread that executes its queue in order. Enqueueing returns immediately, so a
//   copy runs later than it was enqueued; copies to and from the caller's pageable memory (memory this
//   backend did not allocate) follow CUDA's rules instead: the source is read at the call, a copy into it
//   is complete when the call returns. An optional per-operation jitter (FERRY_HOST_JITTER_US, or
//   host_backend::set_jitter) widens those windows so protocol races show up in tests.
// * Events complete when the stream reaches them; stream_wait_event blocks the waiting stream's worker
//   until the generation recorded at enqueue time has completed.
// * Kernels are host functions run over the grid, block by block, on the stream's worker (how to write
//   one: backend/kernel.hpp).
// * Stream capture records operations into a graph; graph_launch enqueues them again, in order. As in
//   CUDA, an event recorded on a capturing stream is a capture dependency only (record_external is the
//   node that completes at replay), and a stream that waits on such an event joins the capture (a fork);
//   capture_end fails (stream_capture_unjoined) unless every joined stream's last operation was waited on
//   by the origin stream (joined back). A graph replays its branches in capture order on the launching
//   stream: one valid order of the captured dependencies.
// * System-scope atomics are std::atomic_ref operations (see system_atomic.hpp).
// * FERRY_HOST_DEVICES (default 2) emulated devices, so per-device code can be exercised.
#pragma once

#include <ferry/backend/kernel.hpp>  // host_kernel, host_launch_ctx: how a user writes a host kernel
#include <ferry/backend/types.hpp>
#include <ferry/error.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <type_traits>
#include <string_view>
#include <utility>

namespace ferry::backend {

namespace host_detail {
struct stream;
struct event;
struct graph;
struct graph_exec;

/// The earlier name of host_launch_ctx (backend/kernel.hpp), kept for existing host kernels.
using launch_ctx = host_launch_ctx;

/// What a stream worker runs. A `marker` (event completion) runs with the stream's lock held and the
/// stream already idle when it was the last operation, so whoever sees the event complete also sees
/// the stream idle (as with CUDA: event_synchronize on the last record implies stream_query == true).
struct op {
  op() = default;
  op(std::function<void()> f, bool is_marker = false) : fn{std::move(f)}, marker{is_marker} {}  // NOLINT
  std::function<void()> fn;
  bool marker{false};
};

/// A unit of work as recorded: called once at enqueue (or graph launch) time to do enqueue-time
/// bookkeeping, it returns the operation the worker runs later.
using node = std::function<op()>;

void enqueue(stream* s, node n);
}  // namespace host_detail

struct host_backend {
  using tag = host_tag;
  using error_type = host_error;
  using stream_type = host_detail::stream*;
  using event_type = host_detail::event*;
  using graph_type = host_detail::graph*;
  using graph_exec_type = host_detail::graph_exec*;
  template <class... Args>
  using kernel_type = host_kernel<Args...>;

  static constexpr std::string_view name() noexcept { return "host"; }

  /// Maximum random delay before each stream operation (0 disables). Process-wide.
  static void set_jitter(std::chrono::microseconds max_delay) noexcept;
  [[nodiscard]] static std::chrono::microseconds jitter() noexcept;

  // device
  [[nodiscard]] int device_count() const;
  [[nodiscard]] device_id current_device() const;
  void set_device(device_id d) const;
  [[nodiscard]] device_attributes attributes(device_id d) const;

  // streams
  [[nodiscard]] stream_type stream_create() const;
  void stream_destroy(stream_type s) const noexcept;
  void stream_synchronize(stream_type s) const;
  [[nodiscard]] bool stream_query(stream_type s) const;
  [[nodiscard]] bool stream_is_capturing(stream_type s) const;
  /// No graph nodes to name on the host backend (nothing is launched programmatically here): always 0.
  [[nodiscard]] std::uintptr_t capture_tail(stream_type) const noexcept { return 0; }

  // events
  [[nodiscard]] event_type event_create(event_flags flags) const;
  void event_destroy(event_type e) const noexcept;
  void event_record(event_type e, stream_type s) const;
  void event_record_external(event_type e, stream_type s) const;
  [[nodiscard]] bool event_query(event_type e) const;
  void event_synchronize(event_type e) const;
  [[nodiscard]] float event_elapsed_ms(event_type start, event_type end) const;
  void stream_wait_event(stream_type s, event_type e) const;

  // memory
  [[nodiscard]] void* allocate_device(std::size_t bytes) const;
  void free_device(void* p) const noexcept;
  [[nodiscard]] void* allocate_pinned(std::size_t bytes, bool mapped) const;
  void free_pinned(void* p) const noexcept;
  [[nodiscard]] void* mapped_device_pointer(void* pinned) const;
  /// Caller-owned host memory becomes the emulated device's pinned memory: copies into and out of it are
  /// asynchronous (as for allocate_pinned), not the pageable rules of memcpy_async. host_error for a null or
  /// empty range, or one overlapping memory already registered or allocated by this backend.
  void host_register(void* p, std::size_t bytes) const;
  void host_unregister(void* p) const noexcept;
  [[nodiscard]] void* allocate_managed(std::size_t bytes) const;
  void free_managed(void* p) const noexcept;
  void mem_advise(void* p, std::size_t bytes, mem_advice advice, device_id d) const;
  void memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind, stream_type s) const;
  void memset_async(void* dst, int value, std::size_t bytes, stream_type s) const;
  /// No batched copy API to emulate: memcpy_batch_h2d_async issues one copy per range (as on HIP).
  [[nodiscard]] static constexpr bool batch_native() noexcept { return false; }
  void memcpy_batch_h2d_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t n,
                              device_id, stream_type s) const
  {
    for (std::size_t i = 0; i < n; ++i) { memcpy_async(dsts[i], srcs[i], sizes[i], memcpy_kind::host_to_device, s); }
  }

  // kernels
  template <class... Args>
  void launch(kernel_type<Args...> k, launch_config cfg, stream_type s, std::type_identity_t<Args>... args) const
  {
    check_launch(k.fn != nullptr, k.name, cfg, s);
    host_detail::enqueue(s, [k, cfg, args...]() -> std::function<void()> {
      return [k, cfg, args...]() {
        host_launch_ctx ctx{{}, cfg.grid, cfg.block};
        for (std::uint32_t z = 0; z < cfg.grid.z; ++z)
          for (std::uint32_t y = 0; y < cfg.grid.y; ++y)
            for (std::uint32_t x = 0; x < cfg.grid.x; ++x) {
              ctx.block_idx = {x, y, z};
              k.fn(ctx, args...);
            }
      };
    });
  }
  /// Kernels are host functions: nothing to load (see the GPU backends' preload); no device architecture (0).
  /// launch_config::programmatic is ignored: every launch runs in plain stream order.
  template <class... Args>
  int preload(kernel_type<Args...>) const noexcept
  {
    return 0;
  }
  /// Enqueue an arbitrary host callable (the host backend's cudaLaunchHostFunc).
  void host_func(stream_type s, std::function<void()> f) const;
  /// Drops `keep` (the owner of memory that work enqueued on `s` reads) once that work ran: the emulated
  /// device reads "device" memory later, on the stream's thread (a GPU backend drops it at once).
  void release_after(stream_type s, std::shared_ptr<void> keep) const;

  // graphs
  void capture_begin(stream_type s) const;
  [[nodiscard]] graph_type capture_end(stream_type s) const;
  [[nodiscard]] graph_exec_type graph_instantiate(graph_type g) const;
  void graph_launch(graph_exec_type x, stream_type s) const;
  void graph_destroy(graph_type g) const noexcept;
  void graph_exec_destroy(graph_exec_type x) const noexcept;

  /// Raise this backend's error for a fault injected into `call` (see faulty.hpp).
  [[noreturn]] void raise_injected(call_kind kind, std::string_view call, const char* where) const;

 private:
  void check_launch(bool has_fn, const char* name, const launch_config& cfg, stream_type s) const;
};

}  // namespace ferry::backend
