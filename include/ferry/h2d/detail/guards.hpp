// SPDX-License-Identifier: Apache-2.0
// The RAII guards of H2D publication: slot_guard (one forward epoch of one slot) and producer_guard (one
// group's producer scope). Both are created only by the publisher and call its private members.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/error.hpp>
#include <ferry/h2d/types.hpp>

#include <cstdio>
#include <exception>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace ferry::h2d {

template <ferry::backend::backend B>
class publisher;

namespace detail {
/// The control block a publisher shares with its guards: `pub` is cleared by ~publisher, so a guard that
/// outlives its publisher is refused (use) or does nothing (destruction) instead of touching freed memory.
/// Same-thread contract: a guard is used on the owner thread, as the publisher is.
template <ferry::backend::backend B>
struct lifeline {
  publisher<B>* pub;
};

/// The live publisher behind a guard, or a logic_error naming the guard, the call and why.
template <ferry::backend::backend B>
[[nodiscard]] publisher<B>* live(const std::shared_ptr<lifeline<B>>& l, const char* guard, const char* call)
{
  FERRY_EXPECTS(l != nullptr, logic_error, "h2d {}: {}() on a moved-from guard", guard, call);
  FERRY_EXPECTS(l->pub != nullptr, logic_error, "h2d {}: {}() refused: publisher destroyed (the guard outlived it)",
                guard, call);
  return l->pub;
}
}  // namespace detail

/// RAII handle of one forward epoch of one slot (from publisher::begin / resume). finish() records the
/// slot's completion event; the destructor finishes an unfinished epoch (never throws).
template <ferry::backend::backend B>
class [[nodiscard]] slot_guard {
 public:
  slot_guard(const slot_guard&) = delete;
  slot_guard& operator=(const slot_guard&) = delete;
  slot_guard(slot_guard&& o) noexcept : life_{std::move(o.life_)}, slot_{o.slot_}, epoch_{o.epoch_} {}
  slot_guard& operator=(slot_guard&&) = delete;
  /// Finishes the epoch if it is still active; a no-op when moved from or when the publisher is destroyed.
  ~slot_guard()
  {
    auto* pub = life_ ? life_->pub : nullptr;
    if (pub != nullptr && pub->is_active(slot_, epoch_)) {
      try {
        pub->finish();
      } catch (const std::exception& e) {  // finish() invalidated the owner; destructors never throw
        std::fprintf(stderr, "ferry: h2d slot_guard destroyed: finishing slot %zu (epoch %llu) failed: %s\n", slot_,
                     static_cast<unsigned long long>(epoch_), e.what());
      } catch (...) {
        std::fprintf(stderr, "ferry: h2d slot_guard destroyed: finishing slot %zu failed: unknown error\n", slot_);
      }
    }
  }
  /// Records the slot's completion after its uploads (publisher::finish); the epoch must still be active.
  /// Refused (logic_error) on a moved-from guard or after the publisher was destroyed.
  void finish()
  {
    auto* pub = detail::live(life_, "slot_guard", "finish");
    FERRY_EXPECTS(pub->is_active(slot_, epoch_), logic_error,
                  "h2d slot {}: finish() on an epoch ({}) that is not active", slot_, epoch_);
    pub->finish();
  }
  /// The runner slot this epoch runs on.
  [[nodiscard]] std::size_t slot() const noexcept { return slot_; }
  /// The epoch (increasing over the publisher's life; resume() returns the slot's latest one).
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

 private:
  friend class publisher<B>;
  slot_guard(std::shared_ptr<detail::lifeline<B>> l, std::size_t slot, std::uint64_t epoch)
    : life_{std::move(l)}, slot_{slot}, epoch_{epoch}
  {
  }
  std::shared_ptr<detail::lifeline<B>> life_;
  std::size_t slot_;
  std::uint64_t epoch_;
};

/// RAII producer scope (the C++ form of @h2d_producer("group")): created only after the current slot and
/// epoch were checked and no member of the group was published in this epoch (also through a combined
/// group) nor is held by another producer. Gives the slot's pinned sources of the group's members.
template <ferry::backend::backend B>
class [[nodiscard]] producer_guard {
 public:
  producer_guard(const producer_guard&) = delete;
  producer_guard& operator=(const producer_guard&) = delete;
  producer_guard(producer_guard&& o) noexcept
    : life_{std::move(o.life_)}, group_{o.group_}, slot_{o.slot_}, epoch_{o.epoch_}
  {
  }
  producer_guard& operator=(producer_guard&&) = delete;
  /// Releases the group's members (another producer may then hold them); a no-op when moved from or when
  /// the publisher is destroyed.
  ~producer_guard()
  {
    if (life_ && life_->pub != nullptr) { life_->pub->close_producer(group_); }
  }

  /// The current slot's pinned source of `buf` (capacity bytes, viewed as T). Refused for a stale guard
  /// (its epoch finished), a buffer outside the group, or one this producer does not hold, a T that does not
  /// fit the buffer (sizeof(T) must be 1, the element size, or for rows the row size; for a bytes buffer
  /// any size dividing the capacity), a moved-from guard, and a guard whose publisher was destroyed.
  template <class T>
  [[nodiscard]] std::span<T> source(buffer_handle buf) const
  {
    static_assert(std::is_trivially_copyable_v<T>);
    return detail::live(life_, "producer_guard", "source")->template producer_source<T>(group_, buf, slot_, epoch_);
  }
  /// Sets `buf`'s count (publisher::set_count) after the same checks as source().
  void set_count(buffer_handle buf, std::size_t count) const
  {
    auto* pub = detail::live(life_, "producer_guard", "set_count");
    pub->check_producer(group_, buf, slot_, epoch_);
    pub->set_count(buf, count);
  }
  /// The group this producer writes.
  [[nodiscard]] group_handle group() const noexcept { return group_; }

 private:
  friend class publisher<B>;
  producer_guard(std::shared_ptr<detail::lifeline<B>> l, group_handle g, std::size_t slot, std::uint64_t epoch)
    : life_{std::move(l)}, group_{g}, slot_{slot}, epoch_{epoch}
  {
  }
  std::shared_ptr<detail::lifeline<B>> life_;
  group_handle group_;
  std::size_t slot_;
  std::uint64_t epoch_;
};

}  // namespace ferry::h2d
