// SPDX-License-Identifier: Apache-2.0
// A sink: a consumer the channel attaches in one call (docs/api/sinks.md):
//
//   ferry::sink::safetensors sink{sc};         // or a sink::shm_stream, or a user's type with these calls
//   fd::channel<B> ch{cfg, b, sink, schema};   // schema adopted, callback taken, the sink's staging used
//
// What a sink provides (the concept d2h::sink): callback(), the entry consumer the drain thread calls (a
// channel::callback_type sharing the sink's state); adopt_schema(schema), the channel's hook schema offered
// before the channel exists (a sink without one takes it; its rules are the sink's); and, optionally (the
// concept d2h::staging_sink), staging(registration), host memory of its own the channel lands its D2H copies
// in, page-locked through the channel's backend (host_registration). Its counters are its own stats().
// sink_ref is any sink chosen at run time (the Python binding's Channel(sink=...)), itself a sink.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/d2h/staging_memory.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

namespace ferry::d2h {

/// A backend's page-locking of host memory, without the backend's type: what a sink that gives the channel
/// its own staging registers that memory with (B::host_register / host_unregister).
struct host_registration {
  std::function<void(void*, std::uint64_t)> register_memory;
  std::function<void(void*)> unregister_memory;  ///< never throws

  template <ferry::backend::backend B>
  [[nodiscard]] static host_registration of(B b)
  {
    return {[b](void* p, std::uint64_t n) { b.host_register(p, static_cast<std::size_t>(n)); },
            [b](void* p) noexcept { b.host_unregister(p); }};
  }
};

/// What the channel's one-call constructor takes: an entry callback and the channel's schema offered.
template <class S>
concept sink = requires(S& s, const hook_schema& schema) {
  { s.callback() } -> std::convertible_to<std::function<void(entry_view&&)>>;
  s.adopt_schema(schema);
};

/// A sink that gives the channel its own staging (e.g. sink::shm_stream: a shared-memory segment).
template <class S>
concept staging_sink = sink<S> && requires(S& s, const host_registration& r) {
  { s.staging(r) } -> std::same_as<staging_memory>;
};

/// A sink chosen at run time (type-erased; itself a staging_sink, empty staging for a sink without its own). It
/// refers to the sink: keep the sink alive while the channel is being constructed (the callback the channel
/// keeps shares the sink's state).
class sink_ref {
 public:
  using callback_type = std::function<void(entry_view&&)>;

  template <sink S>
    requires(!std::same_as<std::remove_cv_t<S>, sink_ref>)
  sink_ref(S& s)  // NOLINT(google-explicit-constructor): any sink is a sink_ref
    : callback_{[&s] { return callback_type{s.callback()}; }}, adopt_{[&s](const hook_schema& h) { s.adopt_schema(h); }}
  {
    if constexpr (staging_sink<S>) {
      staging_ = [&s](const host_registration& r) { return s.staging(r); };
    }
  }
  /// A bare consumer: `cb` only (no schema adopted, the channel's own staging).
  explicit sink_ref(callback_type cb) : callback_{[cb = std::move(cb)] { return cb; }} {}

  [[nodiscard]] callback_type callback() const { return callback_(); }
  void adopt_schema(const hook_schema& schema) const
  {
    if (adopt_) { adopt_(schema); }
  }
  [[nodiscard]] staging_memory staging(const host_registration& r) const
  {
    return staging_ ? staging_(r) : staging_memory{};
  }

 private:
  std::function<callback_type()> callback_;
  std::function<void(const hook_schema&)> adopt_;
  std::function<staging_memory(const host_registration&)> staging_;
};

/// What the channel's sink constructor makes of a sink, in this order: the schema offered first (a sink that
/// has none refuses before anything is allocated), then its callback, then its staging (registered with `b`).
struct sink_attachment {
  std::function<void(entry_view&&)> callback;
  staging_memory staging;
  hook_schema schema;
};
template <sink S, ferry::backend::backend B>
[[nodiscard]] sink_attachment attach_sink(S& s, hook_schema schema, const B& b)
{
  s.adopt_schema(schema);
  sink_attachment a{s.callback(), {}, std::move(schema)};
  if constexpr (staging_sink<S>) { a.staging = s.staging(host_registration::of(b)); }
  return a;
}

}  // namespace ferry::d2h
