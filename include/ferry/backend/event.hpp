// SPDX-License-Identifier: Apache-2.0
// Events: a move-only owner. record() orders after the stream's prior work; wait() makes another
// stream's later work wait for it; query()/synchronize() observe completion from the CPU.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/detail/unique_handle.hpp>
#include <ferry/backend/stream.hpp>

namespace ferry::backend {

template <backend B>
class event {
 public:
  explicit event(B b = B{}, event_flags flags = event_flags::disable_timing) : h_{b, b.event_create(flags)} {}

  /// Record on `s`. Inside stream capture this is a capture dependency only; use record_external for an
  /// event the CPU observes at graph replay.
  void record(stream_view<B> s) const { h_.backend().event_record(handle(), s.handle()); }
  void record_external(stream_view<B> s) const { h_.backend().event_record_external(handle(), s.handle()); }
  /// Make `s` wait (on the device) for the most recent record of this event.
  void wait(stream_view<B> s) const { h_.backend().stream_wait_event(s.handle(), handle()); }
  [[nodiscard]] bool query() const { return h_.backend().event_query(handle()); }
  void synchronize() const { h_.backend().event_synchronize(handle()); }
  [[nodiscard]] float elapsed_ms_since(const event& start) const
  {
    return h_.backend().event_elapsed_ms(start.handle(), handle());
  }
  [[nodiscard]] typename B::event_type handle() const noexcept { return h_.get(); }

 private:
  detail::unique_handle<B, typename B::event_type, &B::event_destroy> h_;  ///< move-only: so is the event
};

}  // namespace ferry::backend
