// SPDX-License-Identifier: Apache-2.0
// The entries of one captured forward, in execution order. end_forward() returns it when the forward
// was captured into a graph; channel::plan() reserves ring space and fills the CPU FIFO for one replay.
#pragma once

#include <ferry/d2h/types.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::d2h {

namespace detail {
struct access;
}

struct plan_entry {
  hook_id hook{};
  std::uint64_t reserved{0};  ///< ring bytes (16-byte multiple); the upper bound for a dynamic entry
  std::uint64_t bytes{0};     ///< static payload bytes (dynamic: resolved on the GPU)
  bool dynamic{false};
  std::uint64_t row_bytes{0};  ///< capture_rows: bytes per row (0: captured whole)
  std::uint64_t per_item{1};   ///< capture_rows: rows per selected item (a window's length)
  std::uint64_t items{0};      ///< capture_rows: the most items its selection holds (forward_meta::selected's bound)
};

/// The entries of one captured forward (what plan() reserves for a replay). Returned by end_forward().
class forward_plan {
 public:
  forward_plan() = default;
  [[nodiscard]] const std::vector<plan_entry>& entries() const noexcept { return entries_; }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
  /// Channel that captured it (plan() refuses a plan from another channel).
  [[nodiscard]] const void* owner() const noexcept { return owner_; }

 private:
  friend struct detail::access;
  const void* owner_{nullptr};
  std::vector<plan_entry> entries_;
};

}  // namespace ferry::d2h
