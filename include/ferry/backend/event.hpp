// SPDX-License-Identifier: Apache-2.0
// Events: a move-only owner. record() orders after the stream's prior work; wait() makes another
// stream's later work wait for it; query()/synchronize() observe completion from the CPU.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/stream.hpp>

#include <utility>

namespace ferry::backend {

template <backend B>
class event {
 public:
  explicit event(B b = B{}, event_flags flags = event_flags::disable_timing)
    : backend_{b}, handle_{b.event_create(flags)}
  {
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  event(event&& o) noexcept : backend_{o.backend_}, handle_{std::exchange(o.handle_, {})} {}
  event& operator=(event&& o) noexcept
  {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      handle_ = std::exchange(o.handle_, {});
    }
    return *this;
  }
  ~event() { reset(); }

  /// Record on `s`. Inside stream capture this is a capture dependency only; use record_external for an
  /// event the CPU observes at graph replay.
  void record(stream_view<B> s) const { backend_.event_record(handle_, s.handle()); }
  void record_external(stream_view<B> s) const { backend_.event_record_external(handle_, s.handle()); }
  /// Make `s` wait (on the device) for the most recent record of this event.
  void wait(stream_view<B> s) const { backend_.stream_wait_event(s.handle(), handle_); }
  [[nodiscard]] bool query() const { return backend_.event_query(handle_); }
  void synchronize() const { backend_.event_synchronize(handle_); }
  [[nodiscard]] float elapsed_ms_since(const event& start) const
  {
    return backend_.event_elapsed_ms(start.handle_, handle_);
  }
  [[nodiscard]] typename B::event_type handle() const noexcept { return handle_; }

 private:
  void reset() noexcept
  {
    if (handle_ != typename B::event_type{}) { backend_.event_destroy(std::exchange(handle_, {})); }
  }
  B backend_;
  typename B::event_type handle_{};
};

}  // namespace ferry::backend
