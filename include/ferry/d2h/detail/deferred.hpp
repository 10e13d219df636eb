// SPDX-License-Identifier: Apache-2.0
// The producer's deferred batch: capture_deferred() only records (hook, source, bytes) here, on the CPU;
// the batch is copied by ONE gather launch at its flush point (producer::flush_deferred): the batch limit
// (config::publish_every, at most gather_max_entries), end_forward, an explicit flush, and any immediate
// capture or begin_write (entry order is preserved: the gather is enqueued before the next writer).
// Contract (docs/api/d2h.md, "Deferred capture"): a deferred source stays allocated and unmodified from
// capture until its flush has been enqueued on the same stream.
#pragma once

#include <ferry/d2h/detail/gather.hpp>
#include <ferry/d2h/types.hpp>

#include <algorithm>
#include <array>
#include <cstdint>

namespace ferry::d2h::detail {

/// The deferred entries recorded since the last flush, in entry order.
class deferred_batch {
 public:
  struct entry {
    hook_id hook{};
    const std::byte* src{nullptr};
    std::uint64_t bytes{0};
    std::uint64_t reserved{0};
    bool staged{false};  ///< a staged immediate capture (its source is a channel-owned staging slot)
  };

  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  [[nodiscard]] std::uint32_t size() const noexcept { return n_; }
  [[nodiscard]] const entry& operator[](std::uint32_t i) const noexcept { return e_[i]; }

  /// Whether an entry of `reserved` bytes must go into a new batch: the batch holds `limit` entries, or
  /// with it the batch could span more than `ring_bytes` (its entries plus at most one wrap padding, which
  /// is shorter than the largest entry), which no reservation could hold.
  [[nodiscard]] bool needs_flush_before(std::uint64_t reserved, std::uint32_t limit,
                                        std::uint64_t ring_bytes) const noexcept
  {
    if (n_ == 0) { return false; }
    if (n_ >= limit) { return true; }
    return sum_ + reserved + std::max(max_, reserved) > ring_bytes;
  }

  void push(hook_id hook, const void* src, std::uint64_t bytes, std::uint64_t reserved, bool staged = false) noexcept
  {
    e_[n_++] = entry{hook, static_cast<const std::byte*>(src), bytes, reserved, staged};
    sum_ += reserved;
    max_ = std::max(max_, reserved);
  }
  /// Drops every entry but the staged ones (abort_forward: the user's deferred sources may be gone, the
  /// staging slots are the channel's and their copies were launched).
  void keep_staged() noexcept
  {
    std::uint32_t k = 0;
    sum_ = 0;
    max_ = 0;
    for (std::uint32_t i = 0; i < n_; ++i) {
      if (!e_[i].staged) { continue; }
      e_[k++] = e_[i];
      sum_ += e_[i].reserved;
      max_ = std::max(max_, e_[i].reserved);
    }
    n_ = k;
  }
  void clear() noexcept
  {
    n_ = 0;
    sum_ = 0;
    max_ = 0;
  }

 private:
  std::array<entry, gather_max_entries> e_{};
  std::uint32_t n_{0};
  std::uint64_t sum_{0};  ///< reserved bytes of the batch
  std::uint64_t max_{0};  ///< largest reserved entry of the batch
};

/// The batch limit: K (config::publish_every), at most gather_max_entries and the FIFO's capacity.
[[nodiscard]] constexpr std::uint32_t deferred_limit(const config& cfg, std::size_t fifo_capacity) noexcept
{
  const std::uint64_t k = std::max<std::uint32_t>(1, cfg.publish_every);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>({k, gather_max_entries, fifo_capacity}));
}

/// Whether capture() of a static entry of `bytes` is a staged capture (config::staged_capture_max_bytes
/// `max_bytes`, 0: off): it joins the deferred batch (producer::capture_staged; the Python binding mirrors it).
[[nodiscard]] constexpr bool staged_capture(std::uint64_t max_bytes, std::uint64_t bytes) noexcept
{
  return max_bytes != 0 && bytes <= max_bytes;
}

}  // namespace ferry::d2h::detail
