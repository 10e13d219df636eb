// SPDX-License-Identifier: Apache-2.0
// The consumer side of py_channel<B> (d2h_channel.hpp): poll() and poll_batch() (one wait), stats() and close();
// at_exit (the forward left open at interpreter exit).
#include "d2h_channel.hpp"

#include <cmath>

#include <ferry/d2h/detail/fields.hpp>

#include <thread>

namespace ferry::python {

template <class B>
std::vector<fd::entry_view> py_channel<B>::wait_views(std::size_t max, std::optional<double> timeout, const char* who)
{
  FERRY_EXPECTS(max > 0, ferry::logic_error, "{}: expected max_entries >= 1, got 0", who);
  // NaN compares false with everything: a NaN timeout would never expire (found by the fuzzer); <= 0: no
  // wait, inf: forever (a duration<double>, never converted to an integer)
  if (timeout) { (void)seconds_arg(*timeout, who, "timeout", -HUGE_VAL, HUGE_VAL); }
  FERRY_EXPECTS(!sink_owner_.is_valid(), ferry::logic_error,
                "{}: expected a channel without a native sink, got one with a sink (its entries go to the sink)", who);
  drain_released();
  const auto start = std::chrono::steady_clock::now();
  const auto limit = timeout ? std::chrono::duration<double>(*timeout) : std::chrono::duration<double>::max();
  std::vector<fd::entry_view> got;
  for (;;) {
    bool closed = false;
    {
      gil_release g;
      std::shared_lock lk{mu_};
      closed = !ch_.has_value();
      const auto slice_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
      for (;;) {
        if (closed) {
          std::lock_guard l2{leftover_mu_};
          while (got.size() < max && !leftovers_.empty()) {
            got.push_back(std::move(leftovers_.front()));
            leftovers_.pop_front();
          }
        } else {
          (void)ch_->try_pop(got, max - got.size());  // the core's batch pop: one lock for all
        }
        const auto now = std::chrono::steady_clock::now();
        if (!got.empty() || closed || now - start >= limit || now >= slice_end || interpreter_exiting()) { break; }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    if (!got.empty()) { return got; }
    FERRY_EXPECTS(!closed, ferry::logic_error, "{}: expected an open channel, got a closed one with no entries left",
                  who);
    if (std::chrono::steady_clock::now() - start >= limit || interpreter_exiting()) { return got; }
    if (PyErr_CheckSignals() != 0) { throw nb::python_error(); }
  }
}

template <class B>
std::vector<py_entry> py_channel<B>::poll(std::size_t max_entries, std::optional<double> timeout)
{
  std::vector<fd::entry_view> got = wait_views(max_entries, timeout, "Channel.poll");
  std::vector<py_entry> out;
  out.reserve(got.size());
  const auto hooks = entry_schema();
  for (auto& v : got) { out.emplace_back(std::move(v), tie_, hooks); }
  return out;
}

template <class B>
py_batch py_channel<B>::poll_batch(std::size_t max_entries, std::optional<double> timeout)
{
  return py_batch{wait_views(max_entries, timeout, "Channel.poll_batch"), tie_, entry_schema()};
}

template <class B>
nb::dict py_channel<B>::stats() const
{
  std::shared_lock lk{mu_};
  const fd::counters c = ch_ ? ch_->stats() : final_stats_;
  nb::dict d;
  fd::detail::for_each_counter(c, [&](const char* name, std::uint64_t v) { d[name] = v; });
  nb::object sink = ch_ ? sink_stats(sink_owner_) : final_sink_stats_;
  if (sink.is_valid() && !sink.is_none()) { d["sink"] = sink; }
  return d;
}

template <class B>
nb::dict py_channel<B>::close(std::optional<double> timeout)
{
  std::optional<fd::shutdown_report> rep;
  std::exception_ptr err;  // raised after the teardown, so the channel is closed either way
  {
    gil_release g;
    double secs = 0.0;
    {  // 1. closing: producer calls refuse from now on, graphs of this channel refuse to launch (graph_tie)
      std::unique_lock lk{mu_};
      (void)live("close");
      secs = timeout ? seconds_arg(*timeout, "Channel.close", "timeout") : 0.0;
      closing_ = true;
      tie_->kill("closed");
    }
    {  // 2. the core's close waits for the drain: consumer threads go on polling and releasing meanwhile (a unique
       // lock here held a consumer's poll() until the timeout, so the entries it had yet to take were lost)
      std::shared_lock lk{mu_};
      const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(secs));
      set_dev();
      try {
        rep = timeout ? ch_->close(limit) : ch_->close();
      } catch (const ferry::error&) {
        err = std::current_exception();
      }
    }
    std::unique_lock lk{mu_};  // 3. what was delivered and not taken stays pollable; the channel goes
    final_stats_ = ch_->stats();
    {
      std::lock_guard l2{leftover_mu_};
      while (auto v = ch_->try_pop()) { leftovers_.push_back(std::move(*v)); }
    }
    ch_.reset();
    closing_ = false;
  }
  final_sink_stats_ = sink_stats(sink_owner_);  // the sink's counters as the channel closed (its last entry given)
  sink_owner_.reset();
  drain_released();
  if (err) { std::rethrow_exception(err); }
  return report_dict(*rep);
}

template <class B>
void py_channel<B>::at_exit(void* self)
{
  auto& c = *static_cast<py_channel*>(self);
  std::shared_lock lk{c.mu_, std::try_to_lock};  // a close() in flight on another thread ends the forward itself
  if (!lk.owns_lock() || !c.open()) { return; }
  const auto f = c.ch_->open_forward();
  if (!f) { return; }
  std::string what = std::string{"ferry: Channel("} + traits<B>::name + ", device " + std::to_string(c.dev_) +
                     ") had a forward open at exit (begin_forward without end_forward); ";
  try {
    const auto pending = c.ch_->deferred_pending();
    c.set_dev();
    (void)c.ch_->abort_forward(fb::stream_view<B>{B{}, f->stream});  // the GIL stays held: nothing else runs
    what += f->capturing ? "ferry dropped it with abort_forward (its captured entries were never planned)"
                         : "ferry ended it with abort_forward (its entries were published";
    if (!f->capturing) {
      what += pending > 0 ? ", " + std::to_string(pending) + " pending deferred entries dropped)" : std::string{")"};
    }
  } catch (const std::exception&) {
    // Refused here (the forward belongs to another producer thread): close() has no thread rule, and the
    // destructor's second close() is then quiet. poll() still returns what was delivered.
    try {
      (void)c.ch_->close();
      what += "ferry closed the channel (close() published the forward's entries)";
    } catch (const fd::shutdown_error&) {
      what += "ferry closed the channel (close() published the forward's entries)";
    } catch (const std::exception& e) {
      what += std::string{"ending it failed: "} + e.what();
    }
  }
  what += "; call end_forward(stream) before exiting";
  PySys_WriteStderr("%.900s\n", what.c_str());
}

template std::vector<py_entry> py_channel<fb::host_backend>::poll(std::size_t, std::optional<double>);
template py_batch py_channel<fb::host_backend>::poll_batch(std::size_t, std::optional<double>);
template nb::dict py_channel<fb::host_backend>::stats() const;
template nb::dict py_channel<fb::host_backend>::close(std::optional<double>);
template void py_channel<fb::host_backend>::at_exit(void*);
#if defined(FERRY_PYTHON_CUDA)
template std::vector<py_entry> py_channel<fb::cuda_backend>::poll(std::size_t, std::optional<double>);
template py_batch py_channel<fb::cuda_backend>::poll_batch(std::size_t, std::optional<double>);
template nb::dict py_channel<fb::cuda_backend>::stats() const;
template nb::dict py_channel<fb::cuda_backend>::close(std::optional<double>);
template void py_channel<fb::cuda_backend>::at_exit(void*);
#endif

}  // namespace ferry::python
