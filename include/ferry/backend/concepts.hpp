// SPDX-License-Identifier: Apache-2.0
// The backend concept: a small, copyable value type whose member functions wrap one runtime.
// Kernel launch and preload are member templates over the kernel's argument types (launch, preload),
// so they are not listed in the concept; every backend provides both.
// Static dispatch only (templates over the backend); no virtual calls. Every fallible call throws the
// backend's own error type (cuda_error / hip_error / host_error); every release call is noexcept.
#pragma once

#include <ferry/backend/types.hpp>

#include <concepts>
#include <cstddef>
#include <memory>
#include <string_view>

namespace ferry::backend {

template <class B>
concept backend = std::copyable<B> &&
  requires(const B b, typename B::stream_type s, typename B::event_type e, typename B::graph_type g,
           typename B::graph_exec_type x, void* p, const void* cp, std::size_t n, device_id d) {
    typename B::tag;
    typename B::error_type;
    { B::name() } -> std::convertible_to<std::string_view>;
    // device
    { b.device_count() } -> std::same_as<int>;
    { b.current_device() } -> std::same_as<device_id>;
    b.set_device(d);
    { b.attributes(d) } -> std::same_as<device_attributes>;
    // streams
    { b.stream_create() } -> std::same_as<typename B::stream_type>;
    b.stream_destroy(s);
    b.stream_synchronize(s);
    { b.stream_query(s) } -> std::same_as<bool>;
    { b.stream_is_capturing(s) } -> std::same_as<bool>;
    { b.capture_tail(s) } -> std::same_as<std::uintptr_t>;
    // events
    { b.event_create(event_flags::timing) } -> std::same_as<typename B::event_type>;
    b.event_destroy(e);
    b.event_record(e, s);
    b.event_record_external(e, s);
    { b.event_query(e) } -> std::same_as<bool>;
    b.event_synchronize(e);
    { b.event_elapsed_ms(e, e) } -> std::same_as<float>;
    b.stream_wait_event(s, e);
    // memory
    { b.allocate_device(n) } -> std::same_as<void*>;
    b.free_device(p);
    { b.allocate_pinned(n, true) } -> std::same_as<void*>;
    b.free_pinned(p);
    { b.mapped_device_pointer(p) } -> std::same_as<void*>;
    b.host_register(p, n);  // caller-owned host memory page-locked for DMA (a shared-memory staging)
    b.host_unregister(p);
    { b.allocate_managed(n) } -> std::same_as<void*>;
    b.free_managed(p);
    b.mem_advise(p, n, mem_advice::read_mostly, d);
    b.memcpy_async(p, cp, n, memcpy_kind::automatic, s);
    b.memset_async(p, 0, n, s);
    b.release_after(s, std::shared_ptr<void>{});
    { B::batch_native() } -> std::same_as<bool>;
    b.memcpy_batch_h2d_async(static_cast<void* const*>(nullptr), static_cast<const void* const*>(nullptr),
                             static_cast<const std::size_t*>(nullptr), n, d, s);
    // graphs (stream capture)
    b.capture_begin(s);
    { b.capture_end(s) } -> std::same_as<typename B::graph_type>;
    { b.graph_instantiate(g) } -> std::same_as<typename B::graph_exec_type>;
    b.graph_launch(x, s);
    b.graph_destroy(g);
    b.graph_exec_destroy(x);
  };

}  // namespace ferry::backend
