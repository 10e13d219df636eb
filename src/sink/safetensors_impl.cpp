// SPDX-License-Identifier: Apache-2.0
// safetensors_impl's two threads (safetensors_impl.hpp): deliver(), the drain thread's call (the forward
// it belongs to, the queue limit and its policy), and run(), the writer thread's loop (each queued item handed
// to the shard_writer; a logic error refuses the entry, any other error ends the run).
#include "safetensors_impl.hpp"

namespace ferry::sink::detail {

/// The drain thread's call: the entry is queued, dropped (policy drop), or refused.
void safetensors_impl::deliver(d2h::entry_view&& v)
{
  if (!v.ok()) {
    ++c_.failed_entries;
    return;
  }
  const std::uint64_t fwd = v.forward_index();
  const std::uint64_t need = v.size();
  std::unique_lock lk{mu_};
  if (failed_ || stopping_) { return refuse_locked(v, fwd); }
  if (!in_valid_ || fwd != in_fwd_) {
    in_valid_ = true;
    in_fwd_ = fwd;
    in_dropped_ = false;
  }
  if (in_dropped_) {
    ++c_.dropped_entries;
    c_.dropped_bytes += need;
    return;
  }
  if (q_bytes_ != 0 && q_bytes_ + need > cfg_.max_queue_bytes) {
    if (cfg_.policy == queue_policy::drop) {
      in_dropped_ = true;
      ++c_.dropped_forwards;
      ++c_.dropped_entries;
      c_.dropped_bytes += need;
      drops_.add(v);
      push_locked(queued{.k = queued::kind::drop, .forward = fwd, .at = clock::now()});
      return;
    }
    ++c_.stalls;
    const bool room = space_.wait_for(lk, cfg_.block_timeout, [&] {
      return failed_ || stopping_ || q_bytes_ == 0 || q_bytes_ + need <= cfg_.max_queue_bytes;
    });
    if (failed_ || stopping_) { return refuse_locked(v, fwd); }
    if (!room) {
      ++c_.stall_timeouts;
      keep_locked(std::make_exception_ptr(stall_error(ferry::detail::format(
          "ferry: safetensors sink {}: entry of hook {} (forward {}, {} bytes): expected queue space within "
          "block_timeout {} ms, got a writer still holding {} of max_queue_bytes {} (the entry was queued anyway) "
          "[{}:{}]",
          cfg_.directory.string(), v.hook().value, fwd, need, cfg_.block_timeout.count(), q_bytes_,
          cfg_.max_queue_bytes, __FILE__, __LINE__))));
    }
  }
  const std::uint64_t tag = v.tag();
  if (cfg_.policy == queue_policy::drop) {
    // Policy drop never holds the channel back: the staging is a ring, so an entry waiting for a slow disk
    // would stop every later D2H behind it. The admitted entry is copied (at memory speed, bounded by
    // max_queue_bytes) and its staging goes back when the drain thread's view dies, right after this call.
    // The copier thread copies it out of its staging (into a buffer the writer gave back) and releases the
    // view; the drain thread goes on at once.
    const d2h::hook_id hook = v.hook();
    const std::uint64_t row_bytes = v.row_bytes();
    push_locked(queued{.k = queued::kind::entry, .view = std::move(v), .forward = fwd, .tag = tag, .bytes = need,
                       .at = clock::now(), .owned = true, .hook = hook, .row_bytes = row_bytes});
    return;
  }
  push_locked(queued{
      .k = queued::kind::entry, .view = std::move(v), .forward = fwd, .tag = tag, .bytes = need, .at = clock::now()});
}


/// Policy drop's copier thread.
void safetensors_impl::copy_run()
{
  std::unique_lock lk{mu_};
  for (;;) {
    copy_work_.wait(lk, [&] { return !cq_.empty(); });
    queued it = std::move(cq_.front());
    cq_.pop_front();
    if (it.k == queued::kind::entry) {
      // The copy goes into a buffer the writer gave back (the same hook's, a few forwards ago: no allocation and
      // no page faults in steady state), made without the lock; the staging goes back right after it.
      if (!spare_.empty()) {
        it.copy = std::move(spare_.front());
        spare_.pop_front();
        spare_bytes_ -= it.copy.capacity();
      }
      lk.unlock();
      if (it.bytes != 0) {
        const auto b = it.view.bytes();
        it.copy.assign(b.begin(), b.end());
      } else {
        it.copy.clear();
      }
      it.view.release();
      lk.lock();
    }
    const bool stop = it.k == queued::kind::stop;
    q_.push_back(std::move(it));
    work_.notify_one();
    if (stop) { return; }
  }
}

/// The writer thread.
void safetensors_impl::run()
{
  std::unique_lock lk{mu_};
  for (;;) {
    if (q_.empty()) {  // the writer keeps up: its idle time (writer_idle_seconds)
      const auto t0 = clock::now();
      work_.wait(lk, [&] { return !q_.empty(); });
      c_.io.idle_ns += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count());
    }
    if (test_hold_writer.load(std::memory_order_relaxed)) {
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lk.lock();
      continue;
    }
    queued it = std::move(q_.front());
    q_.pop_front();
    const bool was_failed = failed_;
    const std::string error = first_text_;
    lk.unlock();
    std::exception_ptr soft, fatal;
    try {
      if (was_failed) {
        if (it.k == queued::kind::stop) { writer_->finish_failed(error); }
      } else if (it.k == queued::kind::entry) {
        if (it.owned) {
          writer_->entry(it.forward, it.tag, it.hook, it.row_bytes, it.copy);
        } else if (it.bytes >= cfg_.tuning.lend_min_bytes && cfg_.tuning.lend_min_bytes != 0) {
          // A large entry may be written from its staging: the view goes with the write and is released by the
          // I/O thread once written (shard_file::append), or here when it was copied after all.
          auto view = std::make_shared<d2h::entry_view>(std::move(it.view));
          const std::span<const std::byte> bytes = view->bytes();
          const d2h::hook_id hook = view->hook();  // read before the view moves into the call (argument order)
          const std::uint64_t row_bytes = view->row_bytes();
          writer_->entry(it.forward, it.tag, hook, row_bytes, bytes, std::move(view));
        } else {
          writer_->entry(it.forward, it.tag, it.view.hook(), it.view.row_bytes(),
                         it.bytes != 0 ? it.view.bytes() : std::span<const std::byte>{});
        }
      } else if (it.k == queued::kind::drop) {
        writer_->drop(it.forward);
      } else if (it.k == queued::kind::flush) {
        writer_->flush();
      } else {
        writer_->finish(error);
      }
    } catch (const ferry::logic_error&) {
      soft = std::current_exception();
    } catch (...) {
      fatal = std::current_exception();
      writer_->abandon();
      if (it.k == queued::kind::stop) { writer_->finish_failed(what_of(fatal)); }
    }
    it.view.release();
    std::vector<queued> refused;
    lk.lock();
    if (it.k == queued::kind::entry) {
      --q_entries_;
      q_bytes_ -= it.bytes;
      if (soft || was_failed || fatal) { ++c_.refused_entries; }
    }
    if (soft) { keep_locked(soft); }
    if (fatal) {
      keep_locked(fatal);
      fatal_ = fatal;
      failed_ = true;
      std::deque<queued> orders;  // queued entries go back now (their staging with them); orders stay
      for (auto& q : q_) {
        if (q.k == queued::kind::entry) {
          ++c_.refused_entries;
          --q_entries_;
          q_bytes_ -= q.bytes;
          refused.push_back(std::move(q));
        } else {
          orders.push_back(std::move(q));
        }
      }
      q_.swap(orders);
    }
    if (it.owned && spare_bytes_ + it.copy.capacity() <= cfg_.max_queue_bytes) {
      spare_bytes_ += it.copy.capacity();
      spare_.push_back(std::move(it.copy));  // for deliver()'s next copy (policy drop)
    }
    if (it.k == queued::kind::flush) { ++flush_done_; }
    const bool stop = it.k == queued::kind::stop;
    stopped_ = stopped_ || stop;
    done_.notify_all();
    space_.notify_all();
    lk.unlock();
    refused.clear();  // the views' staging, released without the lock
    if (stop) { return; }
    lk.lock();
  }
}


}  // namespace ferry::sink::detail
