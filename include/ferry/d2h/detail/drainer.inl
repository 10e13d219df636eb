// SPDX-License-Identifier: Apache-2.0
// Definitions of detail::drainer<B> (declared in drainer.hpp).
#pragma once

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
std::size_t drainer<B>::step()
{
  std::size_t progress = 0;
  try {
    progress += complete_finished();
    // Step 4, the acquire: everything the GPU wrote before its release of `h` is visible to this thread, and
    // so to the copies this same thread enqueues after this point (step 5, issue_copies).
    const std::uint64_t h = st_.hooks.is(debug_fault::drain_without_acquire)
                              ? ~std::uint64_t{0}
                              : ferry::backend::host_load_acquire(st_.head_host);
    if (h != ~std::uint64_t{0} && h > published_seen_) {
      published_seen_ = h;
      st_.c_published.store(h, std::memory_order_relaxed);
      check_planned(h, false);
    }
    st_.check_replay_report();
    progress += issue_copies(h);
    progress += complete_finished();
  } catch (const std::exception& e) {
    // A failed enqueue left nothing queued (the staging was released); the drain retries, so what was
    // published is still delivered when the backend recovers, but the channel is invalidated.
    if (drain_error_.empty()) {
      drain_error_ = e.what();
      std::fprintf(stderr, "ferry: d2h drain error (channel invalidated; drain retries): %s\n", e.what());
    }
    st_.fail(e.what());
  }
  return progress;
}

/// Step 5: one D2H per run (coalesce()) of entries below `head`, enqueued after the acquire that read it.
template <ferry::backend::backend B>
std::size_t drainer<B>::issue_copies(std::uint64_t head)
{
  std::size_t issued = 0;
  auto& fifo = st_.fifo;
  auto& staging = *st_.staging;
  fifo.refresh();
  const std::uint64_t R = st_.cfg.ring_bytes;
  while (!free_events_.empty()) {
    const std::size_t avail = fifo.readable();
    if (avail == 0 || fifo.peek(0).seq >= head) { break; }
    const run_plan rp = coalesce(
        avail, [&](std::size_t i) -> const entry_meta& { return fifo.peek(i); }, head, R,
        [&](const entry_meta& e) { return read_size_slot(e.slot); },
        [&](std::uint64_t n) { return staging.can_alloc(n); });
    if (rp.count == 0) { break; }  // staging full: the consumer has not released views yet
    run r;
    r.entries.reserve(rp.count);
    for (std::size_t i = 0; i < rp.count; ++i) { r.entries.push_back(fifo.peek(i)); }
    r.last_size = rp.last_size;
    r.overflow = rp.overflow;
    r.bytes = rp.bytes;
    r.ring_end = r.entries.back().start + r.entries.back().reserved;
    const std::size_t ev = free_events_.back();
    if (!r.overflow) {
      r.staging_start = *staging.alloc(r.bytes, static_cast<std::uint32_t>(r.entries.size()));  // fits: checked
      try {
        if (st_.hooks.copy_delay().count() > 0) { test_delay(); }
        // The D2H is enqueued by the thread that performed the acquire, after it: the copy reads payload
        // bytes ordered before the GPU's release.
        st_.b.memcpy_async(staging.base() + r.staging_start % staging.bytes(),
                           static_cast<const std::byte*>(st_.ring.data()) + r.entries.front().start % R, r.bytes,
                           ferry::backend::memcpy_kind::device_to_host, st_.drain_stream.handle());
      } catch (...) {
        for (std::size_t k = 0; k < r.entries.size(); ++k) { staging.release(r.staging_start); }
        throw;
      }
      st_.c_copies.fetch_add(1, std::memory_order_relaxed);
      st_.c_bytes_copied.fetch_add(r.bytes, std::memory_order_relaxed);
    }
    std::uint64_t n_dyn = 0;
    for (const auto& e : r.entries) { n_dyn += e.dynamic ? 1 : 0; }
    planned_end_ = std::max(planned_end_, r.entries.back().seq + 1);  // placed by the CPU, now popped
    // sizes consumed; before the pop, so a producer that finds the FIFO slots free finds their size slots free
    // too (it reads the FIFO first: reservation::fits), and the derived size ring never fills first
    if (n_dyn > 0) { st_.dyn_freed.fetch_add(n_dyn, std::memory_order_acq_rel); }
    fifo.pop(r.entries.size());
    try {
      events_[ev].record(st_.drain_stream.view());
      r.event = ev;
      r.has_event = true;
      free_events_.pop_back();
    } catch (const std::exception& e) {
      st_.fail(e.what());
      try {
        st_.drain_stream.synchronize();  // completion without an event
      } catch (...) {
        stuck_.push_back(std::move(r));  // completion unobservable: never reclaim this run's ring or staging
        throw;
      }
      r.has_event = false;
    }
    if (st_.hooks.is(debug_fault::reclaim_before_copy_complete)) { st_.reclaim(r.ring_end); }
    inflight_.push_back(std::move(r));
    ++issued;
  }
  return issued;
}

/// A published_head beyond the entries the CPU placed is a protocol violation: a captured forward was
/// launched without plan() (its entries have no reservation, so their bytes may overwrite planned ones).
/// Every entry is pushed to the FIFO before the launch that releases it, except the one a fused
/// copy-and-release kernel publishes: eager capture pushes it right after that launch, so an excess of one
/// entry is a violation only once no producer call can be in flight (`final`, at close()).
template <ferry::backend::backend B>
void drainer<B>::check_planned(std::uint64_t h, bool final)
{
  auto& fifo = st_.fifo;
  fifo.refresh();  // after the acquire of h: every entry pushed before the launch that released h is visible
  const std::size_t n = fifo.readable();
  if (n > 0) { planned_end_ = std::max(planned_end_, fifo.peek(n - 1).seq + 1); }
  if (h <= planned_end_ || (h == planned_end_ + 1 && !final) || unplanned_seen_) { return; }
  unplanned_seen_ = true;
  const std::string what = ferry::detail::format(
    "d2h channel: graph replayed without plan(): expected published_head <= {} (the entries the CPU planned), "
    "got {}; launch a captured forward with channel::replay, or channel::plan then launch. Entries planned before "
    "are delivered; nothing past them is",
    planned_end_, h);
  std::fprintf(stderr, "ferry: %s\n", what.c_str());
  st_.fail(what);
}

template <ferry::backend::backend B>
void drainer<B>::test_delay()
{
  if constexpr (requires(const B& be) { be.host_func(typename B::stream_type{}, std::function<void()>{}); }) {
    const auto d = st_.hooks.copy_delay();
    st_.b.host_func(st_.drain_stream.handle(), [d] { std::this_thread::sleep_for(d); });
  }
}

/// Step 7: a run's ring bytes are reclaimed only once its copy's event completed; then its entries are
/// delivered, in order.
template <ferry::backend::backend B>
std::size_t drainer<B>::complete_finished()
{
  std::size_t delivered = 0;
  while (!inflight_.empty()) {
    run& r = inflight_.front();
    if (r.has_event && !events_[r.event].query()) { break; }
    if (r.has_event) { free_events_.push_back(r.event); }
    st_.reclaim(r.ring_end);  // the copy completed: its ring bytes may be reused
    run done = std::move(r);
    inflight_.pop_front();
    const std::size_t n = done.entries.size();
    std::uint64_t payload = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& e = done.entries[i];
      const std::uint64_t size = i + 1 == n ? done.last_size : e.bytes;
      entry_attribution at{e.forward, e.row_bytes, st_.forwards.find(e.forward)};
      if (done.overflow && size == selection_error_size) {
        st_.c_selection_errors.fetch_add(1, std::memory_order_relaxed);
        deliver(access::selection_error_view(e.reserved, hook_id{e.hook}, entry_seq{e.seq}, std::move(at)));
      } else if (done.overflow) {
        st_.c_overflows.fetch_add(1, std::memory_order_relaxed);
        // a row entry's reservation in payload bytes: its rows (a planned one's exact rows, coalesce)
        const std::uint64_t reserved = e.row_bytes != 0 ? std::min(e.bytes, e.reserved) : e.reserved;
        deliver(access::overflow_view(size, reserved, hook_id{e.hook}, entry_seq{e.seq}, std::move(at)));
      } else {
        const std::uint64_t off = e.start - done.entries.front().start;
        const std::byte* data = st_.staging->base() + done.staging_start % st_.staging->bytes() + off;
        payload += size;
        deliver(access::ok_view(st_.staging, done.staging_start, data, size, e.reserved, hook_id{e.hook},
                                entry_seq{e.seq}, std::move(at)));
      }
      ++delivered;
    }
    st_.c_bytes.fetch_add(payload, std::memory_order_relaxed);
    st_.c_drained.fetch_add(n, std::memory_order_release);
  }
  return delivered;
}

template <ferry::backend::backend B>
void drainer<B>::deliver(entry_view&& v)
{
  if (callback_) {
    // The entry is delivered once: a callback that throws does not get it again. `v` (or whatever the
    // callback moved it into and destroyed while unwinding) releases its staging here.
    try {
      callback_(std::move(v));
    } catch (const std::exception& e) {
      callback_failed(e.what());
    } catch (...) {
      callback_failed("a non-std::exception");
    }
  } else {
    std::lock_guard lock{ready_mu_};
    ready_.push_back(std::move(v));
  }
}

}  // namespace ferry::d2h::detail
