// SPDX-License-Identifier: Apache-2.0
// The RAII guards of H2D publication: slot_guard (one forward epoch of one slot) and producer_guard (one
// group's producer scope). Both are created only by the publisher and call its private members.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/error.hpp>
#include <ferry/h2d/types.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

namespace ferry::h2d {

template <ferry::backend::backend B>
class publisher;

/// RAII handle of one forward epoch of one slot (from publisher::begin / resume). finish() records the
/// slot's completion event; the destructor finishes an unfinished epoch (never throws).
template <ferry::backend::backend B>
class [[nodiscard]] slot_guard {
 public:
  slot_guard(const slot_guard&) = delete;
  slot_guard& operator=(const slot_guard&) = delete;
  slot_guard(slot_guard&& o) noexcept : pub_{std::exchange(o.pub_, nullptr)}, slot_{o.slot_}, epoch_{o.epoch_} {}
  slot_guard& operator=(slot_guard&&) = delete;
  ~slot_guard()
  {
    if (pub_ != nullptr && pub_->is_active(slot_, epoch_)) {
      try {
        pub_->finish();
      } catch (...) {  // finish() invalidated the owner; destructors never throw
      }
    }
  }
  /// Records the slot's completion after its uploads (publisher::finish); the epoch must still be active.
  void finish()
  {
    FERRY_EXPECTS(pub_ != nullptr && pub_->is_active(slot_, epoch_), logic_error,
                  "h2d slot {}: finish() on an epoch ({}) that is not active", slot_, epoch_);
    pub_->finish();
  }
  /// The runner slot this epoch runs on.
  [[nodiscard]] std::size_t slot() const noexcept { return slot_; }
  /// The epoch (increasing over the publisher's life; resume() returns the slot's latest one).
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

 private:
  friend class publisher<B>;
  slot_guard(publisher<B>* p, std::size_t slot, std::uint64_t epoch) : pub_{p}, slot_{slot}, epoch_{epoch} {}
  publisher<B>* pub_;
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
    : pub_{std::exchange(o.pub_, nullptr)}, group_{o.group_}, slot_{o.slot_}, epoch_{o.epoch_}
  {
  }
  producer_guard& operator=(producer_guard&&) = delete;
  /// Releases the group's members (another producer may then hold them).
  ~producer_guard()
  {
    if (pub_ != nullptr) { pub_->close_producer(group_); }
  }

  /// The current slot's pinned source of `buf` (capacity bytes, viewed as T). Refused for a stale guard
  /// (its epoch finished), a buffer outside the group, or one this producer does not hold.
  template <class T>
  [[nodiscard]] std::span<T> source(buffer_handle buf) const
  {
    static_assert(std::is_trivially_copyable_v<T>);
    return pub_->template producer_source<T>(group_, buf, slot_, epoch_);
  }
  /// Sets `buf`'s count (publisher::set_count) after the same checks as source().
  void set_count(buffer_handle buf, std::size_t count) const
  {
    pub_->check_producer(group_, buf, slot_, epoch_);
    pub_->set_count(buf, count);
  }
  /// The group this producer writes.
  [[nodiscard]] group_handle group() const noexcept { return group_; }

 private:
  friend class publisher<B>;
  producer_guard(publisher<B>* p, group_handle g, std::size_t slot, std::uint64_t epoch)
    : pub_{p}, group_{g}, slot_{slot}, epoch_{epoch}
  {
  }
  publisher<B>* pub_;
  group_handle group_;
  std::size_t slot_;
  std::uint64_t epoch_;
};

}  // namespace ferry::h2d
