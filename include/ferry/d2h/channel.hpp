// SPDX-License-Identifier: Apache-2.0
// ferry::d2h::channel<B>: GPU -> CPU publication of hook payloads; its parts: d2h/detail/channel_impl.hpp.
//   producer thread: reserve ring space (CPU-known sizes), launch the copy kernel (it advances the device
//     cursor), push the entry's metadata into the FIFO; every K entries and at end_forward one system-scope
//     release of published_head (after a writer join: block barrier, stream order, or a fork event);
//   drainer (thread or poll()): acquire published_head, one D2H per contiguous published run into pinned
//     staging, reclaim ring space when the copy completed, deliver entry_views in order.
// docs/design/d2h.md lists each ordering step with the file and function that enforce it.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/graph.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/d2h/detail/channel_impl.hpp>
#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/errors.hpp>
#include <ferry/d2h/forward_info.hpp>
#include <ferry/d2h/forward_plan.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/d2h/reducer.hpp>
#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/row_selection.hpp>
#include <ferry/d2h/sink.hpp>
#include <ferry/d2h/source_owner.hpp>
#include <ferry/d2h/staging_memory.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/d2h/write_ticket.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::testing {
struct d2h_access;  // tests/support/ferry/testing/d2h_access.hpp (not installed): the channel's test hooks
}

namespace ferry::d2h {

/// Publication of GPU-produced entries to the CPU for one device (any number of channels per device; each
/// is independent). Move-only. Producer calls come from one thread with the channel's device current.
template <ferry::backend::backend B>
class channel {
 public:
  using backend_type = B;
  using stream_view = ferry::backend::stream_view<B>;
  /// Called on the drainer (drain thread or poll() caller) for every completed entry, in entry order. Keep the
  /// view to hold its staging; let it go to release it. Exceptions are caught and counted.
  using callback_type = std::function<void(entry_view&&)>;

  /// Creates the channel for the backend's current device. Throws logic_error on a bad config (K = 0, ring
  /// size, tuning.head_memory managed without concurrentManagedAccess). `staging` (staging_memory.hpp): registered
  /// host memory to land the D2H copies in instead of allocating pinned staging (e.g. a sink::shm_stream's segment).
  /// `schema` (hook_schema.hpp): what each hook's bytes are, for consumers (typed_view.hpp; a sink's default).
  explicit channel(config cfg, B b = B{}, callback_type cb = {}, staging_memory staging = {}, hook_schema schema = {})
    : impl_{std::make_unique<detail::channel_impl<B>>(cfg, b, std::move(cb), std::move(staging),
                                                      std::make_shared<const hook_schema>(std::move(schema)))} {}
  /// The channel with sink `s` (sink.hpp) as its consumer, in one call: `schema` offered to the sink first
  /// (s.adopt_schema: a sink without a schema takes it; its refusal comes before anything is allocated), then
  /// the sink's callback, then its staging if it gives one (s.staging, registered with `b`). `schema` is the
  /// channel's too (schema()).
  template <sink S>
  channel(config cfg, B b, S& s, hook_schema schema = {}) : channel(cfg, b, attach_sink(s, std::move(schema), b)) {}
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;
  channel(channel&&) noexcept = default;
  channel& operator=(channel&& o) noexcept
  {
    if (this != &o) { reset(), impl_ = std::move(o.impl_); }
    return *this;
  }
  /// Never throws. Drains every published entry (waiting up to config::timeout) and waits for in-flight
  /// copies; anything it cannot drain is reported on stderr. Call close() to get the report or an error.
  ~channel() { reset(); }

  // ---- producer (one thread, the channel's device current) ----
  /// Opens a forward on `s`: recorded into a forward_plan if `s` is being captured, else reserved just in time.
  /// Every producer call of the forward uses `s` (else logic_error). An eager forward on another stream than the
  /// last one waits for it (an event). `meta` (eager only): the forward's tag, request rows and bytes.
  void begin_forward(stream_view s, forward_meta meta = {})
  {
    impl()->produce([&] { impl()->prod.begin_forward(s, std::move(meta)); }, [&] { impl()->prod.set_user_open(true); });
  }
  /// Closes the forward: one publication (system-scope release) covering the forward's remaining entries,
  /// and the cursor normalization. Returns the plan in graph mode (empty in eager mode).
  forward_plan end_forward(stream_view s)
  {
    return impl()->produce([&] { return impl()->prod.end_forward(s); }, [&] {
      impl()->prod.set_user_open(false);
      return forward_plan{};
    });
  }
  /// Drops the forward open on `s` (recovery after an exception, or a capture ended without end_forward). Eager:
  /// publishes every entry launched so far; captured: forgets the recording. Drops an open begin_write ticket.
  /// Call it after the capture ended (graph_exec::capture's on_failure does). Returns whether one was open.
  bool abort_forward(stream_view s)
  {
    return impl()->produce([&] { return impl()->prod.abort_forward(s); }, [&] {
      impl()->prod.set_user_open(false);
      return true;
    });
  }
  /// Copies `bytes` from device memory `src` into the ring (library copy kernel) as one entry of `hook`.
  /// `owner` (optional) is held until the copy no longer needs `src` (source_owner.hpp).
  void capture(hook_id hook, const void* src, std::uint64_t bytes, stream_view s, source_owner owner = {})
  {
    impl()->produce([&] {
      (void)impl()->prod.capture(hook, src, bytes, nullptr, detail::entry_kind::fixed, s, blocking(), std::move(owner));
    }, [] {});
  }
  /// Same; returns false instead of blocking / throwing when the ring, FIFO or size ring is full.
  [[nodiscard]] bool try_capture(hook_id hook, const void* src, std::uint64_t bytes, stream_view s,
                                 source_owner owner = {})
  {
    const auto refuse = detail::when_full::refuse;
    return impl()->produce([&] {
      return impl()->prod.capture(hook, src, bytes, nullptr, detail::entry_kind::fixed, s, refuse, std::move(owner));
    }, [] { return false; });
  }
  /// Dynamic entry: reserves `reserved_bytes`; the GPU-resolved size is read from device memory
  /// `actual_size` by the copy kernel (it copies min(actual, reserved) and reports actual in the size slot).
  void capture_dynamic(hook_id hook, const void* src, std::uint64_t reserved_bytes, const std::uint64_t* actual_size,
                       stream_view s)
  {
    impl()->produce([&] {
      (void)impl()->prod.capture(hook, src, reserved_bytes, actual_size, detail::entry_kind::dynamic, s, blocking());
    }, [] {});
  }
  /// Row-selected capture: the rows `sel` names (row_selection.hpp: an index list, the last token or a window
  /// of each selected request from query_start_loc; a CPU-known or GPU-resolved count) of the [n_rows,
  /// row_bytes] device tensor `src`, as one dynamic entry of `hook` (its size slot: tuning::size_slots), in selection
  /// order. Eager and in graphs (a replay reads the selection's current contents). A selection the kernel
  /// refuses is delivered as entry_status::selection_error; nothing outside `src` is read.
  void capture_rows(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                    const row_selection& sel, stream_view s, source_owner owner = {})
  {
    auto& p = impl()->prod;
    impl()->produce([&] { (void)p.capture_rows(hook, src, n_rows, row_bytes, sel, s, blocking(), std::move(owner)); },
                    [] {});
  }
  /// The records of reducer `r` (reducer.hpp) over the rows `sel` names of the [n_rows, width] tensor `src` of `in`
  /// elements, made on the GPU into one dynamic entry of records; otherwise as capture_rows (eager, graphs, errors).
  void capture_reduced(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t width, reduce_input in,
                       const row_selection& sel, const reducer& r, stream_view s, source_owner owner = {})
  {
    auto& p = impl()->prod;
    impl()->produce(
        [&] { (void)p.capture_reduced(hook, src, n_rows, width, in, sel, r, s, blocking(), std::move(owner)); }, [] {});
  }
  /// capture_rows, deferred: recorded on the CPU; a batch of entries sharing one selection and n_rows is copied
  /// by ONE gather launch at its flush point (capture_deferred's contract: `src` and the selection's arrays stay
  /// unmodified until then).
  void capture_rows_deferred(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                             const row_selection& sel, stream_view s, source_owner owner = {})
  {
    impl()->produce([&] { impl()->prod.capture_rows_deferred(hook, src, n_rows, row_bytes, sel, s, std::move(owner)); },
                    [] {});
  }
  /// capture_reduced, deferred as capture_rows_deferred, for a reducer with a record per row (topk, fp8_e4m3): a
  /// batch sharing one selection, n_rows, reducer and `in` is reduced by ONE launch at its flush point.
  void capture_reduced_deferred(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t width,
                                reduce_input in, const row_selection& sel, const reducer& r, stream_view s,
                                source_owner owner = {})
  {
    auto& p = impl()->prod;
    impl()->produce([&] { p.capture_reduced_deferred(hook, src, n_rows, width, in, sel, r, s, std::move(owner)); },
                    [] {});
  }
  /// Deferred capture: records (hook, `src`, `bytes`) on the CPU only; the copy happens in ONE gather
  /// launch for the batch at its flush point: the K-th deferred entry (config::publish_every, at most 128),
  /// end_forward, flush(), or the next capture / begin_write (entry order is kept). Contract: `src` stays
  /// allocated and unmodified until that flush has been enqueued on `s` (docs/api/d2h.md, "Deferred capture").
  /// `owner` (optional) is held until then; its `unchanged` check runs before the flush launches anything
  /// (a written source: logic_error naming the hook, nothing of the batch launched).
  void capture_deferred(hook_id hook, const void* src, std::uint64_t bytes, stream_view s, source_owner owner = {})
  {
    impl()->produce([&] { impl()->prod.capture_deferred(hook, src, bytes, s, std::move(owner)); }, [] {});
  }
  /// Enqueues the copy (one gather launch) of every deferred entry recorded since the last flush on `s`.
  /// After it returns, their sources may be reused by work enqueued on `s`.
  void flush(stream_view s)
  {
    impl()->produce([&] { impl()->prod.flush(s); }, [] {});
  }
  /// Deferred entries (and bounce captures) recorded and not yet flushed (producer thread).
  [[nodiscard]] std::uint32_t deferred_pending() const { return impl()->prod.deferred_pending(); }
  /// The producer's open forward (producer thread): none, or its stream and whether it is being captured.
  [[nodiscard]] std::optional<open_forward_state<B>> open_forward() const { return impl()->prod.open_forward(); }
  /// For a user kernel writing the entry itself: launch it with ticket.ref() (see ring_ref), then end_write().
  [[nodiscard]] write_ticket begin_write(hook_id hook, std::uint64_t reserved_bytes, stream_view s,
                                         bool dynamic = false)
  {
    const auto kind = dynamic ? detail::entry_kind::dynamic : detail::entry_kind::fixed;
    return impl()->produce([&] { return impl()->prod.begin_write(hook, reserved_bytes, kind, s); },
                   [&] { return impl()->prod.disabled_ticket(hook, reserved_bytes); });
  }
  /// Records the entry the ticket's writer kernel (enqueued on `s` before this call) wrote.
  void end_write(write_ticket&& t, stream_view s)
  {
    impl()->produce([&] { impl()->prod.end_write(std::move(t), s); }, [] {});
  }
  /// Plans one graph replay: reserves ring space for every entry of `p` (per config::on_full), fills the FIFO and
  /// enqueues the replay's token on `s`; launch the graph on `s` right after. A launch without a token writes and
  /// publishes nothing and is reported (invalidated_error; docs/design/d2h.md, "the replay token"). `meta`:
  /// this replay's tag, request rows and bytes.
  void plan(const forward_plan& p, stream_view s, forward_meta m = {})
  {
    (void)impl()->plan(p, blocking(), s.handle(), std::move(m));
  }
  /// plan(p, s) for a replay the caller launches on the legacy default stream (torch's default stream).
  void plan(const forward_plan& p, ferry::backend::default_stream_t, forward_meta meta = {})
  {
    (void)impl()->plan(p, blocking(), typename B::stream_type{}, std::move(meta));
  }
  /// plan(p, s) on the channel's compute stream: the stream of the last executed forward or replay (before
  /// any, the stream the last forward was captured on). Launch the graph on that stream.
  void plan(const forward_plan& p, forward_meta m = {}) { (void)impl()->plan(p, blocking(), {}, std::move(m)); }
  /// Same as plan(); false instead of blocking / throwing when the ring, FIFO or size ring is full (no token).
  [[nodiscard]] bool try_plan(const forward_plan& p, stream_view s, forward_meta meta = {})
  {
    return impl()->plan(p, detail::when_full::refuse, s.handle(), std::move(meta));
  }
  [[nodiscard]] bool try_plan(const forward_plan& p) { return impl()->plan(p, detail::when_full::refuse, {}); }
  /// plan(p, s), then launch the graph on `s` (with capture disabled: a quiet token, then the launch).
  void replay(const ferry::backend::graph_exec<B>& g, const forward_plan& p, stream_view s, forward_meta meta = {})
  {
    impl()->produce([&] {
      impl()->prod.before_replay(s);
      (void)impl()->prod.plan(p, blocking(), s.handle(), std::move(meta));
    }, [&] { impl()->prod.arm_quiet(s.handle()); });
    impl()->guarded([&] { g.launch(s); });  // the engine's graph runs whether capture is enabled or not
  }

  // ---- consumer ----
  /// drain_mode::poll only, from one thread: acquire published_head, enqueue D2H, deliver completed
  /// entries. Returns the number of entries delivered plus copies issued by this call.
  std::size_t poll() { return impl()->guarded([&] { return impl()->drain.poll(); }); }
  /// The next completed entry when no callback was given.
  [[nodiscard]] std::optional<entry_view> try_pop() { return impl()->drain.try_pop(); }
  /// Moves up to `max` completed entries, in order, to the end of `out` (one lock); returns how many.
  std::size_t try_pop(std::vector<entry_view>& out, std::size_t max) { return impl()->drain.try_pop(out, max); }
  /// Drains every published entry (up to `timeout`), stops the drain, and reports: shutdown_error lists reserved
  /// entries never published; a user kernel that never committed (ring_ref::commit) gives invalidated_error.
  shutdown_report close(std::chrono::milliseconds timeout) { return impl()->close_checked(timeout); }
  /// close(config::timeout).
  shutdown_report close() { return close(impl()->st.cfg.timeout); }
  /// A snapshot of the channel's counters (any thread).
  [[nodiscard]] counters stats() const { return impl()->st.stats(); }
  /// The configuration the channel was created with.
  [[nodiscard]] const config& cfg() const { return impl()->st.cfg; }
  /// Whether ferry's kernels are launched programmatically (tuning::programmatic_launch, and the device
  /// and the loaded kernel code support it).
  [[nodiscard]] bool programmatic_launch() const { return impl()->st.launch.programmatic; }
  /// The device the channel was created on.
  [[nodiscard]] ferry::backend::device_id device() const { return impl()->st.dev; }
  /// Payload ring size in bytes.
  [[nodiscard]] std::uint64_t ring_bytes() const { return impl()->st.cfg.ring_bytes; }
  /// The hook schema given at construction (never null; empty: none); shared, so it may outlive the channel.
  [[nodiscard]] const std::shared_ptr<const hook_schema>& schema() const { return impl()->schema; }
  /// True after a backend call of this channel failed: later producer calls and close() throw invalidated_error
  /// naming it; storage a DMA may read is kept until the destructor, which waits for the drain stream.
  [[nodiscard]] bool invalidated() const { return impl()->st.is_failed(); }
  /// config::on_error = disable: whether capture is disabled now, and the first error that disabled it (empty:
  /// none; counters::capture_errors counts them).
  [[nodiscard]] bool capture_disabled() const { return impl()->st.capture_disabled(); }
  [[nodiscard]] std::string capture_error() const { return impl()->st.first_capture_error(); }
  /// Re-enables capture disabled by on_error = disable, between forwards (else logic_error; invalidated: its error).
  void recover() { impl()->guarded([&] { impl()->prod.recover(); }); }
  /// From the producer thread, between forwards: the next thread's producer call binds (warm-up vs step threads).
  void release_producer_thread() { impl()->guarded([&] { impl()->prod.release_thread(); }); }
  /// The first failed backend call (empty while the channel is usable).
  [[nodiscard]] std::string invalidation_reason() const { return impl()->st.failure_reason(); }

 private:
  friend struct ferry::testing::d2h_access;
  channel(config cfg, B b, sink_attachment a)
    : channel(cfg, b, std::move(a.callback), std::move(a.staging), std::move(a.schema)) {}
  [[nodiscard]] detail::when_full blocking() const { return detail::blocking_policy(impl()->st.cfg); }
  void reset() noexcept
  {
    if (!impl_) { return; }
    impl_->close_quietly();
    impl_.reset();
  }
  /// The channel's parts; a moved-from channel has none and every call on it throws logic_error.
  [[nodiscard]] detail::channel_impl<B>* impl() const
  {
    FERRY_EXPECTS(impl_ != nullptr, ferry::logic_error,
                  "d2h channel: expected a live channel, got a moved-from d2h channel (its state moved to another "
                  "channel object)");
    return impl_.get();
  }
  std::unique_ptr<detail::channel_impl<B>> impl_;
};

}  // namespace ferry::d2h
