// SPDX-License-Identifier: Apache-2.0
// detail::reservation<B>: the producer's side of ring space. It alone advances the virtual head position,
// the entry sequence and the size-slot counter, and pushes the FIFO records the drainer reads: whether a run
// of entries fits (ring bytes, FIFO slots, size slots), the wait for space under config::on_full, where a
// run of entries lands (place(), never straddling the ring's end: the device's place_phys chain), and the
// bookkeeping of reserved entries (FIFO record, head, counters), written once for the copy kernel, the
// deferred batch's gather and a graph replay's plan.
#pragma once

#include <ferry/d2h/detail/channel_state.hpp>
#include <ferry/d2h/detail/entry_meta.hpp>
#include <ferry/d2h/ring_ref.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace ferry::d2h::detail {

/// What a producer call does when the ring, the FIFO or the size ring has no room.
enum class when_full {
  wait,         ///< full_policy::block_with_timeout: wait for the drain, timeout_error after config::timeout
  throw_error,  ///< full_policy::fail_fast: out_of_memory at once
  refuse,       ///< try_capture / try_plan: return false at once
};

/// The policy of the blocking calls (capture, plan, begin_write) under config::on_full.
[[nodiscard]] constexpr when_full blocking_policy(const config& cfg) noexcept
{
  return cfg.on_full == full_policy::fail_fast ? when_full::throw_error : when_full::wait;
}

template <ferry::backend::backend B>
class reservation {
 public:
  /// Called while the producer waits for ring space: makes or awaits drain progress (poll mode: one drain
  /// step; thread mode: a wait on the space condition). Injected by channel_impl.
  using progress_fn = std::function<void()>;

  reservation(channel_state<B>& st, progress_fn progress) : st_{st}, progress_{std::move(progress)} {}

  /// The virtual ring position after the last reserved entry.
  [[nodiscard]] std::uint64_t head() const noexcept { return head_pos_; }

  /// Do `n_entries` more entries ending at virtual position `end` (with `n_dyn` dynamic) fit?
  [[nodiscard]] bool fits(std::uint64_t end, std::size_t n_entries, std::uint64_t n_dyn) const noexcept
  {
    // `end - tail` counts the wrap padding the new entries skip. When the ring is empty (every reserved byte
    // reclaimed) one entry always fits (reserved <= ring_bytes is checked): its padding holds no data, and
    // without this an entry larger than the reclaimed prefix could never be placed.
    const std::uint64_t tail = st_.tail_pos.load(std::memory_order_acquire);
    const bool ring_ok = end - tail <= st_.cfg.ring_bytes || (tail == head_pos_ && n_entries == 1);
    const bool fifo_ok = st_.fifo.free_slots() >= n_entries;
    const bool dyn_ok =
      n_dyn == 0 || dyn_next_ + n_dyn - st_.dyn_freed.load(std::memory_order_acquire) <= st_.cfg.tuning.size_slots;
    return ring_ok && fifo_ok && dyn_ok;
  }

  /// Waits until fits(end, n_entries, n_dyn) under `full`; false when full and `full` is refuse.
  /// `before_wait()` runs once before an actual wait (the eager producer publishes what it launched: entries
  /// launched but not published cannot drain); `who()` names the caller in the errors.
  template <class BeforeWait, class Who>
  bool wait_for_space(std::uint64_t end, std::size_t n_entries, std::uint64_t n_dyn, when_full full,
                      BeforeWait&& before_wait, Who&& who_fn)
  {
    if (fits(end, n_entries, n_dyn)) [[likely]] { return true; }
    const std::string who = who_fn();
    st_.c_stalls.fetch_add(1, std::memory_order_relaxed);
    if (full == when_full::refuse) { return false; }
    if (full == when_full::throw_error) {
      FERRY_FAIL(ferry::out_of_memory,
                 "d2h channel: {}: ring full (fail_fast): expected {} free bytes, {} FIFO slots and {} size slots, "
                 "got {} of {} ring bytes in use, {} FIFO slots free",
                 who, end - head_pos_, n_entries, n_dyn, head_pos_ - st_.tail_pos.load(), st_.cfg.ring_bytes,
                 st_.fifo.free_slots());
    }
    before_wait();
    const auto deadline = std::chrono::steady_clock::now() + st_.cfg.timeout;
    while (!fits(end, n_entries, n_dyn)) {
      st_.check_not_failed(who.c_str());
      if (std::chrono::steady_clock::now() >= deadline) {
        FERRY_FAIL(ferry::timeout_error,
                   "d2h channel: {}: expected ring space within {} ms, got {} of {} ring bytes still in use and {} "
                   "FIFO slots free (is the consumer releasing entries? is the drain running?)",
                   who, st_.cfg.timeout.count(), head_pos_ - st_.tail_pos.load(), st_.cfg.ring_bytes,
                   st_.fifo.free_slots());
      }
      progress_();
    }
    return true;
  }

  /// Places `n` entries one after the other from virtual position `from` (reserved_of(i): the i-th entry's
  /// ring bytes), as the device's place_phys chain places them; where[i] receives each (may be null).
  /// Returns the virtual position after the last.
  template <class ReservedOf>
  [[nodiscard]] std::uint64_t place_run(std::uint64_t from, std::size_t n, ReservedOf&& reserved_of,
                                        placement* where = nullptr) const noexcept
  {
    std::uint64_t pos = from;
    for (std::size_t i = 0; i < n; ++i) {
      const placement p = place(pos, reserved_of(i), st_.cfg.ring_bytes);
      if (where != nullptr) { where[i] = p; }
      pos = p.end;
    }
    return pos;
  }

  /// Records one reserved entry for the drainer (space was checked: the producer is the only pusher): the
  /// next sequence number, its ring place and sizes; a dynamic entry takes the next size slot.
  void push(hook_id hook, placement where, std::uint64_t reserved, std::uint64_t bytes, bool dynamic,
            std::uint64_t row_bytes = 0) noexcept
  {
    const entry_meta m{next_seq_++, where.start, reserved, bytes, dynamic ? dyn_next_ : 0, hook.value, dynamic,
                       forward_,    row_bytes};
    (void)st_.fifo.try_push(m);
    if (dynamic) { ++dyn_next_; }
  }
  /// The forward the next pushed entries belong to (begin_forward of an eager forward, plan() of a replay).
  void set_forward(std::uint64_t index) noexcept { forward_ = index; }
  /// The `n` entries pushed last end at `end`: the head moves there; reserved and high-water counters.
  void advance(std::uint64_t end, std::size_t n) noexcept
  {
    head_pos_ = end;
    st_.c_reserved.fetch_add(n, std::memory_order_relaxed);
    atomic_max(st_.c_high, head_pos_ - st_.tail_pos.load(std::memory_order_relaxed));
  }

 private:
  channel_state<B>& st_;
  progress_fn progress_;
  std::uint64_t head_pos_{0};  ///< virtual ring position after the last reserved entry
  std::uint64_t dyn_next_{0};  ///< dynamic entries reserved (size slot = dyn_next % size_slots)
  std::uint64_t next_seq_{0};
  std::uint64_t forward_{0};  ///< entry_meta::forward of the next push
};

}  // namespace ferry::d2h::detail
