// SPDX-License-Identifier: Apache-2.0
// ferry.Channel (D2H) for one backend: producer calls, poll() batches of entries, zero-copy numpy views.
#pragma once

#include "capi.hpp"
#include "common.hpp"

#include <ferry/d2h.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <vector>

namespace ferry::python {

namespace fd = ferry::d2h;

/// One delivered entry. Views (numpy()) share `held`: the staging bytes go back when release() was called
/// (or the entry died) AND the last view died.
struct py_entry {
  struct holder {
    fd::entry_view v;
  };
  std::shared_ptr<holder> held;
  std::uint32_t hook{0};
  std::uint64_t seq{0};
  std::uint64_t size{0};
  std::uint64_t reserved{0};
  bool ok{true};

  explicit py_entry(fd::entry_view&& v)
    : held{std::make_shared<holder>()}, hook{v.hook().value}, seq{v.seq().value}, size{v.size()},
      reserved{v.reserved_bytes()}, ok{v.ok()}
  {
    held->v = std::move(v);
  }

  [[nodiscard]] nb::ndarray<nb::numpy, const std::uint8_t, nb::ndim<1>> numpy() const
  {
    FERRY_EXPECTS(held != nullptr, ferry::logic_error,
                  "d2h entry {} of hook {}: expected a live entry, got a released one (numpy() after release())",
                  seq, hook);
    auto bytes = held->v.bytes();  // size_overflow_error for a rejected dynamic entry
    auto* keep = new std::shared_ptr<holder>(held);
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<holder>*>(p); });
    const std::size_t shape[1] = {bytes.size()};
    return {reinterpret_cast<const std::uint8_t*>(bytes.data()), 1, shape, owner};
  }
  [[nodiscard]] nb::bytes to_bytes() const
  {
    FERRY_EXPECTS(held != nullptr, ferry::logic_error,
                  "d2h entry {} of hook {}: expected a live entry, got a released one (tobytes() after release())",
                  seq, hook);
    auto b = held->v.bytes();
    return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }
  void release() noexcept { held.reset(); }
  [[nodiscard]] bool released() const noexcept { return held == nullptr; }
  /// numpy views alive (besides the entry itself).
  [[nodiscard]] long views() const noexcept { return held ? held.use_count() - 1 : 0; }
};

/// A forward_plan captured by end_forward() in graph mode.
struct py_plan {
  fd::forward_plan p;
  [[nodiscard]] std::size_t size() const noexcept { return p.size(); }
};

/// An executable graph (Stream.end_capture); the engine's own graphs (torch.cuda.CUDAGraph) work the same.
template <class B>
struct py_graph {
  typename B::graph_exec_type exec{};
  py_graph() = default;
  py_graph(const py_graph&) = delete;
  py_graph& operator=(const py_graph&) = delete;
  ~py_graph() { B{}.graph_exec_destroy(exec); }
};

/// A native consumer from a "ferry.sink" capsule (ferry_capi.h).
[[nodiscard]] inline const ferry_sink* sink_from(nb::handle capsule)
{
  FERRY_EXPECTS(PyCapsule_CheckExact(capsule.ptr()) != 0 && PyCapsule_IsValid(capsule.ptr(), FERRY_SINK_NAME) != 0,
                ferry::logic_error, "Channel: expected sink to be a PyCapsule named '{}', got {}", FERRY_SINK_NAME,
                type_of(capsule));
  const auto* s = static_cast<const ferry_sink*>(PyCapsule_GetPointer(capsule.ptr(), FERRY_SINK_NAME));
  FERRY_EXPECTS(s != nullptr && s->fn != nullptr && s->version == FERRY_SINK_VERSION, ferry::logic_error,
                "Channel: expected a ferry_sink of version {} with a function, got version {}{}", FERRY_SINK_VERSION,
                s != nullptr ? s->version : 0U, s != nullptr && s->fn == nullptr ? " without one" : "");
  return s;
}

/// The owner of a deferred source given from Python (Channel.capture_deferred): the array (a reference,
/// dropped with the GIL taken, when `owns`), and torch's version counter at the capture when it has one.
struct py_deferred_src {
  PyObject* obj{nullptr};
  long long version{0};
  bool versioned{false};
  bool owns{false};

  /// torch's version counter of `o` (`ok`: it has one). Only a torch tensor that is not an inference tensor
  /// has one; asking an inference tensor for it raises (a c10::Error with a backtrace, ~10 us), so
  /// is_inference() is asked first, and an object without it (numpy, CuPy, ...) has no counter.
  [[nodiscard]] static long long read_version(PyObject* o, bool& ok)
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
  static void release(void* p)
  {
    auto* d = static_cast<py_deferred_src*>(p);
    if (d->owns) {
      nb::gil_scoped_acquire g;
      Py_DECREF(d->obj);
    }
    delete d;
  }
  static int unchanged(void* p)
  {
    auto* d = static_cast<py_deferred_src*>(p);
    if (!d->versioned) { return 1; }
    nb::gil_scoped_acquire g;
    bool ok = false;
    const long long now = read_version(d->obj, ok);
    return ok && now == d->version ? 1 : 0;
  }
};

template <class B>
class py_channel {
 public:
  py_channel(int device, fd::config cfg, nb::handle sink = nb::handle())
    : dev_{device}, def_limit_{fd::detail::deferred_limit(cfg, cfg.fifo_capacity)},
      staged_max_{cfg.staged_capture_max_bytes}, ring_bytes_{cfg.ring_bytes}
  {
    B b{};
    b.set_device(fb::device_id{device});
    typename fd::channel<B>::callback_type cb;
    if (sink.is_valid() && !sink.is_none()) {
      const ferry_sink* s = sink_from(sink);
      sink_owner_ = nb::borrow(sink);
      // Runs on the drain thread, no GIL: the entry's staging goes back when the view dies after fn.
      cb = [fn = s->fn, ctx = s->ctx](fd::entry_view&& v) {
        ferry_entry e{v.hook().value, v.ok() ? 1U : 0U, v.seq().value, v.size(), nullptr};
        if (v.ok()) { e.data = v.bytes().data(); }
        fn(ctx, &e);
      };
    }
    ch_.emplace(cfg, b, std::move(cb));
    handle_ = channel_registry::get().add(channel_slot{this, is_host<B> ? FERRY_BACKEND_HOST : FERRY_BACKEND_CUDA,
                                                       device, &py_channel::capture_thunk,
                                                       &py_channel::deferred_thunk, &py_channel::flush_thunk,
                                                       &py_channel::flags_thunk,
                                                       std::make_shared<channel_life>()});
  }
  ~py_channel()
  {
    gil_release g;
    channel_registry::get().remove(handle_);  // waits for C ABI calls in flight
    ch_.reset();
    leftovers_.clear();
  }

  void begin_forward(nb::handle stream)
  {
    auto s = resolve_stream<B>(stream, dev_, "Channel.begin_forward");
    std::shared_lock lk{mu_};
    auto& ch = live("begin_forward");
    drop_completed_refs();
    std::vector<deferred_src> dropped;  // released after the GIL is taken back (gil_release's scope ends first)
    gil_release g;
    set_dev();
    ch.begin_forward(s);
    dropped = drop_deferred();
    fwd_stream_.store(reinterpret_cast<std::uintptr_t>(s.handle()), std::memory_order_relaxed);
    fwd_flags_.store(FERRY_INFO_FORWARD_OPEN | (s.is_capturing() ? FERRY_INFO_FORWARD_CAPTURING : 0U),
                     std::memory_order_relaxed);
  }

  [[nodiscard]] py_plan end_forward(nb::handle stream)
  {
    auto s = resolve_stream<B>(stream, dev_, "Channel.end_forward");
    std::shared_lock lk{mu_};
    auto& ch = live("end_forward");
    py_plan out;
    bool capturing = false;
    check_deferred("end_forward");  // with the GIL held: the version reads need it
    std::vector<deferred_src> flushed;  // released with the GIL held, after the block below
    {
      gil_release g;
      set_dev();
      capturing = s.is_capturing();
      out.p = ch.end_forward(s);
      flushed = deferred_flushed();
      fwd_flags_.store(0, std::memory_order_relaxed);
    }
    hand_over_forward_refs(s, capturing);
    return out;
  }

  /// Drops the forward open on `stream` (after an exception between begin_forward and end_forward, or a
  /// capture that ended without end_forward): eager, every entry captured so far is published and
  /// delivered; captured, the recording is forgotten; pending deferred entries are dropped unlaunched.
  /// Returns whether a forward was open.
  [[nodiscard]] bool abort_forward(nb::handle stream)
  {
    auto s = resolve_stream<B>(stream, dev_, "Channel.abort_forward");
    std::shared_lock lk{mu_};
    auto& ch = live("abort_forward");
    // Captured at begin_forward: the capture may have ended since (a failed capture is aborted after it).
    const bool captured = (fwd_flags_.load(std::memory_order_relaxed) & FERRY_INFO_FORWARD_CAPTURING) != 0;
    bool was_open = false;
    std::vector<deferred_src> dropped;  // released with the GIL held, after the block below
    {
      gil_release g;
      set_dev();
      was_open = ch.abort_forward(s);
      dropped = drop_deferred();  // pending deferred entries are dropped unlaunched with the forward
      fwd_flags_.store(0, std::memory_order_relaxed);
    }
    if (was_open) { hand_over_forward_refs(s, captured); }
    return was_open;
  }

  void capture(std::uint32_t hook, nb::handle tensor, nb::handle stream)
  {
    auto s = resolve_stream<B>(stream, dev_, "Channel.capture");
    array_bytes t = tensor_bytes(tensor, hook, "Channel.capture");
    std::shared_lock lk{mu_};
    auto& ch = live("capture");
    std::shared_ptr<void> snap = host_snapshot(t);
    if (capture_flushes(t.nbytes)) { check_deferred("capture"); }  // with the GIL held: the version reads need it
    std::vector<deferred_src> flushed;  // released with the GIL held, after the block below
    {
      gil_release g;
      set_dev();
      flushed = immediate(ch, hook, t.data, t.nbytes, s);
    }
    hold_host_source(tensor, std::move(snap));
  }

  /// Channel.capture_deferred: the array is held until the flush that copies it was enqueued (host backend:
  /// until the forward's copies ran); a torch tensor's version counter is checked before that flush.
  void capture_deferred(std::uint32_t hook, nb::handle tensor, nb::handle stream)
  {
    auto s = resolve_stream<B>(stream, dev_, "Channel.capture_deferred");
    array_bytes t = tensor_bytes(tensor, hook, "Channel.capture_deferred");
    auto* o = new py_deferred_src{tensor.ptr(), 0, false, !is_host<B>};
    o->version = py_deferred_src::read_version(tensor.ptr(), o->versioned);
    if (o->owns) { Py_INCREF(o->obj); }
    std::shared_ptr<void> keep(o, &py_deferred_src::release);
    std::shared_lock lk{mu_};
    auto& ch = live("capture_deferred");
    // The host copy runs later. In an eager forward it copies a snapshot taken now; the contract (unmodified
    // until the flush) and the version check at the flush stay those of CUDA.
    hold_host_source(tensor, host_snapshot(t));
    // The pending sources are checked only when this call flushes them, with the GIL held (one GIL for all
    // the version reads), and the flushed ones are released after the GIL is taken back (`flushed` outlives
    // `g`): no GIL hand-over per source while another Python thread (the consumer) may hold it.
    if (deferred_flushes(t.nbytes)) { check_deferred("capture_deferred"); }
    std::vector<deferred_src> flushed;
    gil_release g;
    set_dev();
    flushed = deferred(ch, hook, t.data, t.nbytes, s, std::move(keep), &py_deferred_src::unchanged, o);
  }

  /// Channel.flush: enqueues the gather of the pending deferred entries.
  void flush(nb::handle stream)
  {
    auto s = resolve_stream<B>(stream, dev_, "Channel.flush");
    std::shared_lock lk{mu_};
    auto& ch = live("flush");
    check_deferred("flush");  // with the GIL held: the version reads need it
    std::vector<deferred_src> flushed;  // released with the GIL held (`g` ends first)
    gil_release g;
    set_dev();
    ch.flush(s);
    flushed = deferred_flushed();
  }

  /// The number of deferred entries recorded and not yet flushed (the binding's mirror of the channel's).
  [[nodiscard]] std::size_t deferred_pending() const
  {
    std::lock_guard l{def_mu_};
    return pend_.size();
  }

  void plan(const py_plan& p)
  {
    std::shared_lock lk{mu_};
    auto& ch = live("plan");
    gil_release g;
    set_dev();
    ch.plan(p.p);
  }

  /// Up to `max_entries` delivered entries: waits up to `timeout` seconds (None: forever) for the first one,
  /// then takes whatever else is ready. The GIL is released while waiting; Ctrl-C is honoured.
  [[nodiscard]] std::vector<py_entry> poll(std::size_t max_entries, std::optional<double> timeout)
  {
    FERRY_EXPECTS(max_entries > 0, ferry::logic_error, "Channel.poll: expected max_entries >= 1, got 0");
    FERRY_EXPECTS(!sink_owner_.is_valid(), ferry::logic_error,
                  "Channel.poll: expected a channel without a native sink, got one with a sink (its entries go to "
                  "the sink)");
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

  [[nodiscard]] nb::dict stats() const
  {
    std::shared_lock lk{mu_};
    const fd::counters c = ch_ ? ch_->stats() : final_stats_;
    nb::dict d;
    d["entries_reserved"] = c.entries_reserved;
    d["entries_published"] = c.entries_published;
    d["entries_drained"] = c.entries_drained;
    d["bytes_drained"] = c.bytes_drained;
    d["copies"] = c.copies;
    d["stalls"] = c.stalls;
    d["high_watermark"] = c.high_watermark;
    d["size_overflows"] = c.size_overflows;
    d["callback_errors"] = c.callback_errors;
    d["publishes"] = c.publishes;
    return d;
  }

  /// Drains, stops and destroys the C++ channel (the device slot is free again); entries delivered but
  /// not polled stay available to poll(). Raises ShutdownError (with .report) when entries were lost, and
  /// InvalidatedError after a backend failure; the channel is closed either way.
  [[nodiscard]] nb::dict close(std::optional<double> timeout)
  {
    std::optional<fd::shutdown_report> rep;
    std::optional<fd::shutdown_error> err;
    std::exception_ptr other;  // e.g. invalidated_error: raised after the teardown, so the channel is closed
    {
      gil_release g;
      std::unique_lock lk{mu_};
      FERRY_EXPECTS(ch_.has_value(), ferry::logic_error, "Channel.close: expected an open channel, got a closed one");
      set_dev();
      try {
        rep = timeout ? ch_->close(std::chrono::milliseconds(static_cast<std::int64_t>(*timeout * 1000.0)))
                      : ch_->close();
      } catch (const fd::shutdown_error& e) {
        err.emplace(e);
      } catch (const ferry::error&) {
        other = std::current_exception();
      }
      final_stats_ = ch_->stats();
      {
        std::lock_guard l2{leftover_mu_};
        while (auto v = ch_->try_pop()) { leftovers_.push_back(std::move(*v)); }
      }
      ch_.reset();
    }
    (void)drop_deferred();  // with the GIL held: the sources' owners drop Python references
    current_.clear();
    pending_.clear();
    graph_refs_.clear();
    {
      std::lock_guard kl{keep_mu_};
      keep_current_.clear();
      keep_graph_.clear();
    }
    sink_owner_.reset();
    if (other) { std::rethrow_exception(other); }
    if (err) { throw *err; }
    return report_dict(*rep);
  }

  [[nodiscard]] bool closed() const noexcept { return !ch_.has_value(); }
  /// The channel's C ABI handle (ferry_capi.h): valid until the channel object is destroyed.
  [[nodiscard]] std::uint64_t handle() const noexcept { return handle_; }
  [[nodiscard]] bool has_sink() const noexcept { return sink_owner_.is_valid(); }

  /// The C ABI capture (no GIL held): `stream` a backend stream handle or FERRY_STREAM_OF_FORWARD.
  void capture_raw(std::uint32_t hook, const void* ptr, std::uint64_t bytes, std::uintptr_t stream,
                   std::shared_ptr<void> keep)
  {
    std::shared_lock lk{mu_};
    auto& ch = live("capture");
    using handle_type = typename B::stream_type;
    if (stream == FERRY_STREAM_OF_FORWARD) {
      // An invalidated channel says so first (the forward it had is gone with it).
      FERRY_EXPECTS(!ch.invalidated(), ferry::invalidated_error, "d2h channel capture (hook {}): {}", hook,
                    ch.invalidation_reason());
      FERRY_EXPECTS((fwd_flags_.load(std::memory_order_relaxed) & FERRY_INFO_FORWARD_OPEN) != 0, ferry::logic_error,
                    "d2h channel capture (hook {}): expected an open forward (begin_forward), got none", hook);
      stream = fwd_stream_.load(std::memory_order_relaxed);
    }
    const fb::stream_view<B> s{B{}, reinterpret_cast<handle_type>(stream)};
    set_dev();
    if (capture_flushes(bytes)) { check_deferred("capture"); }
    (void)immediate(ch, hook, ptr, bytes, s);
    if constexpr (is_host<B>) {  // the host copy runs later on the stream thread: hold the bytes until then
      if (keep) {
        std::lock_guard kl{keep_mu_};
        keep_current_.push_back(std::move(keep));
      }
    }
  }
  /// The C ABI capture_deferred / flush (no GIL held).
  void capture_deferred_raw(std::uint32_t hook, const void* ptr, std::uint64_t bytes, std::uintptr_t stream,
                            std::shared_ptr<void> keep, int (*unchanged)(void*), void* owner)
  {
    std::shared_lock lk{mu_};
    auto& ch = live("capture_deferred");
    const auto s = raw_stream(stream, hook, "capture_deferred");
    set_dev();
    if (deferred_flushes(bytes)) { check_deferred("capture_deferred"); }
    (void)deferred(ch, hook, ptr, bytes, s, std::move(keep), unchanged, owner);
  }
  void flush_raw(std::uintptr_t stream)
  {
    std::shared_lock lk{mu_};
    auto& ch = live("flush");
    const auto s = raw_stream(stream, 0, "flush");
    set_dev();
    check_deferred("flush");
    ch.flush(s);
    (void)deferred_flushed();
  }
  [[nodiscard]] int device() const noexcept { return dev_; }
  /// Whether ferry's kernels are launched programmatically (the config knob and the device's support).
  [[nodiscard]] bool programmatic_launch() const
  {
    std::shared_lock lk{mu_};
    return ch_ && ch_->programmatic_launch();
  }
  [[nodiscard]] bool invalidated() const
  {
    std::shared_lock lk{mu_};
    return ch_ && ch_->invalidated();
  }

  static nb::dict report_dict(const fd::shutdown_report& r)
  {
    nb::dict d;
    nb::list unpub, hooks, undrained;
    for (auto s : r.unpublished) { unpub.append(s.value); }
    for (auto h : r.unpublished_hooks) { hooks.append(h.value); }
    for (auto s : r.undrained) { undrained.append(s.value); }
    d["delivered"] = r.delivered;
    d["pending_pop"] = r.pending_pop;
    d["unpublished"] = unpub;
    d["unpublished_hooks"] = hooks;
    d["undrained"] = undrained;
    d["forward_open"] = r.forward_open;
    d["clean"] = r.clean();
    return d;
  }

 private:
  /// Host backend, eager forward: the stream thread copies later, unordered with the caller's own writes
  /// (torch's CPU ops and numpy run on the calling thread, not on the stream), so the bytes are snapshotted at
  /// the call and `t` points to the snapshot: an in-place write after the call does not reach the entry, as
  /// stream order makes it so on CUDA (the torch op snapshots the same way). A captured forward's graph reads
  /// the array itself at each launch. Null (no snapshot) on CUDA, outside an eager forward, or for no bytes.
  [[nodiscard]] std::shared_ptr<void> host_snapshot(array_bytes& t) const
  {
    if constexpr (is_host<B>) {
      const std::uint32_t f = fwd_flags_.load(std::memory_order_relaxed);
      if ((f & FERRY_INFO_FORWARD_OPEN) != 0 && (f & FERRY_INFO_FORWARD_CAPTURING) == 0 && t.nbytes != 0) {
        std::shared_ptr<std::byte[]> buf(new std::byte[t.nbytes]);  // operator new: 16-byte aligned
        std::memcpy(buf.get(), t.data, t.nbytes);
        t.data = buf.get();
        return buf;
      }
    }
    (void)t;
    return {};
  }
  /// Host backend: holds the array until the forward's copies ran (a captured forward's graph reads it; a
  /// deferred source's version check reads it: on the host backend py_deferred_src does not own it) and
  /// the snapshot the stream thread copies, if any; nothing on CUDA.
  void hold_host_source(nb::handle tensor, std::shared_ptr<void> snap)
  {
    if constexpr (is_host<B>) {
      current_.push_back(nb::borrow(tensor));
      if (snap) {
        std::lock_guard kl{keep_mu_};
        keep_current_.push_back(std::move(snap));
      }
    }
    (void)tensor, (void)snap;
  }
  /// Host backend: the arrays (and C ABI owners) captured in the forward just ended or aborted. Eager: host
  /// "kernels" copy later, on the stream thread, so they are held until then; captured: with the graph.
  void hand_over_forward_refs(fb::stream_view<B> s, bool capturing)
  {
    if constexpr (is_host<B>) {
      if (!capturing) {
        auto done = std::make_shared<std::atomic<bool>>(false);
        s.backend().host_func(s.handle(), [done] { done->store(true, std::memory_order_release); });
        pending_.push_back({done, std::move(current_)});
      } else {
        graph_refs_.insert(graph_refs_.end(), current_.begin(), current_.end());
      }
      current_.clear();
      std::lock_guard kl{keep_mu_};  // C ABI captures' owners: released after the copies, or with the graph
      if (!capturing) {
        if (!keep_current_.empty()) {
          auto k = std::make_shared<decltype(keep_current_)>(std::move(keep_current_));
          s.backend().host_func(s.handle(), [k] { k->clear(); });
        }
      } else {
        keep_graph_.insert(keep_graph_.end(), keep_current_.begin(), keep_current_.end());
      }
      keep_current_.clear();
    }
  }

  fd::channel<B>& live(const char* what)
  {
    FERRY_EXPECTS(ch_.has_value(), ferry::logic_error, "Channel.{}: expected an open channel, got a closed one", what);
    return *ch_;
  }
  void set_dev() const
  {
    if constexpr (!is_host<B>) { B{}.set_device(fb::device_id{dev_}); }
  }
  static std::string fmt_who(const char* what, std::uint32_t hook)
  {
    return std::string{what} + " (hook " + std::to_string(hook) + ")";
  }
  /// A captured tensor's bytes: a plain torch.Tensor through the fast path (torch_fast_bytes), anything else
  /// (and a torch tensor the fast path leaves alone) through DLPack, checked by check_device_array.
  [[nodiscard]] array_bytes tensor_bytes(nb::handle tensor, std::uint32_t hook, const char* what) const
  {
    array_bytes out;
    if (torch_fast_bytes<B>(tensor, dev_, out)) { return out; }
    any_array t = as_array(tensor, what);
    check_device_array<B>(t, dev_, fmt_who(what, hook));
    out.data = t.data();
    out.nbytes = t.nbytes();
    out.dl = std::move(t);
    return out;
  }
  [[nodiscard]] fb::stream_view<B> raw_stream(std::uintptr_t stream, std::uint32_t hook, const char* what) const
  {
    if (stream == FERRY_STREAM_OF_FORWARD) {
      FERRY_EXPECTS((fwd_flags_.load(std::memory_order_relaxed) & FERRY_INFO_FORWARD_OPEN) != 0, ferry::logic_error,
                    "d2h channel {} (hook {}): expected an open forward (begin_forward), got none", what, hook);
      stream = fwd_stream_.load(std::memory_order_relaxed);
    }
    return fb::stream_view<B>{B{}, reinterpret_cast<typename B::stream_type>(stream)};
  }

  /// A deferred source held by the binding until the gather that copies it was enqueued.
  struct deferred_src {
    std::uint32_t hook{0};
    std::shared_ptr<void> keep;
    int (*unchanged)(void*){nullptr};
    void* owner{nullptr};
  };

  /// Whether capture() of `bytes` is a staged capture (config::staged_capture_max_bytes): it joins the deferred
  /// batch instead of flushing it, so the binding mirrors it like a deferred entry (with no source to hold).
  [[nodiscard]] bool staged_capture(std::uint64_t bytes) const noexcept
  {
    return fd::detail::staged_capture(staged_max_, bytes);
  }
  /// Whether capture() of `bytes` flushes the pending batch (the caller checks the pending sources first).
  [[nodiscard]] bool capture_flushes(std::uint64_t bytes) const
  {
    return !staged_capture(bytes) || deferred_flushes(bytes);
  }
  /// capture() through the channel: a staged capture joins the mirrored batch, any other flushes it first.
  /// Returns the sources flushed (as deferred()).
  [[nodiscard]] std::vector<deferred_src> immediate(fd::channel<B>& ch, std::uint32_t hook, const void* ptr,
                                                    std::uint64_t bytes, const fb::stream_view<B>& s)
  {
    if (staged_capture(bytes)) { return deferred(ch, hook, ptr, bytes, s, nullptr, nullptr, nullptr, true); }
    ch.capture(fd::hook_id{hook}, ptr, bytes, s);
    return deferred_flushed();
  }

  /// Whether a deferred capture of `bytes` flushes the pending batch (the channel's rule, mirrored by
  /// `mirror_`: before the new entry when the batch cannot hold it, after it when it fills the batch). The
  /// caller checks the pending sources (check_deferred) before such a capture, and only then.
  [[nodiscard]] bool deferred_flushes(std::uint64_t bytes) const
  {
    const std::uint64_t reserved = fd::align_up(bytes, fd::entry_alignment);
    std::lock_guard l{def_mu_};
    return mirror_.needs_flush_before(reserved, def_limit_, ring_bytes_) || mirror_.size() + 1 >= def_limit_;
  }

  /// capture_deferred through the channel, mirroring its flush rule (detail::deferred_batch with the same
  /// limit and ring size): a flush before the new entry (the batch could not hold it), and after it (the
  /// batch is full). Returns the sources flushed (the caller releases them where it holds the GIL).
  [[nodiscard]] std::vector<deferred_src> deferred(fd::channel<B>& ch, std::uint32_t hook, const void* ptr,
                                                   std::uint64_t bytes, const fb::stream_view<B>& s,
                                                   std::shared_ptr<void> keep, int (*unchanged)(void*), void* owner,
                                                   bool staged = false)
  {
    const std::uint64_t reserved = fd::align_up(bytes, fd::entry_alignment);
    bool before = false;
    {
      std::lock_guard l{def_mu_};
      before = mirror_.needs_flush_before(reserved, def_limit_, ring_bytes_);
    }
    if (staged) {
      ch.capture(fd::hook_id{hook}, ptr, bytes, s);  // the channel copies into its staging slot at once
    } else {
      ch.capture_deferred(fd::hook_id{hook}, ptr, bytes, s);
    }
    std::vector<deferred_src> flushed;
    if (before) { flushed = deferred_flushed(); }
    bool full = false;
    {
      std::lock_guard l{def_mu_};
      mirror_.push(fd::hook_id{hook}, ptr, bytes, reserved);
      pend_.push_back(deferred_src{hook, std::move(keep), unchanged, owner});
      full = mirror_.size() >= def_limit_;
    }
    if (full) {
      auto more = deferred_flushed();
      std::move(more.begin(), more.end(), std::back_inserter(flushed));
    }
    return flushed;
  }
  /// Throws logic_error naming the first pending deferred entry whose source was written since its capture
  /// (before anything of the batch is launched: the caller then calls abort_forward).
  void check_deferred(const char* what)
  {
    std::vector<std::pair<std::uint32_t, std::pair<int (*)(void*), void*>>> c;
    {
      std::lock_guard l{def_mu_};
      for (const auto& p : pend_) {
        if (p.unchanged != nullptr) { c.push_back({p.hook, {p.unchanged, p.owner}}); }
      }
    }
    for (const auto& [hook, f] : c) {
      FERRY_EXPECTS(f.first(f.second) != 0, ferry::logic_error,
                    "Channel.{}: the source of deferred hook {} was written in place after its capture_deferred and "
                    "before its flush (the gather would copy the new bytes): expected it unmodified until the "
                    "flush; capture hook {} immediately instead. Nothing of its batch was launched (abort_forward "
                    "drops the forward)",
                    what, hook, hook);
    }
  }
  /// The channel flushed every pending deferred entry (its gather is enqueued): CUDA releases the sources
  /// now (the allocator orders reuse on the stream); the host backend holds them until the forward's
  /// emulated copies ran (keep_current_, as the C ABI's captures).
  /// Returns them (CUDA; released where the caller destroys the vector: with the GIL held on the Python
  /// paths, as a source's owner may drop a Python reference).
  [[nodiscard]] std::vector<deferred_src> deferred_flushed()
  {
    std::vector<deferred_src> done;
    {
      std::lock_guard l{def_mu_};
      done.swap(pend_);
      mirror_.clear();
    }
    if constexpr (is_host<B>) {
      std::lock_guard kl{keep_mu_};
      for (auto& d : done) {
        if (d.keep) { keep_current_.push_back(std::move(d.keep)); }
      }
    }
    return done;
  }
  /// The pending deferred entries were dropped unlaunched (abort_forward, a new forward, close).
  /// Returns them, as deferred_flushed does.
  [[nodiscard]] std::vector<deferred_src> drop_deferred()
  {
    std::vector<deferred_src> done;
    std::lock_guard l{def_mu_};
    done.swap(pend_);
    mirror_.clear();
    return done;
  }

  void drop_completed_refs()
  {
    std::erase_if(pending_, [](const auto& p) { return p.first->load(std::memory_order_acquire); });
  }

  static void capture_thunk(void* self, std::uint32_t hook, const void* ptr, std::uint64_t bytes,
                            std::uintptr_t stream, std::shared_ptr<void> keep)
  {
    static_cast<py_channel*>(self)->capture_raw(hook, ptr, bytes, stream, std::move(keep));
  }
  static void deferred_thunk(void* self, std::uint32_t hook, const void* ptr, std::uint64_t bytes,
                             std::uintptr_t stream, std::shared_ptr<void> keep, int (*unchanged)(void*), void* owner)
  {
    static_cast<py_channel*>(self)->capture_deferred_raw(hook, ptr, bytes, stream, std::move(keep), unchanged, owner);
  }
  static void flush_thunk(void* self, std::uintptr_t stream) { static_cast<py_channel*>(self)->flush_raw(stream); }
  static std::uint32_t flags_thunk(void* self)
  {
    return static_cast<py_channel*>(self)->fwd_flags_.load(std::memory_order_relaxed);
  }

  int dev_;
  std::uint32_t def_limit_;  // the channel's deferred batch limit (detail::deferred_limit)
  std::uint64_t staged_max_{0};  // config::staged_capture_max_bytes
  std::uint64_t ring_bytes_;
  mutable std::mutex def_mu_;
  fd::detail::deferred_batch mirror_;  // the channel's deferred batch, mirrored (sizes only)
  std::vector<deferred_src> pend_;     // its sources, in entry order
  std::uint64_t handle_{0};
  nb::object sink_owner_;  // the "ferry.sink" capsule, held until close()
  std::atomic<std::uintptr_t> fwd_stream_{0};
  std::atomic<std::uint32_t> fwd_flags_{0};  // FERRY_INFO_* of the open forward
  std::mutex keep_mu_;
  std::vector<std::shared_ptr<void>> keep_current_;  // C ABI owners and snapshots of the open forward (host)
  std::vector<std::shared_ptr<void>> keep_graph_;    // C ABI owners captured into graphs (host backend)
  mutable std::shared_mutex mu_;  // shared: every call; unique: close()
  std::optional<fd::channel<B>> ch_;
  std::mutex leftover_mu_;
  std::deque<fd::entry_view> leftovers_;
  fd::counters final_stats_{};
  // Host backend only: arrays captured in the open forward, in finished forwards not yet copied, in graphs.
  std::vector<nb::object> current_;
  std::vector<std::pair<std::shared_ptr<std::atomic<bool>>, std::vector<nb::object>>> pending_;
  std::vector<nb::object> graph_refs_;
};

template <class B>
fd::config channel_config(std::size_t ring_bytes, std::uint32_t publish_every, std::size_t staging_bytes,
                          const std::string& placement, const std::string& on_full, double timeout,
                          std::uint32_t fifo_capacity, bool branch_publish = true, bool gather_branch_publish = true,
                          bool programmatic_launch = true, std::uint32_t copy_vecs_per_thread = 2,
                          bool lean_copy_kernel = true, std::size_t staged_capture_max_bytes = 0)
{
  fd::config c;
  c.ring_bytes = ring_bytes;
  c.publish_every = publish_every;
  c.staging_bytes = staging_bytes;
  if (placement == "managed") {
    c.placement = fd::head_placement::managed;
  } else if (placement == "pinned_mapped") {
    c.placement = fd::head_placement::pinned_mapped;
  } else {
    FERRY_FAIL(ferry::logic_error, "Channel: expected placement 'managed' or 'pinned_mapped', got '{}'", placement);
  }
  if (on_full == "block") {
    c.on_full = fd::full_policy::block_with_timeout;
  } else if (on_full == "fail_fast") {
    c.on_full = fd::full_policy::fail_fast;
  } else {
    FERRY_FAIL(ferry::logic_error, "Channel: expected on_full 'block' or 'fail_fast', got '{}'", on_full);
  }
  FERRY_EXPECTS(timeout >= 0, ferry::logic_error, "Channel: expected timeout >= 0 s, got {}", timeout);
  c.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000.0));
  c.fifo_capacity = fifo_capacity;
  c.branch_publish = branch_publish;
  c.gather_branch_publish = gather_branch_publish;
  c.programmatic_launch = programmatic_launch;
  FERRY_EXPECTS(copy_vecs_per_thread == 1 || copy_vecs_per_thread == 2 || copy_vecs_per_thread == 4 ||
                    copy_vecs_per_thread == 8,
                ferry::logic_error, "Channel: expected copy_vecs_per_thread 1, 2, 4 or 8, got {}",
                copy_vecs_per_thread);
  c.copy_vecs_per_thread = copy_vecs_per_thread;
  c.lean_copy_kernel = lean_copy_kernel;
  c.staged_capture_max_bytes = staged_capture_max_bytes;
  c.drain = fd::drain_mode::thread;
  return c;
}

template <class B>
void bind_d2h(nb::module_& m)
{
  using C = py_channel<B>;
  nb::class_<C>(m, "Channel", "D2H channel: capture device tensors into a ring, poll() them on the host.")
    .def(
      "__init__",
      [](C* self, int device, std::size_t ring_bytes, std::uint32_t publish_every, std::size_t staging_bytes,
         const std::string& placement, const std::string& on_full, double timeout, std::uint32_t fifo_capacity,
         nb::handle sink, bool branch_publish, bool gather_branch_publish, bool programmatic_launch,
         std::uint32_t copy_vecs_per_thread, bool lean_copy_kernel, std::size_t staged_capture_max_bytes) {
        new (self) C(device,
                     channel_config<B>(ring_bytes, publish_every, staging_bytes, placement, on_full, timeout,
                                       fifo_capacity, branch_publish, gather_branch_publish, programmatic_launch,
                                       copy_vecs_per_thread, lean_copy_kernel, staged_capture_max_bytes),
                     sink);
      },
      nb::arg("device") = 0, nb::arg("ring_bytes") = std::size_t{64} << 20, nb::arg("publish_every") = 16,
      nb::arg("staging_bytes") = 0, nb::arg("placement") = "managed", nb::arg("on_full") = "block",
      nb::arg("timeout") = 5.0, nb::arg("fifo_capacity") = 8192, nb::arg("sink").none() = nb::none(),
      nb::arg("branch_publish") = true, nb::arg("gather_branch_publish") = true,
      nb::arg("programmatic_launch") = true, nb::arg("copy_vecs_per_thread") = 2, nb::arg("lean_copy_kernel") = true,
      nb::arg("staged_capture_max_bytes") = 0)
    .def("begin_forward", &C::begin_forward, nb::arg("stream").none() = nb::none())
    .def("end_forward", &C::end_forward, nb::arg("stream").none() = nb::none())
    .def("abort_forward", &C::abort_forward, nb::arg("stream").none() = nb::none(),
         "Drops the forward open on stream (the recovery after an exception inside a forward): an eager "
         "forward's captured entries are published and delivered, a captured one is forgotten, pending deferred "
         "entries are dropped. Returns "
         "whether a forward was open.")
    .def("capture", &C::capture, nb::arg("hook"), nb::arg("tensor").none(), nb::arg("stream").none() = nb::none())
    .def("capture_deferred", &C::capture_deferred, nb::arg("hook"), nb::arg("tensor").none(),
         nb::arg("stream").none() = nb::none())
    .def("flush", &C::flush, nb::arg("stream").none() = nb::none())
    .def_prop_ro("deferred_pending", &C::deferred_pending)
    .def("plan", &C::plan, nb::arg("plan"))
    .def("poll", &C::poll, nb::arg("max_entries") = 1024, nb::arg("timeout").none() = 0.0)
    .def("stats", &C::stats)
    .def("close", &C::close, nb::arg("timeout").none() = nb::none())
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__",
         [](C& c, nb::args exc) {
           // closes an open channel; an error of the with-body is not masked by a close() error
           if (c.closed()) { return; }
           if (nb::len(exc) == 0 || exc[0].is_none()) {
             (void)c.close(std::nullopt);
           } else {
             try {
               (void)c.close(std::nullopt);
             } catch (const std::exception&) {
             }
           }
         })
    .def_prop_ro("closed", &C::closed)
    .def_prop_ro("handle", &C::handle, "The channel's integer handle for native code (ferry_capi.h, torch ops).")
    .def_prop_ro("has_sink", &C::has_sink)
    .def_prop_ro("device", &C::device)
    .def_prop_ro("invalidated", &C::invalidated)
    .def_prop_ro("programmatic_launch", &C::programmatic_launch,
                 "Whether ferry's kernels are launched programmatically (the constructor's programmatic_launch "
                 "and the device's support: sm_90+ CUDA).")
    .def_prop_ro_static("backend", [](nb::handle) { return traits<B>::name; });

  auto stream_cls =
    nb::class_<py_stream<B>>(m, "Stream", "An owning stream of this backend.")
    .def(nb::init<int>(), nb::arg("device") = 0)
    .def_prop_ro("handle", [](const py_stream<B>& s) { return reinterpret_cast<std::uintptr_t>(s.handle()); })
    .def_prop_ro("device", [](const py_stream<B>& s) { return s.dev; })
    .def("synchronize",
         [](const py_stream<B>& s) {
           auto h = s.handle();
           gil_release g;
           B{}.stream_synchronize(h);
         })
    .def("close",
         [](py_stream<B>& s) {
           gil_release g;
           s.s.reset();
         })
    .def("begin_capture",
         [](const py_stream<B>& s) {
           auto h = s.handle();
           gil_release g;
           B{}.capture_begin(h);
         })
    .def("end_capture", [](const py_stream<B>& s) {
      auto h = s.handle();
      gil_release g;
      B b{};
      auto graph = b.capture_end(h);
      auto exec = b.graph_instantiate(graph);
      b.graph_destroy(graph);
      auto* x = new py_graph<B>;
      x->exec = exec;
      return x;
    }, nb::rv_policy::take_ownership);
  if constexpr (!is_host<B>) {  // the CUDA stream protocol: (version, cudaStream_t)
    stream_cls.def("__cuda_stream__", [](const py_stream<B>& s) {
      return nb::make_tuple(0, reinterpret_cast<std::uintptr_t>(s.handle()));
    });
  }

  nb::class_<py_graph<B>>(m, "Graph", "An executable graph captured with Stream.begin_capture/end_capture.")
    .def("launch", [](const py_graph<B>& x, nb::handle stream) {
      auto s = resolve_stream<B>(stream, 0, "Graph.launch");
      gil_release g;
      B{}.graph_launch(x.exec, s.handle());
    }, nb::arg("stream"));
}

}  // namespace ferry::python
