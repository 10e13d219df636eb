// SPDX-License-Identifier: Apache-2.0
// The thread that finishes sealed shards for shard_writer, so that its writer fills the next shard meanwhile:
// for each shard handed over, in the order given, `finish` (its last writes waited for, its header, sync and
// rename, then index.json naming it: shards are published, and listed, in their order). At most `max_pending`
// shards wait (the writer's hand-over waits for room). The first error of a `finish` is kept; the shards after it
// are given up (`lost`, then destroyed: their temporaries removed), and check(), hand_over() and wait() throw it.
#pragma once

#include "shard_file.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace ferry::sink::detail {

class shard_finisher {
 public:
  using finish_fn = std::function<void(shard_file&)>;
  using lost_fn = std::function<void(const shard_file&)>;

  /// `hold` (tests only, may be null): while it is true, no shard is finished.
  shard_finisher(finish_fn finish, lost_fn lost, std::size_t max_pending = 2,
                 const std::atomic<bool>* hold = nullptr)
      : finish_{std::move(finish)}, lost_{std::move(lost)}, max_{max_pending < 1 ? 1 : max_pending}, hold_{hold},
        t_{[this] { run(); }}
  {
  }
  shard_finisher(const shard_finisher&) = delete;
  shard_finisher& operator=(const shard_finisher&) = delete;
  /// Gives up what still waits (a run that did not end with wait(): its shards are not published), lets the
  /// shard being finished end, and stops.
  ~shard_finisher()
  {
    give_up();
    {
      std::lock_guard lk{mu_};
      stop_ = true;
    }
    work_.notify_all();
    t_.join();
  }

  /// Queues `s` (sealed); waits while max_pending shards wait. Throws the kept error (`s` is then given up).
  void hand_over(std::unique_ptr<shard_file> s)
  {
    std::unique_lock lk{mu_};
    done_.wait(lk, [&] { return error_ || q_.size() < max_; });
    if (error_) {
      lk.unlock();
      lost_(*s);
      std::rethrow_exception(error_);
    }
    q_.push_back(item{std::move(s)});
    lk.unlock();
    work_.notify_one();
  }

  /// Throws the kept error.
  void check()
  {
    std::lock_guard lk{mu_};
    if (error_) { std::rethrow_exception(error_); }
  }

  /// Waits until every shard handed over is finished (or given up after an error). Throws the kept error.
  void wait()
  {
    std::unique_lock lk{mu_};
    done_.wait(lk, [&] { return q_.empty() && !busy_; });
    if (error_) { std::rethrow_exception(error_); }
  }

  /// The run ended (the writer failed): every shard handed over is still finished, in order, where its own writes
  /// succeeded (finish throws for one whose writes failed or were dropped: it and every later one are given up, as
  /// after any error); returns once none waits. The shards sealed before the failure are published, not dropped.
  void settle() noexcept
  {
    std::unique_lock lk{mu_};
    done_.wait(lk, [&] { return q_.empty() && !busy_; });
  }

  /// Shards still waiting are given up (a run that ended without wait() or settle()); waits for the one being
  /// finished.
  void give_up() noexcept
  {
    std::deque<item> dropped;
    {
      std::unique_lock lk{mu_};
      dropped.swap(q_);
      done_.wait(lk, [&] { return !busy_; });
    }
    for (auto& d : dropped) { lost_(*d.shard); }
    dropped.clear();  // their temporaries removed, without the lock
  }

 private:
  struct item {
    std::unique_ptr<shard_file> shard;
  };

  void run()
  {
    std::unique_lock lk{mu_};
    for (;;) {
      work_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) { return; }
      item it = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      const bool failed = static_cast<bool>(error_);
      lk.unlock();
      while (hold_ != nullptr && hold_->load(std::memory_order_relaxed)) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      std::exception_ptr e;
      if (failed) {
        lost_(*it.shard);
      } else {
        try {
          finish_(*it.shard);
        } catch (...) {
          e = std::current_exception();
          lost_(*it.shard);
        }
      }
      it.shard.reset();  // an unpublished one removes its temporary
      lk.lock();
      if (e && !error_) { error_ = e; }
      busy_ = false;
      done_.notify_all();
    }
  }

  finish_fn finish_;
  lost_fn lost_;
  std::size_t max_;
  const std::atomic<bool>* hold_;
  std::mutex mu_;
  std::condition_variable work_;  // the thread: a shard, or stop
  std::condition_variable done_;  // the writer: room, idle, or an error
  std::deque<item> q_;
  bool busy_{false};
  bool stop_{false};
  std::exception_ptr error_;
  std::thread t_;  // last: started once every member above exists
};

}  // namespace ferry::sink::detail
