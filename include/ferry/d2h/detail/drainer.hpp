// SPDX-License-Identifier: Apache-2.0
// The drain side of a channel (the channel's drain thread, or the poll() caller; one at a time, under
// mutex()): acquire published_head, coalesce published FIFO entries into runs (coalesce.hpp), enqueue one
// D2H per run on the drain stream into pinned staging, reclaim ring space when the copy's event completed,
// deliver entry_views in order. Ordering steps here (docs/design/d2h.md, steps 4, 5 and 7):
//   step()            the acquire of published_head, then issue_copies() on the same thread after it;
//   issue_copies()    copies only entries with seq < the acquired head;
//   complete_finished reclaims ring bytes only after the copy that read them completed.
#pragma once

#include <ferry/backend/event.hpp>
#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/access.hpp>
#include <ferry/d2h/detail/channel_state.hpp>
#include <ferry/d2h/detail/coalesce.hpp>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
class drainer {
 public:
  using callback_type = std::function<void(entry_view&&)>;

  drainer(channel_state<B>& st, callback_type cb) : st_{st}, callback_{std::move(cb)}
  {
    events_.reserve(st_.cfg.tuning.max_copies_in_flight);
    for (std::uint32_t i = 0; i < st_.cfg.tuning.max_copies_in_flight; ++i) {
      events_.emplace_back(st_.b, ferry::backend::event_flags::disable_timing);
      free_events_.push_back(i);
    }
  }

  /// Held by whoever drains (the drain thread's step, poll(), a producer waiting in poll mode, close()).
  [[nodiscard]] std::mutex& mutex() noexcept { return mu_; }

  /// The drain thread's body (drain_mode::thread): steps until `stop`, yielding then sleeping when idle.
  void run_loop(const std::atomic<bool>& stop)
  {
    try {
      st_.b.set_device(st_.dev);
    } catch (...) {
    }
    unsigned idle = 0;
    while (!stop.load(std::memory_order_acquire)) {
      std::size_t n = 0;
      {
        std::lock_guard lock{mu_};
        n = step();
      }
      if (n > 0) {
        idle = 0;
      } else if (++idle < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(st_.cfg.tuning.drain_idle_sleep);
      }
    }
  }

  /// channel::poll() (drain_mode::poll): one step, from the thread that polled first.
  std::size_t poll()
  {
    FERRY_EXPECTS(st_.cfg.drain == drain_mode::poll, ferry::logic_error,
                  "d2h channel poll: expected drain_mode::poll, got drain_mode::thread (the channel's thread drains)");
    const auto me = std::this_thread::get_id();
    std::lock_guard lock{mu_};
    if (!poller_bound_) {
      poller_ = me;
      poller_bound_ = true;
    }
    FERRY_EXPECTS(
        poller_ == me, ferry::logic_error,
        "d2h channel poll: expected the thread that polled first, got another thread (one poller per channel)");
    return step();
  }

  /// The next completed entry when no callback was given.
  std::optional<entry_view> try_pop()
  {
    std::lock_guard lock{ready_mu_};
    if (ready_.empty()) { return std::nullopt; }
    entry_view v = std::move(ready_.front());
    ready_.pop_front();
    return v;
  }
  /// Moves up to `max` completed entries, in order, to the end of `out` (one lock); returns how many.
  std::size_t try_pop(std::vector<entry_view>& out, std::size_t max)
  {
    std::lock_guard lock{ready_mu_};
    const std::size_t n = std::min(max, ready_.size());
    out.reserve(out.size() + n);
    for (std::size_t i = 0; i < n; ++i) {
      out.push_back(std::move(ready_.front()));
      ready_.pop_front();
    }
    return n;
  }

  /// One drain pass (caller holds mutex()). Returns entries delivered plus copies issued (progress).
  std::size_t step();

  [[nodiscard]] bool idle() const noexcept { return inflight_.empty(); }
  [[nodiscard]] std::size_t pending_pop()
  {
    std::lock_guard lock{ready_mu_};
    return ready_.size();
  }
  /// Exceptions the consumer callback threw, and the first one's message (caller holds mutex()).
  [[nodiscard]] std::uint64_t callback_errors() const noexcept { return cb_errors_; }
  [[nodiscard]] const std::string& first_callback_error() const noexcept { return first_cb_error_; }
  /// close()'s final check (no producer call in flight): published_head beyond the planned entries.
  void check_planned_final() { check_planned(ferry::backend::host_load_acquire(st_.head_host), true); }
  /// Copies whose completion could not be observed (their ring space and staging are never reclaimed).
  [[nodiscard]] std::size_t stuck() const noexcept { return stuck_.size(); }

 private:
  /// One coalesced D2H in flight: its entries, where its bytes land in staging, the event that completes it.
  struct run {
    std::vector<entry_meta> entries;
    std::uint64_t last_size{0};  ///< payload bytes of the last entry (the others: entry_meta::bytes)
    bool overflow{false};        ///< one rejected dynamic entry, no copy
    std::uint64_t bytes{0};
    std::uint64_t staging_start{0};
    std::uint64_t ring_end{0};
    std::size_t event{0};
    bool has_event{false};
  };

  std::size_t issue_copies(std::uint64_t head);
  std::size_t complete_finished();
  void deliver(entry_view&& v);
  void check_planned(std::uint64_t h, bool final);
  void callback_failed(const char* what)
  {
    if (cb_errors_++ == 0) { first_cb_error_ = what; }
    st_.c_cb_errors.fetch_add(1, std::memory_order_relaxed);
    if (st_.cfg.on_error == error_policy::disable && !st_.capture_disabled()) {  // a failing sink stops capture
      (void)st_.disable_capture(ferry::detail::format("the consumer callback threw: {}", what));
    }
  }
  void test_delay();
  [[nodiscard]] std::uint64_t read_size_slot(std::uint64_t slot) const noexcept
  {
    // Written by the GPU before the release we acquired: a plain read is ordered after it.
    return st_.size_host[slot % st_.cfg.tuning.size_slots];
  }

  channel_state<B>& st_;
  callback_type callback_;
  std::mutex mu_;
  std::thread::id poller_{};
  bool poller_bound_{false};
  std::vector<ferry::backend::event<B>> events_;
  std::vector<std::size_t> free_events_;
  std::deque<run> inflight_;
  /// Copies whose completion can no longer be observed (event record and stream sync failed): their ring
  /// space and staging are never reclaimed, so no DMA can read or write reused memory.
  std::vector<run> stuck_;
  std::uint64_t published_seen_{0};
  std::mutex ready_mu_;
  std::deque<entry_view> ready_;
  std::string drain_error_;
  std::uint64_t planned_end_{0};  ///< one past the highest seq the FIFO ever held (entries the CPU placed)
  bool unplanned_seen_{false};
  std::uint64_t cb_errors_{0};    ///< under mu_ (deliver runs on the drainer)
  std::string first_cb_error_;    ///< under mu_
};

}  // namespace ferry::d2h::detail

#include <ferry/d2h/detail/drainer.inl>
