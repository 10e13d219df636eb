// SPDX-License-Identifier: Apache-2.0
// Definitions of ferry::h2d::publisher<B>'s private helpers (declared in ferry/h2d/publisher.hpp): the
// guards' access to a slot's sources (check_producer, producer_source), the usability and owner-thread
// checks, guarded() (a backend failure invalidates the publisher) and the publisher-level rules of a
// publication (validate_publication). The public members that call them are in publisher.inl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <thread>

namespace ferry::h2d {

// ---- guards' access --------------------------------------------------------------------------------

template <ferry::backend::backend B>
void publisher<B>::check_producer(group_handle g, buffer_handle buf, std::size_t slot, std::uint64_t epoch) const
{
  check_usable("producer");
  slots_.check_producer(decl_, g, buf, slot, epoch);
}

template <ferry::backend::backend B>
template <class T>
std::span<T> publisher<B>::producer_source(group_handle g, buffer_handle buf, std::size_t slot,
                                           std::uint64_t epoch) const
{
  check_producer(g, buf, slot, epoch);
  const auto& r = decl_.buffers[buf.value];
  // Raw bytes (sizeof(T) == 1) always; elements: the element size; rows: the element or the row size;
  // bytes: any T whose size divides the capacity.
  const bool fits = sizeof(T) == 1 || r.spec.unit == count_unit::bytes || sizeof(T) == r.spec.element_size ||
                    (r.spec.unit == count_unit::rows && sizeof(T) == r.spec.row_size);
  FERRY_EXPECTS(fits, logic_error,
                "h2d buffer '{}': source<T> with sizeof(T) {} on a buffer of {} with element size {}{}; expected "
                "sizeof(T) == 1 or the element{} size",
                r.spec.name, sizeof(T), to_string(r.spec.unit), r.spec.element_size,
                r.spec.unit == count_unit::rows ? ferry::detail::format(" and row size {}", r.spec.row_size)
                                                : std::string{},
                r.spec.unit == count_unit::rows ? " or row" : "");
  FERRY_EXPECTS(r.cap_bytes % sizeof(T) == 0, logic_error,
                "h2d buffer '{}': capacity {} bytes is not a multiple of sizeof(T) {}", r.spec.name, r.cap_bytes,
                sizeof(T));
  return {reinterpret_cast<T*>(detail::source_ptr(plan_, store_.slots[slot], buf.value)), r.cap_bytes / sizeof(T)};
}

template <ferry::backend::backend B>
void publisher<B>::record_sources(group_handle g)
{
  if (!sources_.enabled()) { return; }
  const auto slot = static_cast<std::size_t>(slots_.active());
  const auto& s = slots_.current();
  for (auto m : decl_.groups[g.value].members) {
    sources_.record(g.value, m, slot, s.epoch, detail::source_ptr(plan_, store_.slots[slot], m),
                    s.counts[m] * decl_.buffers[m].unit_bytes);
  }
}

// ---- checks and failure handling -------------------------------------------------------------------

template <ferry::backend::backend B>
void publisher<B>::check_usable(std::string_view what) const
{
  FERRY_EXPECTS(initialized_, logic_error, "h2d publisher: {}() before initialize()", what);
  if (invalid_) [[unlikely]] {
    FERRY_FAIL(invalidated_error,
               "h2d publisher: {}() refused: invalidated by an earlier failure ({}); drain the consumer stream and "
               "call recover()",
               what, invalid_reason_);
  }
}

template <ferry::backend::backend B>
void publisher<B>::check_owner_thread(std::string_view who) const
{
  FERRY_EXPECTS(std::this_thread::get_id() == owner_thread_, logic_error,
                "h2d group '{}': called from a thread that is not the owner thread", who);
}

template <ferry::backend::backend B>
template <class F>
void publisher<B>::guarded(std::string_view what, F&& f, std::string_view group)
{
  try {
    f();
  } catch (const ferry::backend_error& e) {
    invalid_ = true;
    invalid_reason_ = group.empty() ? ferry::detail::format("{}: {}", what, e.what())
                                    : ferry::detail::format("{} '{}': {}", what, group, e.what());
    slots_.deactivate();
    throw;
  }
}

template <ferry::backend::backend B>
void publisher<B>::check_baked_counts(group_handle g, const detail::slot_book& s) const
{
  const auto it = baked_.find({g.value, static_cast<std::size_t>(slots_.active())});
  if (it == baked_.end()) { return; }
  for (const auto& [m, baked] : it->second) {
    FERRY_EXPECTS(s.counts[m] == baked, logic_error,
                  "h2d group '{}': buffer '{}' was captured into the graph of slot {} as a direct copy of {} units "
                  "(a direct copy bakes its count: it reads none at replay): expected stage() with that count, got "
                  "{}; stage {} units, or capture with the packed or zerocopy upload, which reads the counts at "
                  "replay. Nothing was staged",
                  decl_.groups[g.value].name, decl_.buffers[m].spec.name, slots_.active(), baked, s.counts[m], baked);
  }
}

template <ferry::backend::backend B>
detail::slot_book& publisher<B>::validate_publication(group_handle g, stream_view stream, bool enqueue)
{
  check_usable("publish");
  const auto& gr = decl_.group(g);
  check_owner_thread(gr.name);
  FERRY_EXPECTS(stream == *owner_, logic_error, "h2d group '{}': publication on a stream other than the owner stream",
                gr.name);
  const auto dev = b_.current_device();
  FERRY_EXPECTS(dev == cfg_.device, logic_error, "h2d group '{}': expected device {}, current device is {}", gr.name,
                cfg_.device.value, dev.value);
  FERRY_EXPECTS(slots_.active() >= 0, logic_error,
                "h2d group '{}': publication with no active slot (call begin() first)", gr.name);
  if (enqueue) {
    bool capturing = false;
    guarded("publish: capture query", [&] { capturing = b_.stream_is_capturing(stream.handle()); });
    FERRY_EXPECTS(!capturing, logic_error,
                  "h2d group '{}': publication during stream capture (publish before capture/replay; graphs use "
                  "stage() + capture_upload())",
                  gr.name);
  }
  slots_.check_members(decl_, g);
  sources_.verify(decl_, enqueue ? "publish()" : "stage()");
  return slots_.current();
}

}  // namespace ferry::h2d
