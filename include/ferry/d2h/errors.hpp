// SPDX-License-Identifier: Apache-2.0
// Typed errors of the D2H side (host only: includes fmt through ferry/error.hpp).
#pragma once

#include <ferry/d2h/types.hpp>
#include <ferry/error.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ferry::d2h {

/// A dynamic entry whose GPU-resolved size exceeded its reservation. Raised by entry_view::bytes() on
/// that entry only; the drain goes on and counts it in counters::size_overflows.
class size_overflow_error : public ferry::error {
 public:
  size_overflow_error(hook_id hook, entry_seq seq, std::uint64_t reserved, std::uint64_t actual)
    : error(ferry::detail::format(
        "ferry: d2h entry {} of hook {}: GPU-resolved size {} bytes exceeds the reserved {} bytes (expected "
        "actual <= reserved); the entry is rejected, not clamped",
        seq.value, hook.value, actual, reserved)),
      hook_{hook}, seq_{seq}, reserved_{reserved}, actual_{actual}
  {
  }
  [[nodiscard]] hook_id hook() const noexcept { return hook_; }
  [[nodiscard]] entry_seq seq() const noexcept { return seq_; }
  [[nodiscard]] std::uint64_t reserved() const noexcept { return reserved_; }
  [[nodiscard]] std::uint64_t actual() const noexcept { return actual_; }

 private:
  hook_id hook_;
  entry_seq seq_;
  std::uint64_t reserved_;
  std::uint64_t actual_;
};

/// A row-selected entry (channel::capture_rows) whose selection the kernel refused: a row index outside [0,
/// n_rows), a request outside [0, n_requests), a window past its request's span, or a GPU-resolved count
/// above max_count. Raised by entry_view::bytes() on that entry only (nothing outside the source was read);
/// the drain goes on and counts it in counters::selection_errors.
class selection_error : public ferry::error {
 public:
  selection_error(hook_id hook, entry_seq seq)
    : error(ferry::detail::format(
        "ferry: d2h entry {} of hook {}: its row selection was refused on the device (expected every row in [0, "
        "n_rows), every request in [0, n_requests), every window inside its request's tokens and the count at most "
        "max_count); the entry has no bytes",
        seq.value, hook.value)),
      hook_{hook}, seq_{seq}
  {
  }
  [[nodiscard]] hook_id hook() const noexcept { return hook_; }
  [[nodiscard]] entry_seq seq() const noexcept { return seq_; }

 private:
  hook_id hook_;
  entry_seq seq_;
};

/// What close() found: every entry is either delivered or listed here.
struct shutdown_report {
  std::uint64_t delivered{0};              ///< entries delivered over the channel's life
  std::uint64_t pending_pop{0};            ///< delivered entries still waiting in try_pop's queue
  std::vector<entry_seq> unpublished;      ///< reserved, never published before the timeout
  std::vector<hook_id> unpublished_hooks;  ///< their hooks, same order
  /// Published, but never copied: pinned staging stayed full because views the consumer had not released
  /// (try_pop queue, or views kept alive) held it. Their ring space is retained; nothing was overwritten.
  std::vector<entry_seq> undrained;
  /// Delivered views not released when close() returned (kept by the consumer, or queued for try_pop;
  /// pending_pop of them are in the queue): they hold the staging the undrained entries needed.
  std::uint64_t views_held{0};
  bool forward_open{false};                ///< close() found begin_forward without end_forward
  /// Exceptions the consumer callback threw (each entry was still delivered once; see docs/api/d2h.md).
  std::uint64_t callback_errors{0};
  /// what() of the first one ("a non-std::exception" when it was not a std::exception); empty when none.
  std::string first_callback_error;
  /// Errors that disabled capture (config::on_error = disable), and the first one's message.
  std::uint64_t capture_errors{0};
  std::string first_capture_error;
  [[nodiscard]] bool clean() const noexcept
  {
    return unpublished.empty() && undrained.empty() && !forward_open && callback_errors == 0 && capture_errors == 0;
  }
};

namespace detail {
/// shutdown_error's message: the open forward first (it explains the rest), then what was lost or failed.
[[nodiscard]] inline std::string shutdown_message(const shutdown_report& r)
{
  std::string m = "ferry: d2h channel close: ";
  std::string sep;
  if (r.forward_open) {
    m += "a forward was still open (begin_forward without end_forward; close() published its eager entries, "
         "a captured forward's entries were never planned)";
    sep = "; ";
  } else {
    m += "expected every reserved entry published and drained, no callback exception and no capture error, got ";
  }
  if (!r.unpublished.empty()) {
    m += sep + ferry::detail::format("{} entries never published (first seq {}, hook {})", r.unpublished.size(),
                                     r.unpublished.front().value, r.unpublished_hooks.front().value);
    sep = "; ";
  }
  if (!r.undrained.empty()) {
    m += sep + ferry::detail::format(
                   "{} published entries (first seq {}) not copied: staging held by {} views the "
                   "consumer has not released ({} of them delivered and not yet taken: try_pop in C++, poll in Python)",
                   r.undrained.size(), r.undrained.front().value, r.views_held, r.pending_pop);
    sep = "; ";
  }
  if (r.callback_errors > 0) {
    m += sep + ferry::detail::format("{} exceptions thrown by the consumer callback, the first: {}", r.callback_errors,
                                     r.first_callback_error);
    sep = "; ";
  }
  if (r.capture_errors > 0) {
    m += sep + ferry::detail::format("capture disabled by {} error{} (on_error = disable), the first: {}",
                                     r.capture_errors, r.capture_errors == 1 ? "" : "s", r.first_capture_error);
    sep = "; ";
  }
  if (sep.empty()) { m += "nothing lost"; }
  return m;
}
}  // namespace detail

/// close() could not drain every reserved entry, or the consumer callback threw (listed in report()).
/// Entries published before were all delivered.
class shutdown_error : public ferry::error {
 public:
  explicit shutdown_error(shutdown_report r) : error(detail::shutdown_message(r)), report_{std::move(r)} {}
  [[nodiscard]] const shutdown_report& report() const noexcept { return report_; }

 private:
  shutdown_report report_;
};

}  // namespace ferry::d2h
