// SPDX-License-Identifier: Apache-2.0
// Pinned host staging for completed D2H copies: a byte ring of regions (one per coalesced copy), each
// region released when the last entry view on it is released (views may be released in any order; the
// ring tail advances over released regions in order). Shared by the channel and every entry view, so
// a view that outlives its channel keeps its bytes valid. The memory is the channel's pinned buffer, or
// staging given to the channel (staging_memory.hpp, with_staging). Regions start at entry_alignment (16) from the
// base, so an entry of a run sits in the staging at its ring alignment (a typed view's as<T>() takes it).
#pragma once

#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/staging_memory.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

namespace ferry::d2h::detail {

class staging_pool {
 public:
  staging_pool(std::byte* base, std::uint64_t bytes, std::shared_ptr<void> owner)
    : base_{base}, bytes_{bytes}, owner_{std::move(owner)}
  {
  }

  [[nodiscard]] std::byte* base() const noexcept { return base_; }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }

  [[nodiscard]] bool can_alloc(std::uint64_t n) const
  {
    std::lock_guard lock{m_};
    return fits(place(head_, padded(n), bytes_));
  }
  /// A contiguous region of n bytes shared by `refs` views, starting aligned to entry_alignment from the base;
  /// its virtual start (physical = start % bytes()).
  [[nodiscard]] std::optional<std::uint64_t> alloc(std::uint64_t n, std::uint32_t refs)
  {
    std::lock_guard lock{m_};
    const placement p = place(head_, padded(n), bytes_);
    if (!fits(p)) { return std::nullopt; }
    head_ = p.end;
    regions_.push_back(region{p.start, p.end, refs});
    if (refs == 0) { advance(); }
    return p.start;
  }
  void release(std::uint64_t region_start) noexcept
  {
    std::lock_guard lock{m_};
    for (auto& r : regions_) {
      if (r.start == region_start && r.refs > 0) {
        --r.refs;
        break;
      }
    }
    advance();
  }
  /// Views not released yet (each holds one reference on its region).
  [[nodiscard]] std::uint64_t live_views() const
  {
    std::lock_guard lock{m_};
    std::uint64_t n = 0;
    for (const auto& r : regions_) { n += r.refs; }
    return n;
  }
  [[nodiscard]] std::uint64_t in_use() const
  {
    std::lock_guard lock{m_};
    return head_ - tail_;
  }

 private:
  struct region {
    std::uint64_t start;
    std::uint64_t end;
    std::uint32_t refs;
  };
  /// n rounded up to entry_alignment, so the next region starts aligned too (a region's physical start is a sum
  /// of padded sizes, or 0 after a wrap); never past bytes_ when n itself fits (a staging of another size).
  [[nodiscard]] std::uint64_t padded(std::uint64_t n) const noexcept
  {
    return std::min(ferry::detail::align_up(n, entry_alignment), std::max(n, bytes_));
  }
  /// `end - tail` counts the wrap padding; an empty pool takes any region of at most bytes_ (the padding
  /// holds nothing), otherwise a region larger than the released prefix could never be placed.
  [[nodiscard]] bool fits(const placement& p) const noexcept
  {
    return p.end - tail_ <= bytes_ || (regions_.empty() && p.end - p.start <= bytes_);
  }
  void advance() noexcept
  {
    while (!regions_.empty() && regions_.front().refs == 0) {
      tail_ = regions_.front().end;
      regions_.pop_front();
    }
    if (regions_.empty()) { tail_ = head_; }
  }

  std::byte* base_;
  std::uint64_t bytes_;
  std::shared_ptr<void> owner_;  // the pinned buffer
  mutable std::mutex m_;
  std::deque<region> regions_;
  std::uint64_t head_{0};
  std::uint64_t tail_{0};
};

/// `cfg` with config::staging_bytes the size of the given staging `m` (none: `cfg` as is). logic_error for a
/// base not aligned to entry_alignment, fewer bytes, or a config::staging_bytes other than 0 and m.bytes.
inline config with_staging(config cfg, const staging_memory& m)
{
  if (m.empty()) { return cfg; }
  FERRY_EXPECTS(
      m.base != nullptr && reinterpret_cast<std::uintptr_t>(m.base) % entry_alignment == 0 &&
          m.bytes >= entry_alignment,
      ferry::logic_error,
      "d2h channel: given staging expected a base aligned to {} bytes and at least {} bytes, got {} bytes at {}",
      entry_alignment, entry_alignment, m.bytes, static_cast<const void*>(m.base));
  FERRY_EXPECTS(cfg.staging_bytes == 0 || cfg.staging_bytes == m.bytes, ferry::logic_error,
                "d2h channel: config::staging_bytes expected 0 or the given staging's {} bytes, got {}", m.bytes,
                cfg.staging_bytes);
  cfg.staging_bytes = m.bytes;
  return cfg;
}

}  // namespace ferry::d2h::detail
