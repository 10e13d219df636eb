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

/// What close() found: every entry is either delivered or listed here.
struct shutdown_report {
  std::uint64_t delivered{0};              ///< entries delivered over the channel's life
  std::uint64_t pending_pop{0};            ///< delivered entries still waiting in try_pop's queue
  std::vector<entry_seq> unpublished;      ///< reserved, never published before the timeout
  std::vector<hook_id> unpublished_hooks;  ///< their hooks, same order
  /// Published, but never copied: pinned staging stayed full because views the consumer had not released
  /// (try_pop queue, or views kept alive) held it. Their ring space is retained; nothing was overwritten.
  std::vector<entry_seq> undrained;
  bool forward_open{false};                ///< close() found begin_forward without end_forward
  [[nodiscard]] bool clean() const noexcept { return unpublished.empty() && undrained.empty() && !forward_open; }
};

/// close() could not drain every reserved entry (listed in report()). Entries published before were
/// all delivered.
class shutdown_error : public ferry::error {
 public:
  explicit shutdown_error(shutdown_report r)
    : error(ferry::detail::format(
        "ferry: d2h channel close: expected every reserved entry published and drained, got {} entries never "
        "published (first seq {}){}{}",
        r.unpublished.size(), r.unpublished.empty() ? 0 : r.unpublished.front().value,
        std::string{r.forward_open ? "; a forward was still open (begin_forward without end_forward)" : ""},
        r.undrained.empty()
          ? std::string{}
          : ferry::detail::format("; {} published entries (first seq {}) not copied: staging held by {} views the "
                                  "consumer has not released",
                                  r.undrained.size(), r.undrained.front().value, r.pending_pop))),
      report_{std::move(r)}
  {
  }
  [[nodiscard]] const shutdown_report& report() const noexcept { return report_; }

 private:
  shutdown_report report_;
};

}  // namespace ferry::d2h
