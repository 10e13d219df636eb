// SPDX-License-Identifier: Apache-2.0
// ferry.Channel (D2H) for one backend: conversion only. The channel's rules (when a deferred batch flushes,
// when a source may be dropped, the host snapshot, the version check before a flush) live in the C++ core
// (d2h::source_owner); this class turns Python arguments into core calls, hands every source to the core
// with its owner (py_source), and turns delivered entries into ferry.Entry objects.
#pragma once

#include "arrays.hpp"
#include "d2h_batch.hpp"
#include "d2h_entry.hpp"
#include "ferry_capi.h"

#include <ferry/d2h.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <vector>

namespace ferry::python {

/// The owner of a source given from Python (d2h::source_owner::keep): a reference to the array, the DLPack
/// import its bytes come from, and torch's version counter at a deferred capture. Destroyed with the GIL
/// held (graveyard), whichever thread the core releases it on.
struct py_source {
  nb::object obj;
  any_array dl;
  long long version{0};
  bool versioned{false};
  /// `obj` a list (a row capture's tensor and selection arrays): each item's version (-1: none).
  std::vector<long long> item_versions;

  /// The owner of `obj`'s bytes (`dl`: their DLPack import, if any); `deferred`: records its version (a list:
  /// every item's, so a selection array written before the flush is refused as the tensor is), the one the
  /// tensor reader read with the bytes where `known_version` is given (-1: no counter).
  template <class B>
  [[nodiscard]] static fd::source_owner make(nb::handle obj, any_array dl, bool deferred,
                                             const long long* known_version = nullptr);
  /// source_owner::check_fn: the GIL taken once for the whole run of sources.
  static std::size_t unchanged(void* const* owners, std::size_t n);
  /// torch's version counter of `o` now (`ok`: it has one).
  static long long version_now(PyObject* o, bool& ok);
};

/// One capture converted (Channel.capture_deferred_many): the hook, the object whose bytes are taken (kept by
/// the entry's owner) and those bytes with the version recorded for the deferred check.
struct staged_capture {
  std::uint32_t hook{0};
  nb::object keep;
  array_bytes t;
};

/// The Channel's C++ entry points for the C ABI (capi.cpp): type-erased over the backend.
struct channel_calls {
  void* self{nullptr};
  int backend{FERRY_BACKEND_HOST};
  int device{0};
  void (*capture)(void* self, std::uint32_t hook, const void* ptr, std::uint64_t bytes, std::uintptr_t stream,
                  fd::source_owner owner, bool deferred){nullptr};
  void (*flush)(void* self, std::uintptr_t stream){nullptr};
  std::uint32_t (*flags)(void* self){nullptr};
  void (*capture_rows)(void* self, std::uint32_t hook, const void* ptr, std::uint64_t n_rows, std::uint64_t row_bytes,
                       const fd::row_selection& sel, std::uintptr_t stream, fd::source_owner owner){nullptr};
};
/// Registers a live channel for the C ABI; returns its handle (capi.cpp).
[[nodiscard]] std::uint64_t register_channel(const channel_calls& c);
/// Unregisters `handle` and waits for its C ABI calls in flight (capi.cpp).
void unregister_channel(std::uint64_t handle);
/// A forward's metadata from Python (d2h_meta.cpp): tag None | int, requests None | [int] (one row each, in order)
/// | [(request, first_row, rows)], meta None | bytes-like. Every rule about it is the core's (forward_info.hpp).
[[nodiscard]] fd::forward_meta forward_meta_of(nb::handle tag, nb::handle requests, nb::handle meta, const char* who);

/// A native sink of this module (ferry.sinks: SafetensorsSink, ShmStreamSink; native_sink.hpp): what
/// Channel(sink=...) attaches through the core's one-call constructor (its d2h::sink_ref: schema, callback,
/// staging, the sink's rules), and its counters (Channel.stats()["sink"]).
class py_sink {
 public:
  virtual ~py_sink() = default;
  [[nodiscard]] virtual fd::sink_ref ref() = 0;
  [[nodiscard]] virtual nb::dict stats() const = 0;
};
/// Channel(sink=...)'s sink for the core (capi.cpp): a native sink's ref(), a "ferry.sink" capsule's callback
/// (no schema, the channel's own staging), or, for None, none (an empty callback).
[[nodiscard]] fd::sink_ref sink_ref_of(nb::handle sink);
/// The counters of a native sink (py_sink::stats), None for anything else (a capsule) (capi.cpp).
[[nodiscard]] nb::object sink_stats(nb::handle sink);

/// Channel.capture_rows(reduce=...) converted: the reducer, its input type and the row width in elements.
struct rows_reduce {
  fd::reducer r;
  fd::reduce_input in{fd::reduce_input::f32};
  std::uint64_t width{0};
};

template <class B>
class py_channel {
 public:
  /// `sink`: None, a native sink or a "ferry.sink" capsule (sink_ref_of), attached in the core's one call;
  /// `schema`: the channel's hook schema (typed entries; offered to the sink first).
  py_channel(int device, fd::config cfg, nb::handle sink, fd::hook_schema schema = {});
  ~py_channel();
  py_channel(const py_channel&) = delete;
  py_channel& operator=(const py_channel&) = delete;

  /// The forward's tag, request rows and bytes (d2h_meta.cpp: forward_meta_of), converted after the stream: a
  /// wrong stream type is the TypeError it is, whatever else is wrong.
  void begin_forward(nb::handle stream, nb::handle tag, nb::handle requests, nb::handle meta);
  [[nodiscard]] py_plan end_forward(nb::handle stream);
  /// Drops the forward open on `stream` (d2h::channel::abort_forward); returns whether one was open.
  [[nodiscard]] bool abort_forward(nb::handle stream);
  void capture(std::uint32_t hook, nb::handle tensor, nb::handle stream, bool deferred);
  /// capture() after its conversions: `t` the bytes of `tensor` (tensor_bytes), `s` the stream.
  void capture_bytes(std::uint32_t hook, nb::handle tensor, array_bytes t, const fb::stream_view<B>& s, bool deferred);
  /// Channel.capture_deferred_many after its conversions (d2h_capture_fn.cpp): the owners made, then the core's
  /// capture_deferred for each item in order under one release of the GIL (an item the core refuses raises;
  /// the items before it stay recorded, as calls one by one would leave them); `end`: then the core's end_forward
  /// under the same release (end_forward=True: the hand-over and the forward's end in one call), its plan returned.
  std::optional<py_plan> capture_deferred_staged(std::vector<staged_capture>& items, const fb::stream_view<B>& s,
                                                 bool end);
  /// Channel.capture_rows: the arguments converted (d2h_rows.cpp), then the core's capture_rows.
  void capture_rows(std::uint32_t hook, nb::handle tensor, const nb::kwargs& sel, bool deferred);
  /// `red` (reduce=): the core's capture_reduced of rows of red->width elements instead of capture_rows.
  void capture_rows_core(std::uint32_t hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                         const fd::row_selection& sel, const fb::stream_view<B>& s, fd::source_owner owner,
                         bool deferred, const rows_reduce* red = nullptr);
  void flush(nb::handle stream);
  [[nodiscard]] std::size_t deferred_pending() const;
  void plan(const py_plan& p, nb::handle stream, fd::forward_meta meta);
  /// Up to `max_entries` delivered entries: waits up to `timeout` seconds (None: forever) for the first one,
  /// then takes whatever else is ready. The GIL is released while waiting; Ctrl-C is honoured.
  [[nodiscard]] std::vector<py_entry> poll(std::size_t max_entries, std::optional<double> timeout);
  /// poll() as one EntryBatch: the same wait, the entries popped under one lock; empty after the timeout.
  [[nodiscard]] py_batch poll_batch(std::size_t max_entries, std::optional<double> timeout);
  /// The channel's counters; with a native sink of this module, its counters under "sink" (sink_stats; after
  /// close(), as they were when the channel closed).
  [[nodiscard]] nb::dict stats() const;
  /// The hook schema the channel was created with (empty: none).
  [[nodiscard]] const fd::hook_schema& schema() const noexcept { return *schema_; }
  /// Drains, stops and destroys the C++ channel; entries delivered but not polled stay available to poll().
  /// Raises ShutdownError (with .report) when entries were lost, InvalidatedError after a backend failure.
  [[nodiscard]] nb::dict close(std::optional<double> timeout);

  [[nodiscard]] bool closed() const noexcept { return !ch_.has_value(); }
  [[nodiscard]] std::uint64_t handle() const noexcept { return handle_; }
  [[nodiscard]] bool has_sink() const noexcept { return sink_owner_.is_valid(); }
  [[nodiscard]] int device() const noexcept { return dev_; }
  [[nodiscard]] bool programmatic_launch() const;
  [[nodiscard]] bool invalidated() const;
  /// on_error = disable: whether capture is disabled, its first error (None: none), recover().
  [[nodiscard]] bool capture_disabled() const;
  [[nodiscard]] std::optional<std::string> capture_error() const;
  void recover();
  void release_producer_thread();

 private:
  fd::channel<B>& live(const char* what);
  /// The one wait of poll() and poll_batch() (`who`): up to `max` delivered views, waiting up to `timeout`
  /// seconds (None: forever) for the first, then whatever else is ready; the GIL released while waiting, Ctrl-C
  /// honoured; none after the timeout (or at interpreter exit). A closed channel gives its leftovers, then
  /// LogicError.
  [[nodiscard]] std::vector<fd::entry_view> wait_views(std::size_t max, std::optional<double> timeout, const char* who);
  /// The schema entries carry: null when the channel has none (no typed views to make).
  [[nodiscard]] std::shared_ptr<const fd::hook_schema> entry_schema() const
  {
    return schema_->empty() ? nullptr : schema_;
  }
  template <class F>
  decltype(auto) call(const char* what, F&& f);
  void set_dev() const;
  /// This channel is in the graph of the capture in progress on `s`, if any (capture_ties).
  void tie(const fb::stream_view<B>& s) const { tie_to_capture(s, tie_); }
  [[nodiscard]] fb::stream_view<B> raw_stream(std::uintptr_t stream, std::uint32_t hook, const char* what);
  static void capture_raw(void* self, std::uint32_t hook, const void* ptr, std::uint64_t bytes, std::uintptr_t stream,
                          fd::source_owner owner, bool deferred);
  static void flush_raw(void* self, std::uintptr_t stream);
  static void capture_rows_raw(void* self, std::uint32_t hook, const void* ptr, std::uint64_t n_rows,
                               std::uint64_t row_bytes, const fd::row_selection& sel, std::uintptr_t stream,
                               fd::source_owner owner);
  static std::uint32_t flags_raw(void* self);
  /// Interpreter exit (exit_hooks, the GIL held): a forward still open is ended here, while its stream is
  /// alive, and reported in one line.
  static void at_exit(void* self);

  int dev_;
  std::uint64_t handle_{0};
  nb::object sink_owner_;  // the sink (a native sink or a "ferry.sink" capsule), held until close()
  nb::object forward_stream_;  // the open forward's stream: alive until the forward ends (or the channel dies)
  std::shared_ptr<graph_tie> tie_;  // killed by close() and the destructor: graphs of this channel refuse to launch
  mutable std::shared_mutex mu_;  // shared: every call; unique: close()'s first and last step
  std::optional<fd::channel<B>> ch_;
  bool closing_{false};  // under mu_: close() waits for the drain; producer calls refuse, consumer calls go on
  /// Under mu_: the core channel takes producer calls and its producer state can be read (not closed or closing).
  [[nodiscard]] bool open() const noexcept { return ch_.has_value() && !closing_; }
  std::mutex leftover_mu_;
  std::deque<fd::entry_view> leftovers_;
  fd::counters final_stats_{};
  std::shared_ptr<const fd::hook_schema> schema_;  // never null; outlives the C++ channel (its entries use it)
  nb::object final_sink_stats_;  // the sink's counters when the channel closed (None: no native sink)
};

/// Every producer call: the channel held open (shared), the GIL released around the core call `f(ch)`, the
/// device current; sources given up meanwhile are destroyed once the GIL is back.
template <class B>
template <class F>
decltype(auto) py_channel<B>::call(const char* what, F&& f)
{
  struct drain_at_exit {
    ~drain_at_exit() { drain_released(); }
  } at_exit;
  std::shared_lock lk{mu_};
  auto& ch = live(what);
  gil_release g;
  set_dev();
  return f(ch);
}

/// The stub signature of Channel.capture_rows / capture_rows_deferred (d2h_rows.cpp).
[[nodiscard]] const char* rows_signature(const char* name);

/// Registers Channel of backend B in `m` (its keyword arguments from d2h::config's field list).
template <class B>
void init_d2h_channel(nb::module_& m);

}  // namespace ferry::python
