// SPDX-License-Identifier: Apache-2.0
// py_channel<B>: ferry.Channel's calls, each a conversion to the core's call (d2h_channel.hpp).
#include "d2h_channel.hpp"

#include <exception>
#include <string>

namespace ferry::python {

namespace {

/// The one core call behind Channel.capture / capture_deferred and the C ABI's capture / capture_deferred.
template <class B>
void capture_into(fd::channel<B>& ch, std::uint32_t hook, const void* ptr, std::uint64_t bytes,
                  const fb::stream_view<B>& s, fd::source_owner owner, bool deferred)
{
  if (deferred) {
    ch.capture_deferred(fd::hook_id{hook}, ptr, bytes, s, std::move(owner));
  } else {
    ch.capture(fd::hook_id{hook}, ptr, bytes, s, std::move(owner));
  }
}

}  // namespace

template <class B>
py_channel<B>::py_channel(int device, fd::config cfg, nb::handle sink, fd::hook_schema schema) : dev_{device}
{
  B b{};
  b.set_device(fb::device_id{device});
  fd::sink_ref sr = sink_ref_of(sink);  // a native sink, a capsule's callback, or none
  if (sink.is_valid() && !sink.is_none()) { sink_owner_ = nb::borrow(sink); }
  {
    // The core's one-call attach: the schema offered to the sink first (a sink that has none refuses before
    // anything is made), then its callback and its staging (ferry.sinks.shm_stream: shared memory).
    // Without the GIL: a construction that fails after allocating frees, and a free waits for every queued
    // operation of the host streams (as cudaFree does), among them a torch op's tensor released on a stream
    // thread, which needs the GIL (a deadlock, found by the fuzzer); a sink's adoption writes files. Nothing
    // here touches a Python object: `cfg`, `b` and `sr` (the sink's C++ calls, or the capsule's C function and
    // context) are plain C++.
    gil_release g;
    ch_.emplace(cfg, b, sr, std::move(schema));
  }
  schema_ = ch_->schema();
  drain_released();  // sources given up meanwhile
  handle_ = register_channel(channel_calls{this, is_host<B> ? FERRY_BACKEND_HOST : FERRY_BACKEND_CUDA, device,
                                           &py_channel::capture_raw, &py_channel::flush_raw, &py_channel::flags_raw,
                                           &py_channel::capture_rows_raw});
  tie_ = std::make_shared<graph_tie>(std::string{"Channel("} + traits<B>::name + ", device " + std::to_string(device) +
                                     ", handle " + std::to_string(handle_) + ")");
  exit_hooks::get().add(this, &py_channel::at_exit);
}

template <class B>
py_channel<B>::~py_channel()
{
  exit_hooks::get().remove(this);  // the GIL held: no exit hook runs meanwhile
  {
    gil_release g;
    unregister_channel(handle_);  // waits for C ABI calls in flight
    tie_->kill("destroyed");      // before the memory its graphs write is freed
    ch_.reset();
    leftovers_.clear();
  }
  drain_released();
}

template <class B>
fd::channel<B>& py_channel<B>::live(const char* what)
{
  FERRY_EXPECTS(open(), ferry::logic_error, "Channel.{}: expected an open channel, got a {} one", what,
                ch_.has_value() ? "closing" : "closed");
  return *ch_;
}

template <class B>
void py_channel<B>::set_dev() const
{
  B{}.set_device(fb::device_id{dev_});  // the host backend emulates devices too: its current one is per thread
}

template <class B>
void py_channel<B>::begin_forward(nb::handle stream, nb::handle tag, nb::handle requests, nb::handle meta_h)
{
  auto s = resolve_stream<B>(stream, dev_, "Channel.begin_forward");
  fd::forward_meta meta = forward_meta_of(tag, requests, meta_h, "Channel.begin_forward");
  tie(s);
  call("begin_forward", [&](fd::channel<B>& ch) { ch.begin_forward(s, std::move(meta)); });
  forward_stream_ = nb::borrow(stream);
}

template <class B>
py_plan py_channel<B>::end_forward(nb::handle stream)
{
  auto s = resolve_stream<B>(stream, dev_, "Channel.end_forward");
  tie(s);
  py_plan p{call("end_forward", [&](fd::channel<B>& ch) { return ch.end_forward(s); })};
  forward_stream_ = nb::object{};
  return p;
}

template <class B>
bool py_channel<B>::abort_forward(nb::handle stream)
{
  auto s = resolve_stream<B>(stream, dev_, "Channel.abort_forward");
  tie(s);
  const bool was_open = call("abort_forward", [&](fd::channel<B>& ch) { return ch.abort_forward(s); });
  forward_stream_ = nb::object{};
  return was_open;
}

template <class B>
void py_channel<B>::capture(std::uint32_t hook, nb::handle tensor, nb::handle stream, bool deferred)
{
  const char* what = deferred ? "Channel.capture_deferred" : "Channel.capture";
  const auto s = resolve_stream<B>(stream, dev_, what);
  capture_bytes(hook, tensor, tensor_bytes<B>(tensor, dev_, what, hook), s, deferred);
}

template <class B>
void py_channel<B>::capture_bytes(std::uint32_t hook, nb::handle tensor, array_bytes t, const fb::stream_view<B>& s,
                                  bool deferred)
{
  tie(s);
  fd::source_owner owner = py_source::make<B>(tensor, std::move(t.dl), deferred, t.version_read ? &t.version : nullptr);
  call(deferred ? "capture_deferred" : "capture", [&](fd::channel<B>& ch) {
    capture_into(ch, hook, t.data, t.nbytes, s, std::move(owner), deferred);
  });
}

template <class B>
void py_channel<B>::capture_rows_core(std::uint32_t hook, const void* src, std::uint64_t n_rows,
                                      std::uint64_t row_bytes, const fd::row_selection& sel,
                                      const fb::stream_view<B>& s, fd::source_owner owner, bool deferred,
                                      const rows_reduce* red)
{
  tie(s);
  call(deferred ? "capture_rows_deferred" : "capture_rows", [&](fd::channel<B>& ch) {
    if (red != nullptr && deferred) {
      ch.capture_reduced_deferred(fd::hook_id{hook}, src, n_rows, red->width, red->in, sel, red->r, s,
                                  std::move(owner));
    } else if (red != nullptr) {
      ch.capture_reduced(fd::hook_id{hook}, src, n_rows, red->width, red->in, sel, red->r, s, std::move(owner));
    } else if (deferred) {
      ch.capture_rows_deferred(fd::hook_id{hook}, src, n_rows, row_bytes, sel, s, std::move(owner));
    } else {
      ch.capture_rows(fd::hook_id{hook}, src, n_rows, row_bytes, sel, s, std::move(owner));
    }
  });
}

template <class B>
void py_channel<B>::flush(nb::handle stream)
{
  auto s = resolve_stream<B>(stream, dev_, "Channel.flush");
  tie(s);
  call("flush", [&](fd::channel<B>& ch) { ch.flush(s); });
}

template <class B>
std::size_t py_channel<B>::deferred_pending() const
{
  std::shared_lock lk{mu_};
  return open() ? ch_->deferred_pending() : 0;  // closing: producer state is close()'s
}

template <class B>
void py_channel<B>::plan(const py_plan& p, nb::handle stream, fd::forward_meta meta)
{
  // None: torch's current stream where torch is imported (CUDA: where torch.cuda.CUDAGraph.replay launches),
  // else the channel's compute stream (the core's plan(p)).
  if (stream.is_none() && (is_host<B> || torch_module() == nullptr)) {
    call("plan", [&](fd::channel<B>& ch) { ch.plan(p.p, std::move(meta)); });
    return;
  }
  if constexpr (!is_host<B>) {  // torch's default stream is the legacy default stream (handle 0)
    nb::object h = nb::borrow(stream);
    if (PyObject* raw = stream.is_none() ? torch_current_raw_stream() : nullptr; raw != nullptr) {
      h = nb::steal(PyObject_CallFunction(raw, "i", dev_));
      if (!h.is_valid()) { throw nb::python_error(); }
    }
    if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()) && nb::cast<std::uintptr_t>(h) == 0) {
      call("plan", [&](fd::channel<B>& ch) { ch.plan(p.p, fb::default_stream, std::move(meta)); });
      return;
    }
  }
  auto s = resolve_stream<B>(stream, dev_, "Channel.plan");
  tie(s);
  call("plan", [&](fd::channel<B>& ch) { ch.plan(p.p, s, std::move(meta)); });
}

template <class B>
bool py_channel<B>::programmatic_launch() const
{
  std::shared_lock lk{mu_};
  return open() && ch_->programmatic_launch();
}

template <class B>
bool py_channel<B>::invalidated() const
{
  std::shared_lock lk{mu_};
  return open() && ch_->invalidated();
}

template <class B>
bool py_channel<B>::capture_disabled() const
{
  std::shared_lock lk{mu_};
  return open() && ch_->capture_disabled();
}

template <class B>
std::optional<std::string> py_channel<B>::capture_error() const
{
  std::shared_lock lk{mu_};
  if (!open()) { return std::nullopt; }
  std::string e = ch_->capture_error();
  return e.empty() ? std::nullopt : std::optional<std::string>{std::move(e)};
}

template <class B>
void py_channel<B>::recover()
{
  call("recover", [&](fd::channel<B>& ch) { ch.recover(); });
}

template <class B>
void py_channel<B>::release_producer_thread()
{
  call("release_producer_thread", [&](fd::channel<B>& ch) { ch.release_producer_thread(); });
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
  c.tie(s);
  c.set_dev();
  capture_into(ch, hook, ptr, bytes, s, std::move(owner), deferred);
}

template <class B>
void py_channel<B>::flush_raw(void* self, std::uintptr_t stream)
{
  auto& c = *static_cast<py_channel*>(self);
  std::shared_lock lk{c.mu_};
  auto& ch = c.live("flush");
  const auto s = c.raw_stream(stream, 0, "flush");
  c.tie(s);
  c.set_dev();
  ch.flush(s);
}

template <class B>
std::uint32_t py_channel<B>::flags_raw(void* self)
{
  auto& c = *static_cast<py_channel*>(self);
  std::shared_lock lk{c.mu_};
  const auto f = c.open() ? c.ch_->open_forward() : std::nullopt;
  if (!f) { return 0; }
  return FERRY_INFO_FORWARD_OPEN | (f->capturing ? FERRY_INFO_FORWARD_CAPTURING : 0U);
}

template class py_channel<fb::host_backend>;
#if defined(FERRY_PYTHON_CUDA)
template class py_channel<fb::cuda_backend>;
#endif

}  // namespace ferry::python
