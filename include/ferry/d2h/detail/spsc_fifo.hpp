// SPDX-License-Identifier: Apache-2.0
// Fixed-capacity single-producer / single-consumer FIFO (rigtorp SPSCQueue style): head and tail on
// their own cache lines, each side caches the other's index. The producer is the channel's producer
// thread; the consumer is the drainer (drain thread, or whoever holds the drain lock in poll mode).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <vector>

namespace ferry::d2h::detail {

inline constexpr std::size_t cache_line = 128;  // two 64-byte lines: adjacent-line prefetch

template <class T>
class spsc_fifo {
 public:
  explicit spsc_fifo(std::size_t capacity) : slots_(capacity) {}

  [[nodiscard]] std::size_t capacity() const noexcept { return slots_.size(); }
  /// Approximate (exact from either side for its own view).
  [[nodiscard]] std::size_t size() const noexcept
  {
    return static_cast<std::size_t>(head_.load(std::memory_order_acquire) - tail_.load(std::memory_order_acquire));
  }
  [[nodiscard]] std::size_t free_slots() const noexcept { return capacity() - size(); }

  // ---- producer ----
  [[nodiscard]] bool try_push(const T& v) noexcept
  {
    const std::uint64_t h = head_.load(std::memory_order_relaxed);
    if (h - cached_tail_ >= slots_.size()) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (h - cached_tail_ >= slots_.size()) { return false; }
    }
    slots_[h % slots_.size()] = v;
    head_.store(h + 1, std::memory_order_release);
    return true;
  }

  // ---- consumer ----
  /// Entries visible to the consumer.
  [[nodiscard]] std::size_t readable() noexcept
  {
    const std::uint64_t t = tail_.load(std::memory_order_relaxed);
    if (cached_head_ == t) { cached_head_ = head_.load(std::memory_order_acquire); }
    return static_cast<std::size_t>(cached_head_ - t);
  }
  /// The i-th readable entry (i < readable()).
  [[nodiscard]] const T& peek(std::size_t i) const noexcept
  {
    return slots_[(tail_.load(std::memory_order_relaxed) + i) % slots_.size()];
  }
  /// Refresh the consumer's view of the producer index.
  void refresh() noexcept { cached_head_ = head_.load(std::memory_order_acquire); }
  void pop(std::size_t n = 1) noexcept
  {
    tail_.store(tail_.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }

 private:
  std::vector<T> slots_;
  alignas(cache_line) std::atomic<std::uint64_t> head_{0};
  alignas(cache_line) std::uint64_t cached_tail_{0};  // producer's copy
  alignas(cache_line) std::atomic<std::uint64_t> tail_{0};
  alignas(cache_line) std::uint64_t cached_head_{0};  // consumer's copy
  char pad_[cache_line - sizeof(std::uint64_t)]{};
};

}  // namespace ferry::d2h::detail
