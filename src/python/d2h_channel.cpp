// SPDX-License-Identifier: Apache-2.0
// py_channel<B>: ferry.Channel's calls, each a conversion to the core's call (d2h_channel.hpp).
#include "d2h_channel.hpp"

#include <ferry/d2h/detail/fields.hpp>

#include <thread>

namespace ferry::python {

namespace {

/// torch's version counter of `o` (`ok`: it has one). Only a torch tensor that is not an inference tensor
/// has one; asking an inference tensor for it raises (a c10::Error with a backtrace, ~10 us), so
/// is_inference() is asked first, and an object without it (numpy, CuPy, ...) has no counter.
long long read_version(PyObject* o, bool& ok)
{
  ok = false;
  PyObject* f = PyObject_GetAttrString(o, "is_inference");
  if (f == nullptr) {
    PyErr_Clear();
    return 0;
  }
  PyObject* is_inf = PyObject_CallNoArgs(f);
  Py_DECREF(f);
  const int inference = is_inf != nullptr ? PyObject_IsTrue(is_inf) : -1;
  Py_XDECREF(is_inf);
  if (inference != 0) {  // an inference tensor (or the call failed): no counter
    PyErr_Clear();
    return 0;
  }
  PyObject* v = PyObject_GetAttrString(o, "_version");
  ok = v != nullptr && PyLong_Check(v) != 0;
  const long long r = ok ? PyLong_AsLongLong(v) : 0;
  Py_XDECREF(v);
  if (!ok) { PyErr_Clear(); }
  return r;
}

}  // namespace

template <class B>
fd::source_owner py_source::make(nb::handle obj, any_array dl, bool deferred)
{
  auto* p = new py_source{nb::borrow(obj), std::move(dl), 0, false};
  if (deferred) { p->version = read_version(obj.ptr(), p->versioned); }
  fd::source_owner o;
  o.keep = std::shared_ptr<void>(p, [](void* q) {
    graveyard::get().give(q, [](void* r) { delete static_cast<py_source*>(r); });
  });
  o.unchanged = deferred ? &py_source::unchanged : nullptr;
  o.host_written = is_host<B>;  // NumPy arrays and torch CPU tensors are written by host code directly
  return o;
}

std::size_t py_source::unchanged(void* const* owners, std::size_t n)
{
  nb::gil_scoped_acquire g;
  for (std::size_t i = 0; i < n; ++i) {
    const auto* p = static_cast<const py_source*>(owners[i]);
    if (!p->versioned) { continue; }
    bool ok = false;
    const long long now = read_version(p->obj.ptr(), ok);
    if (!ok || now != p->version) { return i; }
  }
  return n;
}

template <class B>
py_channel<B>::py_channel(int device, fd::config cfg, nb::handle sink) : dev_{device}
{
  B b{};
  b.set_device(fb::device_id{device});
  typename fd::channel<B>::callback_type cb;
  if (sink.is_valid() && !sink.is_none()) {
    cb = sink_callback(sink);
    sink_owner_ = nb::borrow(sink);
  }
  ch_.emplace(cfg, b, std::move(cb));
  handle_ = register_channel(channel_calls{this, is_host<B> ? FERRY_BACKEND_HOST : FERRY_BACKEND_CUDA, device,
                                           &py_channel::capture_raw, &py_channel::flush_raw, &py_channel::flags_raw});
}

template <class B>
py_channel<B>::~py_channel()
{
  {
    gil_release g;
    unregister_channel(handle_);  // waits for C ABI calls in flight
    ch_.reset();
    leftovers_.clear();
  }
  drain_released();
}

template <class B>
fd::channel<B>& py_channel<B>::live(const char* what)
{
  FERRY_EXPECTS(ch_.has_value(), ferry::logic_error, "Channel.{}: expected an open channel, got a closed one", what);
  return *ch_;
}

template <class B>
void py_channel<B>::set_dev() const
{
  if constexpr (!is_host<B>) { B{}.set_device(fb::device_id{dev_}); }
}

template <class B>
void py_channel<B>::begin_forward(nb::handle stream)
{
  auto s = resolve_stream<B>(stream, dev_, "Channel.begin_forward");
  {
    std::shared_lock lk{mu_};
    auto& ch = live("begin_forward");
    gil_release g;
    set_dev();
    ch.begin_forward(s);
  }
  drain_released();
}

template <class B>
py_plan py_channel<B>::end_forward(nb::handle stream)
{
  auto s = resolve_stream<B>(stream, dev_, "Channel.end_forward");
  py_plan out;
  {
    std::shared_lock lk{mu_};
    auto& ch = live("end_forward");
    gil_release g;
    set_dev();
    out.p = ch.end_forward(s);
  }
  drain_released();
  return out;
}

template <class B>
bool py_channel<B>::abort_forward(nb::handle stream)
{
  auto s = resolve_stream<B>(stream, dev_, "Channel.abort_forward");
  bool was_open = false;
  {
    std::shared_lock lk{mu_};
    auto& ch = live("abort_forward");
    gil_release g;
    set_dev();
    was_open = ch.abort_forward(s);
  }
  drain_released();
  return was_open;
}

template <class B>
void py_channel<B>::capture(std::uint32_t hook, nb::handle tensor, nb::handle stream, bool deferred)
{
  const char* what = deferred ? "Channel.capture_deferred" : "Channel.capture";
  auto s = resolve_stream<B>(stream, dev_, what);
  array_bytes t = tensor_bytes<B>(tensor, dev_, what, hook);
  fd::source_owner owner = py_source::make<B>(tensor, std::move(t.dl), deferred);
  {
    std::shared_lock lk{mu_};
    auto& ch = live(what + 8);
    gil_release g;
    set_dev();
    if (deferred) {
      ch.capture_deferred(fd::hook_id{hook}, t.data, t.nbytes, s, std::move(owner));
    } else {
      ch.capture(fd::hook_id{hook}, t.data, t.nbytes, s, std::move(owner));
    }
  }
  drain_released();
}

template <class B>
void py_channel<B>::flush(nb::handle stream)
{
  auto s = resolve_stream<B>(stream, dev_, "Channel.flush");
  {
    std::shared_lock lk{mu_};
    auto& ch = live("flush");
    gil_release g;
    set_dev();
    ch.flush(s);
  }
  drain_released();
}

template <class B>
std::size_t py_channel<B>::deferred_pending() const
{
  std::shared_lock lk{mu_};
  return ch_ ? ch_->deferred_pending() : 0;
}

template <class B>
void py_channel<B>::plan(const py_plan& p)
{
  std::shared_lock lk{mu_};
  auto& ch = live("plan");
  gil_release g;
  set_dev();
  ch.plan(p.p);
}

template <class B>
std::vector<py_entry> py_channel<B>::poll(std::size_t max_entries, std::optional<double> timeout)
{
  FERRY_EXPECTS(max_entries > 0, ferry::logic_error, "Channel.poll: expected max_entries >= 1, got 0");
  FERRY_EXPECTS(!sink_owner_.is_valid(), ferry::logic_error,
                "Channel.poll: expected a channel without a native sink, got one with a sink (its entries go to "
                "the sink)");
  drain_released();
  std::vector<py_entry> out;
  const auto start = std::chrono::steady_clock::now();
  const auto limit = timeout ? std::chrono::duration<double>(*timeout) : std::chrono::duration<double>::max();
  for (;;) {
    std::vector<fd::entry_view> got;
    bool closed = false;
    {
      gil_release g;
      std::shared_lock lk{mu_};
      closed = !ch_.has_value();
      const auto slice_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
      for (;;) {
        if (closed) {
          std::lock_guard l2{leftover_mu_};
          while (got.size() < max_entries && !leftovers_.empty()) {
            got.push_back(std::move(leftovers_.front()));
            leftovers_.pop_front();
          }
        } else {
          while (got.size() < max_entries) {
            auto v = ch_->try_pop();
            if (!v) { break; }
            got.push_back(std::move(*v));
          }
        }
        const auto now = std::chrono::steady_clock::now();
        if (!got.empty() || closed || now - start >= limit || now >= slice_end || interpreter_exiting()) { break; }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    for (auto& v : got) { out.emplace_back(std::move(v)); }
    if (!out.empty()) { return out; }
    FERRY_EXPECTS(!closed, ferry::logic_error,
                  "Channel.poll: expected an open channel, got a closed one with no entries left");
    if (std::chrono::steady_clock::now() - start >= limit || interpreter_exiting()) { return out; }
    if (PyErr_CheckSignals() != 0) { throw nb::python_error(); }
  }
}

template <class B>
nb::dict py_channel<B>::stats() const
{
  std::shared_lock lk{mu_};
  const fd::counters c = ch_ ? ch_->stats() : final_stats_;
  nb::dict d;
  fd::detail::for_each_counter(c, [&](const char* name, std::uint64_t v) { d[name] = v; });
  return d;
}

template <class B>
nb::dict py_channel<B>::close(std::optional<double> timeout)
{
  std::optional<fd::shutdown_report> rep;
  std::exception_ptr err;  // raised after the teardown, so the channel is closed either way
  {
    gil_release g;
    std::unique_lock lk{mu_};
    FERRY_EXPECTS(ch_.has_value(), ferry::logic_error, "Channel.close: expected an open channel, got a closed one");
    set_dev();
    try {
      rep = timeout ? ch_->close(std::chrono::milliseconds(static_cast<std::int64_t>(*timeout * 1000.0)))
                    : ch_->close();
    } catch (const ferry::error&) {
      err = std::current_exception();
    }
    final_stats_ = ch_->stats();
    {
      std::lock_guard l2{leftover_mu_};
      while (auto v = ch_->try_pop()) { leftovers_.push_back(std::move(*v)); }
    }
    ch_.reset();
  }
  sink_owner_.reset();
  drain_released();
  if (err) { std::rethrow_exception(err); }
  return report_dict(*rep);
}

template <class B>
bool py_channel<B>::programmatic_launch() const
{
  std::shared_lock lk{mu_};
  return ch_ && ch_->programmatic_launch();
}

template <class B>
bool py_channel<B>::invalidated() const
{
  std::shared_lock lk{mu_};
  return ch_ && ch_->invalidated();
}

template <class B>
fb::stream_view<B> py_channel<B>::raw_stream(std::uintptr_t stream, std::uint32_t hook, const char* what)
{
  if (stream == FERRY_STREAM_OF_FORWARD) {
    // An invalidated channel says so first (the forward it had is gone with it).
    FERRY_EXPECTS(!ch_->invalidated(), ferry::invalidated_error, "d2h channel {} (hook {}): {}", what, hook,
                  ch_->invalidation_reason());
    const auto f = ch_->open_forward();
    FERRY_EXPECTS(f.has_value(), ferry::logic_error,
                  "d2h channel {} (hook {}): expected an open forward (begin_forward), got none", what, hook);
    return fb::stream_view<B>{B{}, f->stream};
  }
  return fb::stream_view<B>{B{}, reinterpret_cast<typename B::stream_type>(stream)};
}

template <class B>
void py_channel<B>::capture_raw(void* self, std::uint32_t hook, const void* ptr, std::uint64_t bytes,
                                std::uintptr_t stream, fd::source_owner owner, bool deferred)
{
  auto& c = *static_cast<py_channel*>(self);
  std::shared_lock lk{c.mu_};
  auto& ch = c.live(deferred ? "capture_deferred" : "capture");
  const auto s = c.raw_stream(stream, hook, deferred ? "capture_deferred" : "capture");
  c.set_dev();
  if (deferred) {
    ch.capture_deferred(fd::hook_id{hook}, ptr, bytes, s, std::move(owner));
  } else {
    ch.capture(fd::hook_id{hook}, ptr, bytes, s, std::move(owner));
  }
}

template <class B>
void py_channel<B>::flush_raw(void* self, std::uintptr_t stream)
{
  auto& c = *static_cast<py_channel*>(self);
  std::shared_lock lk{c.mu_};
  auto& ch = c.live("flush");
  const auto s = c.raw_stream(stream, 0, "flush");
  c.set_dev();
  ch.flush(s);
}

template <class B>
std::uint32_t py_channel<B>::flags_raw(void* self)
{
  auto& c = *static_cast<py_channel*>(self);
  std::shared_lock lk{c.mu_};
  const auto f = c.ch_ ? c.ch_->open_forward() : std::nullopt;
  if (!f) { return 0; }
  return FERRY_INFO_FORWARD_OPEN | (f->capturing ? FERRY_INFO_FORWARD_CAPTURING : 0U);
}

template class py_channel<fb::host_backend>;
#if defined(FERRY_PYTHON_CUDA)
template class py_channel<fb::cuda_backend>;
#endif

}  // namespace ferry::python
