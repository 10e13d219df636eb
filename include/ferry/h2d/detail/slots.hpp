// SPDX-License-Identifier: Apache-2.0
// Slot and epoch state of H2D publication, and the checks made against it: which slot is active, each
// slot's epoch, the counts set in it, which buffers were published in it and by which group, which
// producer holds which buffer. No backend: every rule here is a function of this state and the
// declarations. A check throws before it changes anything (validation is all-or-nothing).
#pragma once

#include <ferry/error.hpp>
#include <ferry/h2d/detail/plan.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace ferry::h2d::detail {

/// The epoch bookkeeping of one runner slot (per buffer vectors are indexed by buffer).
struct slot_book {
  std::uint64_t epoch{0};
  bool began{false};     ///< an epoch was started on this slot (resume() needs one)
  bool recorded{false};  ///< finish() recorded the slot's completion event at least once
  std::vector<std::size_t> counts;             ///< in the buffer's unit
  std::vector<std::uint64_t> count_epoch;      ///< epoch in which the count was set
  std::vector<std::uint64_t> published_epoch;  ///< epoch in which the buffer was published (0: reopened)
  std::vector<std::uint32_t> published_by;     ///< group that published it
};

/// Every slot's book, the active slot, the epoch counter and the open producers.
class slot_table {
 public:
  void reset(std::size_t slots, std::size_t buffers)
  {
    books_.assign(slots, slot_book{});
    for (auto& s : books_) {
      s.counts.assign(buffers, 0);
      s.count_epoch.assign(buffers, 0);
      s.published_epoch.assign(buffers, 0);
      s.published_by.assign(buffers, 0);
    }
    producer_open_.assign(buffers, none);
  }

  [[nodiscard]] std::size_t size() const noexcept { return books_.size(); }
  [[nodiscard]] int active() const noexcept { return active_; }
  [[nodiscard]] std::uint64_t epoch_counter() const noexcept { return epoch_counter_; }
  [[nodiscard]] slot_book& operator[](std::size_t slot) noexcept { return books_[slot]; }
  [[nodiscard]] const slot_book& operator[](std::size_t slot) const noexcept { return books_[slot]; }
  [[nodiscard]] const std::vector<std::uint32_t>& producer_open() const noexcept { return producer_open_; }
  /// The active slot's book (callers checked that one is active).
  [[nodiscard]] slot_book& current() noexcept { return books_[static_cast<std::size_t>(active_)]; }

  [[nodiscard]] bool is_active(std::size_t slot, std::uint64_t epoch) const noexcept
  {
    return active_ == static_cast<int>(slot) && books_[slot].epoch == epoch;
  }

  /// begin(slot): in range and no slot active. The caller waits for the slot's completion, then starts.
  void check_begin(std::size_t slot) const
  {
    FERRY_EXPECTS(slot < books_.size(), logic_error, "h2d publisher: slot {} out of range (have {})", slot,
                  books_.size());
    FERRY_EXPECTS(active_ < 0, logic_error, "h2d publisher: begin({}) while slot {} is active; finish() it first",
                  slot, active_);
  }
  /// Starts a new epoch on `slot` and makes it active; returns the epoch.
  std::uint64_t start_epoch(std::size_t slot) noexcept
  {
    auto& s = books_[slot];
    s.epoch = ++epoch_counter_;
    s.began = true;
    active_ = static_cast<int>(slot);
    return s.epoch;
  }
  /// resume(slot): re-activates the slot's latest epoch and returns it.
  std::uint64_t resume(std::size_t slot)
  {
    FERRY_EXPECTS(slot < books_.size(), logic_error, "h2d publisher: slot {} out of range (have {})", slot,
                  books_.size());
    FERRY_EXPECTS(active_ < 0, logic_error, "h2d publisher: resume({}) while slot {} is active", slot, active_);
    FERRY_EXPECTS(books_[slot].began, logic_error, "h2d publisher: resume({}) of a slot that never began", slot);
    active_ = static_cast<int>(slot);
    return books_[slot].epoch;
  }
  void check_finish() const
  {
    FERRY_EXPECTS(active_ >= 0, logic_error, "h2d publisher: finish() with no active slot");
  }
  /// The active slot's completion was recorded: it becomes inactive.
  void finished() noexcept
  {
    current().recorded = true;
    active_ = -1;
  }
  /// After a backend failure or on recovery: no slot is active (and, on recovery, no producer open).
  void deactivate() noexcept { active_ = -1; }
  void recover() noexcept
  {
    active_ = -1;
    std::fill(producer_open_.begin(), producer_open_.end(), none);
  }

  /// producer(g): an active slot (the `expected` one, when given), and no member published in this epoch
  /// (also through another group) nor held by an open producer. Then the group's producer holds every member.
  void open_producer(const declarations& d, group_handle g, std::optional<std::size_t> expected = std::nullopt)
  {
    const auto& gr = d.group(g);
    if (expected) {
      FERRY_EXPECTS(active_ >= 0, logic_error,
                    "h2d producer '{}': expected slot {}, got no active slot (call begin({}) first)", gr.name,
                    *expected, *expected);
      FERRY_EXPECTS(static_cast<std::size_t>(active_) == *expected, logic_error,
                    "h2d producer '{}': expected slot {}, got active slot {} (epoch {})", gr.name, *expected, active_,
                    current().epoch);
    }
    FERRY_EXPECTS(active_ >= 0, logic_error, "h2d producer '{}': no active slot (call begin() first)", gr.name);
    const auto& s = current();
    for (auto m : gr.members) {
      FERRY_EXPECTS(s.published_epoch[m] != s.epoch, logic_error,
                    "h2d producer '{}': reentry rejected: buffer '{}' was already published in epoch {} by group "
                    "'{}' (a deliberate second publication uses rewrite(group, reason))",
                    gr.name, d.buffers[m].spec.name, s.epoch, d.groups[s.published_by[m]].name);
      FERRY_EXPECTS(producer_open_[m] == none, logic_error,
                    "h2d producer '{}': reentry rejected: buffer '{}' is held by the open producer of group '{}'",
                    gr.name, d.buffers[m].spec.name, open_name(d, m));
    }
    for (auto m : gr.members) { producer_open_[m] = g.value; }
  }
  void close_producer(const declarations& d, group_handle g) noexcept
  {
    if (g.value >= d.groups.size()) { return; }
    for (auto m : d.groups[g.value].members) {
      if (producer_open_[m] == g.value) { producer_open_[m] = none; }
    }
  }
  /// A guard's access to `buf`: not stale, a member of the group, held by this producer.
  void check_producer(const declarations& d, group_handle g, buffer_handle buf, std::size_t slot,
                      std::uint64_t epoch) const
  {
    const auto& gr = d.group(g);
    const auto& r = d.buffer(buf);
    FERRY_EXPECTS(is_active(slot, epoch), logic_error,
                  "h2d producer '{}': stale guard (slot {} epoch {}; active slot {} epoch {})", gr.name, slot, epoch,
                  active_, active_ >= 0 ? books_[static_cast<std::size_t>(active_)].epoch : 0);
    FERRY_EXPECTS(std::find(gr.members.begin(), gr.members.end(), buf.value) != gr.members.end(), logic_error,
                  "h2d producer '{}': buffer '{}' is not a member of the group", gr.name, r.spec.name);
    FERRY_EXPECTS(producer_open_[buf.value] == g.value, logic_error,
                  "h2d producer '{}': buffer '{}' is not held by this producer", gr.name, r.spec.name);
  }

  /// set_count(buf, count): an active slot, within capacity, not yet published in this epoch.
  void set_count(const declarations& d, buffer_handle buf, std::size_t count)
  {
    const auto& r = d.buffer(buf);
    FERRY_EXPECTS(active_ >= 0, logic_error, "h2d buffer '{}': set_count() with no active slot", r.spec.name);
    FERRY_EXPECTS(count <= r.spec.capacity, logic_error, "h2d group '{}': buffer '{}' count {} exceeds capacity {}",
                  d.groups[r.groups.front()].name, r.spec.name, count, r.spec.capacity);
    auto& s = current();
    FERRY_EXPECTS(s.published_epoch[buf.value] != s.epoch, logic_error,
                  "h2d buffer '{}': set_count() after it was published in epoch {} (rewrite(group, reason) first)",
                  r.spec.name, s.epoch);
    s.counts[buf.value] = count;
    s.count_epoch[buf.value] = s.epoch;
  }

  /// The member rules of a publication of `g` in the active slot: every member has a count in this epoch,
  /// within capacity, was not published in it, and is held by no other group's open producer.
  void check_members(const declarations& d, group_handle g) const
  {
    const auto& gr = d.groups[g.value];
    const auto& s = books_[static_cast<std::size_t>(active_)];
    for (auto m : gr.members) {
      const auto& r = d.buffers[m];
      FERRY_EXPECTS(s.count_epoch[m] == s.epoch, logic_error,
                    "h2d group '{}': buffer '{}' has no count in epoch {} (every member needs one; 0 publishes an "
                    "explicit empty range)",
                    gr.name, r.spec.name, s.epoch);
      FERRY_EXPECTS(s.counts[m] <= r.spec.capacity, logic_error,
                    "h2d group '{}': buffer '{}' count {} exceeds capacity {}", gr.name, r.spec.name, s.counts[m],
                    r.spec.capacity);
      FERRY_EXPECTS(s.published_epoch[m] != s.epoch, logic_error,
                    "h2d group '{}': duplicate publication of buffer '{}' in epoch {} (first by group '{}'; a "
                    "deliberate second publication uses rewrite(group, reason))",
                    gr.name, r.spec.name, s.epoch, d.groups[s.published_by[m]].name);
      FERRY_EXPECTS(producer_open_[m] == none || producer_open_[m] == g.value, logic_error,
                    "h2d group '{}': buffer '{}' is still held by the open producer of group '{}'", gr.name,
                    r.spec.name, open_name(d, m));
    }
  }
  /// Marks every member of `g` published in the active epoch, by `g`.
  void commit(const declarations& d, group_handle g) noexcept
  {
    auto& s = current();
    for (auto m : d.groups[g.value].members) {
      s.published_epoch[m] = s.epoch;
      s.published_by[m] = g.value;
    }
  }

  /// rewrite(g): no member held by an open producer.
  void check_rewrite(const declarations& d, group_handle g) const
  {
    const auto& gr = d.groups[g.value];
    for (auto m : gr.members) {
      FERRY_EXPECTS(producer_open_[m] == none, logic_error,
                    "h2d group '{}': rewrite() while buffer '{}' is held by an open producer", gr.name,
                    d.buffers[m].spec.name);
    }
  }
  /// Reopens `g`'s members published in the active epoch (after the earlier upload read the sources).
  void reopen(const declarations& d, group_handle g) noexcept
  {
    auto& s = current();
    for (auto m : d.groups[g.value].members) {
      if (s.published_epoch[m] == s.epoch) { s.published_epoch[m] = 0; }
    }
  }

  /// A direct capture bakes the counts of `slot`'s active epoch: it must be active and every member counted.
  void check_direct_capture(const declarations& d, group_handle g, std::size_t slot) const
  {
    const auto& gr = d.groups[g.value];
    FERRY_EXPECTS(active_ == static_cast<int>(slot), logic_error,
                  "h2d group '{}': a direct capture bakes the counts of the active epoch of slot {}", gr.name, slot);
    const auto& s = books_[slot];
    for (auto m : gr.members) {
      FERRY_EXPECTS(s.count_epoch[m] == s.epoch, logic_error, "h2d group '{}': buffer '{}' has no count to capture",
                    gr.name, d.buffers[m].spec.name);
    }
  }

 private:
  [[nodiscard]] std::string_view open_name(const declarations& d, std::uint32_t m) const noexcept
  {
    return producer_open_[m] == none ? std::string_view{} : std::string_view{d.groups[producer_open_[m]].name};
  }

  std::vector<slot_book> books_;
  std::vector<std::uint32_t> producer_open_;
  int active_{-1};
  std::uint64_t epoch_counter_{0};
};

}  // namespace ferry::h2d::detail
