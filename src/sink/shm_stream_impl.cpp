// SPDX-License-Identifier: Apache-2.0
// shm_stream_impl's calls (shm_stream_impl.hpp): deliver() on the drain thread, the stream thread's pass
// (service_locked: releases, the reader's session, pending entries, eviction), close(). The ordering steps
// (docs/design/shm_stream.md) are marked S1..S7 where the code performs them.
#include "shm_stream_impl.hpp"

namespace ferry::sink::detail {

void shm_stream_impl::deliver(d2h::entry_view&& v)
{
  views out;  // released after the lock (declared first: destroyed last)
  std::unique_lock lk{mu_};
  delivered_ = true;
  if (stopping_) { return refuse_locked(v, after_close); }
  if (v.ok() && v.size() > 0) {
    const std::byte* p = v.bytes().data();
    if (p < seg_->staging() || p + v.size() > seg_->staging() + seg_->staging_bytes()) {
      return refuse_locked(v,
                           "expected its bytes in the stream's staging (construct the channel with stream.staging(b)), "
                           "got bytes elsewhere");
    }
    if (!pool_) { pool_ = d2h::detail::access::staging_of(v); }
  }
  service_locked(out);
  const std::uint64_t fwd = v.forward_index();
  const bool first = !in_valid_ || fwd != in_fwd_;
  if (first) {
    in_valid_ = true;
    in_fwd_ = fwd;
    in_dropped_ = false;
  }
  const auto drop = [&] {
    ++c_.dropped_entries;
    c_.dropped_bytes += v.size();
    drops_.add(v);
  };
  if (cfg_.policy == queue_policy::drop) {
    if (first && !admit_locked(v)) {  // a forward is admitted or dropped whole, at its first entry
      in_dropped_ = true;
      ++c_.dropped_forwards;
      pressure_ = pressure_ || session_ != 0;
    }
    if (!in_dropped_ && session_ == 0) {  // admitted for a reader that went away: nobody gets its end
      in_dropped_ = true;
      ++c_.truncated_forwards;
    }
    if (in_dropped_) { return drop(); }
    if (!has_room_locked(v)) {
      ++c_.stalls;
      pressure_ = true;
      const std::uint64_t s = session_;
      space_.wait_for(lk, cfg_.timeout, [&] { return stopping_ || has_room_locked(v) || session_ != s; });
      if (stopping_) { return refuse_locked(v, after_close); }
      if (session_ != s || !has_room_locked(v)) {
        if (!has_room_locked(v)) {
          ++c_.stall_timeouts;
          end_session_locked(shm::detach_evicted, out);  // released nothing for `timeout`: evicted
        }
        in_dropped_ = true;
        ++c_.truncated_forwards;
        return drop();
      }
    }
    return publish_locked(std::move(v));
  }
  // block: publish, or wait up to `timeout` for room, then keep the entry (pending) and record the stall
  if (pending_.empty() && has_room_locked(v)) { return publish_locked(std::move(v)); }
  if (pending_.empty()) {
    ++c_.stalls;
    const bool room = space_.wait_for(lk, cfg_.timeout, [&] { return stopping_ || has_room_locked(v); });
    if (stopping_) { return refuse_locked(v, after_close); }
    if (room && pending_.empty()) { return publish_locked(std::move(v)); }
    if (!room) {
      ++c_.stall_timeouts;
      const bool slot = has_slot_locked();  // what was missing: a descriptor, or record room
      keep_locked(std::make_exception_ptr(stall_error(ferry::detail::format(
        "ferry: shm stream '{}': entry {} of hook {} (forward {}): expected {} within timeout {} ms, got a reader ({}) "
        "holding {} (kept: published once the reader releases) [{}:{}]", cfg_.name, v.seq().value, v.hook().value, fwd,
        slot ? "room for its forward's record" : "a free descriptor", cfg_.timeout.count(),
        session_ != 0 ? ferry::detail::format("pid {}", reader_pid_) : std::string{"none attached"},
        slot ? ferry::detail::format("the record region's {} bytes", seg_->record_capacity())
             : ferry::detail::format("all {}", cfg_.descriptors), __FILE__, __LINE__))));
    }
  }
  pending_.push_back(std::move(v));
}

/// S2: the forward's record (written at its first entry) and the descriptor, plain stores, then the store-release
/// of head (the reader's S3 acquires it). has_room_locked(v) was true.
void shm_stream_impl::publish_locked(d2h::entry_view&& v)
{
  shm::descriptor d{};
  d.index = head_;
  d.seq = v.seq().value;
  d.forward = v.forward_index();
  d.tag = v.tag();
  d.size = v.size();
  d.row_bytes = v.row_bytes();
  d.hook = v.hook().value;
  d.status = static_cast<std::uint32_t>(v.status());
  d.reserved = v.reserved_bytes();
  records_.place(v, head_, released_).into(d);  // S2a: the forward record's stores, if new
  if (v.ok() && v.size() > 0) { d.offset = static_cast<std::uint64_t>(v.bytes().data() - seg_->staging()); }
  if (held_.empty()) { last_progress_ = clock::now(); }  // a stall is timed from the reader's first held entry
  // The slot's previous descriptor (index head_ - capacity) was released: the reader's reads of it happened
  // before its release store, which take_releases_locked acquired (S6).
  std::memcpy(seg_->descriptors() + head_ % cfg_.descriptors, &d, sizeof d);
  ++head_;
  shm::store(h_, shm::w_head, head_);
  ++c_.entries_published;
  const std::uint64_t bytes = v.ok() ? v.size() : 0;
  c_.bytes_published += bytes;
  lag_bytes_ += bytes;
  held_.push_back(held{d.index, bytes, std::move(v)});
}

void shm_stream_impl::service_locked(views& out)
{
  const auto now = clock::now();
  take_releases_locked(out);
  const bool liveness = now >= next_liveness_;
  if (liveness) { next_liveness_ = now + std::chrono::milliseconds(10); }
  check_reader_locked(out, liveness);
  attach_locked(out);
  while (!pending_.empty() && has_room_locked(pending_.front())) {
    publish_locked(std::move(pending_.front()));
    pending_.pop_front();
  }
  if (cfg_.policy == queue_policy::drop && session_ != 0 && !held_.empty()) {
    pressure_ = pressure_ || (pool_ && pool_->in_use() > cfg_.max_lag_bytes) || !has_slot_locked();
    if (pressure_ && now - last_progress_ > cfg_.timeout) {
      ++c_.stall_timeouts;
      end_session_locked(shm::detach_evicted, out);  // S7: released nothing for `timeout` while room was needed
    }
  }
}

/// S6: acquire the reader's release word (its session's tag), then release the views below it.
void shm_stream_impl::take_releases_locked(views& out)
{
  if (session_ == 0) { return; }
  const std::uint64_t w = shm::load(h_, shm::w_release);
  const std::uint64_t idx = w & shm::index_mask;
  if (shm::tag_of(w) != shm::session_tag(session_) || idx <= released_ || idx > head_) { return; }
  while (!held_.empty() && held_.front().index < idx) {
    lag_bytes_ -= held_.front().bytes;
    out.push_back(std::move(held_.front().view));
    held_.pop_front();
  }
  c_.entries_released += idx - released_;
  released_ = idx;
  last_progress_ = clock::now();
  pressure_ = false;
  space_.notify_all();
}

void shm_stream_impl::check_reader_locked(views& out, bool liveness)
{
  const std::uint64_t claim = shm::load(h_, shm::w_claim);
  if (session_ != 0) {
    if (claim != claim_) {  // the reader cleared its claim: its last release store came before (S7)
      take_releases_locked(out);
      end_session_locked(shm::detach_reader_left, out);
    } else if (liveness && !shm::alive(reader_pid_, reader_start_)) {
      end_session_locked(shm::detach_reader_died, out);
    }
  } else if (claim != 0 && liveness && !shm::alive(shm::pid_of_claim(claim), 0)) {
    std::uint64_t c = claim;  // a reader that died while attaching: free the slot
    (void)shm::at(h_, shm::w_claim).compare_exchange_strong(c, 0, std::memory_order_acq_rel);
  }
}

/// S1 (attach): a reader's request for its claim gets a session: its start index, then session_claim (release).
void shm_stream_impl::attach_locked(views& out)
{
  const std::uint64_t req = shm::load(h_, shm::w_attach_request);
  if (req == 0 || req == claim_ || shm::load(h_, shm::w_claim) != req) { return; }
  if (session_ != 0) { end_session_locked(shm::detach_reader_left, out); }
  session_ = ++sessions_;
  claim_ = req;
  reader_pid_ = shm::pid_of_claim(req);
  reader_start_ = shm::load(h_, shm::w_reader_start);
  const std::uint64_t tag = shm::session_tag(session_);
  const std::uint64_t start = released_;  // block: what the last reader left; drop: head (nothing is held)
  shm::store(h_, shm::w_session, session_, std::memory_order_relaxed);
  shm::store(h_, shm::w_read_start, start, std::memory_order_relaxed);
  shm::store(h_, shm::w_release, shm::tagged(tag, start), std::memory_order_relaxed);
  shm::store(h_, shm::w_consumed, shm::tagged(tag, start), std::memory_order_relaxed);
  shm::store(h_, shm::w_detach_reason, shm::detach_none, std::memory_order_relaxed);
  shm::store(h_, shm::w_session_claim, req);
  last_progress_ = clock::now();
  pressure_ = false;
  ++c_.readers_attached;
  space_.notify_all();
}

/// Ends the session: the slot freed for a new reader; drop: every held view released (counted discarded),
/// block: kept for the next reader, who starts at released_.
void shm_stream_impl::end_session_locked(shm::detach_reason why, views& out)
{
  if (session_ == 0) { return; }
  if (why == shm::detach_evicted) {  // counted, not an error of the stream: policy drop keeps the producer going
    std::fprintf(stderr, "ferry: shm stream '%s': evicted reader pid %ld: no release within timeout %lld ms while the "
                 "stream needed room (policy drop); its %llu entries were released\n", cfg_.name.c_str(), reader_pid_,
                 static_cast<long long>(cfg_.timeout.count()), static_cast<unsigned long long>(head_ - released_));
  }
  shm::store(h_, shm::w_detach_reason, why, std::memory_order_relaxed);
  shm::store(h_, shm::w_session_claim, 0);
  std::uint64_t c = claim_;
  (void)shm::at(h_, shm::w_claim).compare_exchange_strong(c, 0, std::memory_order_acq_rel);
  if (cfg_.policy == queue_policy::drop) {
    c_.discarded_entries += held_.size();
    for (auto& x : held_) { out.push_back(std::move(x.view)); }
    held_.clear();
    released_ = head_;
    lag_bytes_ = 0;
  }
  (why == shm::detach_evicted       ? c_.readers_evicted
   : why == shm::detach_reader_died ? c_.readers_died
                                    : c_.readers_left) += 1;
  session_ = 0;
  claim_ = 0;
  reader_pid_ = 0;
  space_.notify_all();
}

bool shm_stream_impl::admit_locked(const d2h::entry_view& v)
{
  return session_ != 0 && head_ - released_ <= cfg_.max_lag_entries &&
         (!pool_ || pool_->in_use() <= cfg_.max_lag_bytes) && records_.room(v, released_);
}

/// The stream thread: a pass every poll_interval while the reader holds entries or entries are pending, every
/// millisecond otherwise (an attach request, a reader's death or detach wait at most that long).
void shm_stream_impl::run()
{
  std::unique_lock lk{mu_};
  while (!stop_thread_) {
    views out;
    service_locked(out);
    const bool busy = (session_ != 0 && !held_.empty()) || !pending_.empty();
    lk.unlock();
    out.clear();
    lk.lock();
    const auto period = busy ? std::chrono::duration_cast<std::chrono::microseconds>(cfg_.poll_interval)
                             : std::chrono::microseconds(1000);
    wake_.wait_for(lk, period, [&] { return stop_thread_; });
  }
}

shm_stream_stats shm_stream_impl::close()
{
  std::unique_lock lk{mu_};
  if (stopping_) {
    space_.wait(lk, [&] { return stopped_; });
    lk.unlock();
    return stats();
  }
  stopping_ = true;
  space_.notify_all();
  // Publish what is pending while a reader takes it, mark the stream closed (S5), then give the reader up to
  // `timeout` to release what it holds; the stream thread serves it meanwhile. block: also a reader that has
  // not attached yet (nothing lost); drop: only the reader attached now.
  const auto deadline = clock::now() + cfg_.timeout;
  const bool block = cfg_.policy == queue_policy::block;
  space_.wait_until(lk, deadline, [&] { return pending_.empty() || (!block && session_ == 0); });
  shm::store(h_, shm::w_state, shm::state_closed);
  space_.wait_until(lk, deadline, [&] { return held_.empty() || (!block && session_ == 0); });
  stop_thread_ = true;
  wake_.notify_all();
  lk.unlock();
  if (thread_.joinable()) { thread_.join(); }
  views out;
  lk.lock();
  // The thread's last pass may predate the reader's last release or its detach (a reader that released
  // everything and detached right before close()): one more pass counts them as the thread would have.
  take_releases_locked(out);
  check_reader_locked(out, true);
  c_.unreleased_at_close += held_.size() + pending_.size();
  for (auto& x : held_) { out.push_back(std::move(x.view)); }
  for (auto& v : pending_) { out.push_back(std::move(v)); }
  held_.clear();
  pending_.clear();
  released_ = head_;
  lag_bytes_ = 0;
  auto pool = std::move(pool_);  // its last reference may unregister the staging: not under mu_
  seg_->unlink();
  stopped_ = true;
  space_.notify_all();
  std::exception_ptr e = first_error_;
  lk.unlock();
  out.clear();
  pool.reset();
  if (e) { std::rethrow_exception(e); }
  return stats();
}

}  // namespace ferry::sink::detail
