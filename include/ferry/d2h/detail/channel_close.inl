// SPDX-License-Identifier: Apache-2.0
// detail::channel_impl<B>'s close (channel_impl.hpp): drain what was published, stop the drain, report what was
// not (shutdown_report); the commit check after it; the quiet close of destructors.
#pragma once

#include <ferry/d2h/detail/channel_impl.hpp>
#include <ferry/detail/close_quietly.hpp>

#include <string>

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
shutdown_report channel_impl<B>::close(std::chrono::milliseconds timeout)
{
  std::lock_guard close_lock{close_mu};
  if (final_report) {
    throw_if_failed(*final_report);
    return *final_report;
  }
  shutdown_report rep;
  rep.forward_open = prod.close_open_forward();
  st.closed.store(true);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto outstanding = [&] { return st.c_reserved.load() - st.c_drained.load(std::memory_order_acquire); };
  while (outstanding() > 0 && std::chrono::steady_clock::now() < deadline) {
    if (st.cfg.drain == drain_mode::poll || !drain_thread.joinable()) {
      std::lock_guard lock{drain.mutex()};
      if (drain.step() == 0) { std::this_thread::sleep_for(std::chrono::microseconds(100)); }
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  stop.store(true, std::memory_order_release);
  if (drain_thread.joinable()) { drain_thread.join(); }
  {
    // Final pass: every published entry is copied and delivered; in-flight copies complete first.
    std::lock_guard lock{drain.mutex()};
    for (int pass = 0; pass < 1000; ++pass) {
      try {
        st.drain_stream.synchronize();
      } catch (const std::exception& e) {
        st.fail(e.what());  // an asynchronous copy error: what was delivered may be incomplete
      }
      const std::size_t n = drain.step();
      if (n == 0 && drain.idle()) { break; }
    }
    drain.check_planned_final();
    st.check_replay_report();  // a graph launch without plan() that ran before close is reported here at the latest
    st.fifo.refresh();
    const std::size_t left = st.fifo.readable();
    // The final drain pass above acquired the head: an entry below it was published and is left only
    // because staging stayed full (views not released); the others were never published.
    const std::uint64_t head = ferry::backend::host_load_acquire(st.head_host);
    for (std::size_t i = 0; i < left; ++i) {
      const auto& e = st.fifo.peek(i);
      if (e.seq < head) {
        rep.undrained.push_back(entry_seq{e.seq});
      } else {
        rep.unpublished.push_back(entry_seq{e.seq});
        rep.unpublished_hooks.push_back(hook_id{e.hook});
      }
    }
  }
  prod.release_graph_sources();  // refused from now on: no replay is planned after close
  rep.delivered = st.c_drained.load();
  rep.pending_pop = drain.pending_pop();
  rep.views_held = st.staging->live_views();
  {
    std::lock_guard lock{drain.mutex()};  // the drain thread is joined; poll() callers may still hold it
    rep.callback_errors = drain.callback_errors();
    rep.first_callback_error = drain.first_callback_error();
  }
  rep.capture_errors = st.c_capture_errors.load();
  rep.first_capture_error = st.first_capture_error();
  final_report = rep;
  throw_if_failed(rep);
  if (!rep.clean()) { throw shutdown_error(rep); }
  return rep;
}

template <ferry::backend::backend B>
void channel_impl<B>::throw_if_failed(const shutdown_report& rep) const
{
  if (!st.is_failed()) { return; }
  FERRY_FAIL(ferry::invalidated_error,
             "d2h channel close: expected a channel not invalidated, got: {}; {}{} of {} reserved entries delivered, "
             "{} never published, {} copies with unobservable completion (ring and staging retained){}",
             st.failure_reason(),
             rep.forward_open ? "a forward was still open (begin_forward without end_forward); " : "", rep.delivered,
             st.c_reserved.load(), rep.unpublished.size(), drain.stuck(),
             rep.callback_errors > 0 ? ferry::detail::format("; {} consumer callback exceptions, the first: {}",
                                                             rep.callback_errors, rep.first_callback_error)
                                     : std::string{});
}

template <ferry::backend::backend B>
shutdown_report channel_impl<B>::close_checked(std::chrono::milliseconds timeout)
{
  try {
    shutdown_report rep = close(timeout);
    prod.raise_commit_fault("close");
    return rep;
  } catch (const shutdown_error&) {
    prod.raise_commit_fault("close");
    throw;
  }
}

template <ferry::backend::backend B>
void channel_impl<B>::close_quietly() noexcept
{
  ferry::detail::close_quietly([&] { (void)close(st.cfg.timeout); },
                               [] { return std::string{"ferry: d2h channel destroyed"}; });
}

}  // namespace ferry::d2h::detail
