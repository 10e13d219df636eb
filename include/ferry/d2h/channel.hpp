// SPDX-License-Identifier: Apache-2.0
// ferry::d2h::channel<B>: GPU -> CPU publication of hook payloads for one device.
//
//   producer (one thread)                 device (compute stream)                 drainer (thread or poll())
//   ---------------------                 -----------------------                 --------------------------
//   reserve ring space (CPU-known sizes)
//   launch copy kernel k (parity k%2)  -> copy payload into the ring, advance
//                                         the device cursor (slot k%2 -> k%2^1)
//   every K entries / end_forward:     -> [writer join: block barrier or stream
//                                         order] one st.release.sys of
//                                         published_head = produced
//   push entry metadata into the FIFO                                           acquire-load published_head = H
//                                                                               entries seq < H: enqueue ONE D2H
//                                                                               per contiguous range (split at the
//                                                                               wrap) on the drain stream into
//                                                                               pinned staging; record an event
//                                                                               event done: reclaim ring space,
//                                                                               deliver entry_views
//
// See docs/design/d2h.md for the ordering chain and where each step is enforced.
#pragma once

#include <ferry/backend/buffer.hpp>
#include <ferry/backend/concepts.hpp>
#include <ferry/backend/event.hpp>
#include <ferry/backend/graph.hpp>
#include <ferry/backend/grid_dependency.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/kernels.hpp>
#include <ferry/d2h/detail/launch_shape.hpp>
#include <ferry/d2h/detail/spsc_fifo.hpp>
#include <ferry/d2h/detail/staging.hpp>
#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/errors.hpp>
#include <ferry/d2h/forward_plan.hpp>
#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace ferry::d2h {

namespace detail {

/// One FIFO record: everything the drain needs, CPU-known at reservation time.
struct entry_meta {
  std::uint64_t seq{0};
  std::uint64_t start{0};     ///< virtual ring position (physical = start % ring bytes)
  std::uint64_t reserved{0};  ///< ring bytes reserved (16-byte multiple)
  std::uint64_t bytes{0};     ///< static payload size (dynamic: read from the size slot after the acquire)
  std::uint64_t slot{0};      ///< dynamic entries: index into the size ring (dyn counter % slots)
  std::uint32_t hook{0};
  bool dynamic{false};
};

/// Process-wide registry enforcing one channel per (backend, device).
inline std::mutex& registry_mutex()
{
  static std::mutex m;
  return m;
}
inline std::set<std::pair<std::string, int>>& registry()
{
  static std::set<std::pair<std::string, int>> r;
  return r;
}

template <class T>
void atomic_max(std::atomic<T>& a, T v) noexcept
{
  T cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace detail

/// Handed out by begin_write() for a user kernel that writes the entry itself through ref().
class write_ticket {
 public:
  [[nodiscard]] const ring_ref& ref() const noexcept { return ref_; }

 private:
  template <ferry::backend::backend B>
  friend class channel;
  ring_ref ref_{};
  hook_id hook_{};
  std::uint64_t bytes_{0};
  placement where_{};
  bool live_{false};
};

template <ferry::backend::backend B>
class channel {
 public:
  using backend_type = B;
  using stream_view = ferry::backend::stream_view<B>;
  /// Called on the drainer (drain thread, or the poll() caller) for every completed entry, in entry order.
  /// Keep the view to hold its staging bytes; let it go to release them. Exceptions are caught and counted.
  using callback_type = std::function<void(entry_view&&)>;

  /// Creates the channel for the backend's current device. Throws logic_error on a bad config (K = 0,
  /// ring size, managed placement without concurrentManagedAccess, a second channel on this device).
  explicit channel(config cfg, B b = B{}, callback_type cb = {}) : impl_{std::make_unique<impl>(cfg, b, std::move(cb))}
  {
    impl_->start();
  }
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;
  channel(channel&&) noexcept = default;
  channel& operator=(channel&& o) noexcept
  {
    if (this != &o) {
      reset();
      impl_ = std::move(o.impl_);
    }
    return *this;
  }
  /// Never throws. Drains every published entry (waiting up to config::timeout) and waits for in-flight
  /// copies; anything it cannot drain is reported on stderr. Call close() to get the report or an error.
  ~channel() { reset(); }

  // ---- producer (one thread, the channel's device current) -----------------------------------------
  /// Opens a forward on `s`. If `s` is being captured, the forward is recorded into a forward_plan
  /// (graph mode); otherwise entries are reserved just in time (eager mode).
  void begin_forward(stream_view s)
  {
    guarded([&] { impl_->begin_forward(s); });
  }
  /// Closes the forward: one publication (system-scope release) covering the forward's remaining
  /// entries, and the cursor normalization. Returns the plan in graph mode (empty in eager mode).
  forward_plan end_forward(stream_view s)
  {
    return guarded([&] { return impl_->end_forward(s); });
  }

  /// Copies `bytes` from device memory `src` into the ring (library copy kernel) as one entry of `hook`.
  void capture(hook_id hook, const void* src, std::uint64_t bytes, stream_view s)
  {
    guarded([&] {
      (void)impl_->capture(hook, src, bytes, nullptr, false, s, impl_->cfg.on_full == full_policy::fail_fast);
    });
  }
  /// Same; returns false instead of blocking / throwing when the ring, FIFO or size ring is full.
  [[nodiscard]] bool try_capture(hook_id hook, const void* src, std::uint64_t bytes, stream_view s)
  {
    return guarded([&] { return impl_->capture(hook, src, bytes, nullptr, false, s, true, /*nothrow_full=*/true); });
  }
  /// Dynamic entry: reserves `reserved_bytes`; the GPU-resolved size is read from device memory
  /// `actual_size` by the copy kernel (it copies min(actual, reserved) and reports actual in the size slot).
  void capture_dynamic(hook_id hook, const void* src, std::uint64_t reserved_bytes, const std::uint64_t* actual_size,
                       stream_view s)
  {
    guarded([&] {
      (void)impl_->capture(hook, src, reserved_bytes, actual_size, true, s,
                           impl_->cfg.on_full == full_policy::fail_fast);
    });
  }

  /// For a user kernel writing the entry itself: launch it with ticket.ref() (see ring_ref), then end_write().
  [[nodiscard]] write_ticket begin_write(hook_id hook, std::uint64_t reserved_bytes, stream_view s, bool dynamic = false)
  {
    return guarded([&] { return impl_->begin_write(hook, reserved_bytes, dynamic, s); });
  }
  void end_write(write_ticket&& t, stream_view s)
  {
    guarded([&] { impl_->end_write(std::move(t), s); });
  }

  /// Pre-forward planning for a graph replay: reserves ring space for every entry of `p` (blocking per
  /// config::on_full) and fills the FIFO. Launch the replay right after, on the channel's compute stream.
  void plan(const forward_plan& p)
  {
    guarded([&] { (void)impl_->plan(p, impl_->cfg.on_full == full_policy::fail_fast, false); });
  }
  [[nodiscard]] bool try_plan(const forward_plan& p)
  {
    return guarded([&] { return impl_->plan(p, true, true); });
  }
  /// plan(p), then launch the graph on `s`.
  void replay(const ferry::backend::graph_exec<B>& g, const forward_plan& p, stream_view s)
  {
    plan(p);
    guarded([&] { g.launch(s); });
  }

  // ---- consumer ------------------------------------------------------------------------------------
  /// drain_mode::poll only, from one thread: acquire published_head, enqueue D2H, deliver completed
  /// entries. Returns the number of entries delivered by this call.
  std::size_t poll()
  {
    return guarded([&] { return impl_->public_poll(); });
  }
  /// The next completed entry when no callback was given.
  [[nodiscard]] std::optional<entry_view> try_pop() { return impl_->try_pop(); }

  /// Drains every published entry (up to `timeout`), stops the drain, and reports. Throws shutdown_error
  /// when some reserved entry was never published (it lists them); nothing is dropped silently.
  shutdown_report close(std::chrono::milliseconds timeout) { return impl_->close(timeout); }
  shutdown_report close() { return impl_->close(impl_->cfg.timeout); }

  [[nodiscard]] counters stats() const { return impl_->stats(); }
  [[nodiscard]] const config& cfg() const noexcept { return impl_->cfg; }
  /// Whether ferry's kernels are launched programmatically (config::programmatic_launch, and the device
  /// and the loaded kernel code support it).
  [[nodiscard]] bool programmatic_launch() const noexcept { return impl_->programmatic; }
  [[nodiscard]] ferry::backend::device_id device() const noexcept { return impl_->dev; }
  /// Ring view with no entry (ring base/size, state), e.g. for tests and tools.
  [[nodiscard]] std::uint64_t ring_bytes() const noexcept { return impl_->cfg.ring_bytes; }
  /// True after a backend call of this channel failed (producer or drain side). Every later producer call
  /// throws invalidated_error naming the failed call, and close() throws it too. Storage a DMA may still
  /// read (ring, staging) is retained until the channel is destroyed, which waits for the drain stream.
  [[nodiscard]] bool invalidated() const noexcept { return impl_->failed.load(); }
  [[nodiscard]] std::string invalidation_reason() const { return impl_->failure_reason(); }

 private:
  struct impl;
  void reset() noexcept
  {
    if (!impl_) { return; }
    try {
      impl_->close(impl_->cfg.timeout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry: d2h channel destroyed: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "ferry: d2h channel destroyed: unknown error during close\n");
    }
    impl_.reset();
  }
  std::unique_ptr<impl> impl_;

  /// Runs a producer/poll call; a backend failure inside it invalidates the channel, then propagates.
  template <class F>
  decltype(auto) guarded(F&& f)
  {
    try {
      return std::forward<F>(f)();
    } catch (const ferry::backend_error& e) {
      impl_->fail(e.what());
      throw;
    }
  }

  // ================================================================================================
  struct impl {
    using stream_type = typename B::stream_type;
    using clock = std::chrono::steady_clock;

    struct run {
      std::size_t event{0};
      bool has_event{false};
      std::vector<detail::entry_meta> entries;
      std::vector<std::uint64_t> sizes;  // payload bytes per entry (actual for dynamic)
      std::vector<bool> overflow;
      std::uint64_t staging_start{0};
      bool has_staging{false};
      std::uint64_t bytes{0};
      std::uint64_t ring_end{0};
    };

    // -- configuration and resources --
    config cfg;
    B b;
    callback_type callback;
    ferry::backend::device_id dev{};
    std::uint64_t staging_bytes{0};
    int sm_count{1};
    bool programmatic{false};  ///< launch ferry's kernels with launch_config::programmatic (see construction)
    bool registered{false};
    ferry::backend::stream<B> drain_stream;
    ferry::backend::device_buffer<B> ring;
    ferry::backend::device_buffer<B> state_buf;
    ferry::backend::managed_buffer<B> head_managed;
    ferry::backend::mapped_buffer<B> head_mapped;
    ferry::backend::managed_buffer<B> size_ring;
    std::uint64_t* head_host{nullptr};
    std::uint64_t* head_dev{nullptr};
    std::shared_ptr<detail::staging_pool> staging;
    detail::spsc_fifo<detail::entry_meta> fifo;
    std::vector<ferry::backend::event<B>> events;
    std::vector<std::size_t> free_events;
    // config::branch_publish: batch releases run on pub_stream, forked from the producer stream by fork_ev
    // (recorded after the batch's last writer) and joined back by join_ev before any release issued on the
    // producer stream itself.
    std::optional<ferry::backend::stream<B>> pub_stream;
    std::optional<ferry::backend::event<B>> fork_ev, join_ev;

    // -- producer state (producer thread only) --
    std::thread::id owner{};
    bool owner_bound{false};
    bool in_forward{false};
    bool capturing{false};
    std::uint32_t parity{0};
    std::uint64_t unpublished{0};
    std::uint64_t head_pos{0};
    std::uint64_t dyn_next{0};
    std::uint64_t next_seq{0};
    bool write_open{false};
    bool branch_open{false};  ///< a release was enqueued on pub_stream and not yet joined back
    stream_type last_stream{};
    bool have_last_stream{false};
    forward_plan recording;

    // -- shared between producer and drainer --
    std::atomic<std::uint64_t> tail_pos{0};
    std::atomic<std::uint64_t> dyn_freed{0};
    std::mutex space_mu;
    std::condition_variable space_cv;
    std::atomic<bool> stop{false};
    std::atomic<bool> closed{false};
    std::optional<shutdown_report> final_report;
    std::mutex close_mu;

    // -- failure (any thread) --
    std::atomic<bool> failed{false};
    mutable std::mutex fail_mu;
    std::string failure;

    void fail(std::string_view what)
    {
      {
        std::lock_guard lock{fail_mu};
        if (failure.empty()) { failure = std::string{what}; }
      }
      failed.store(true);
      space_cv.notify_all();
    }
    [[nodiscard]] std::string failure_reason() const
    {
      std::lock_guard lock{fail_mu};
      return failure;
    }
    void check_not_failed(const char* what) const
    {
      if (failed.load()) [[unlikely]] {
        FERRY_FAIL(ferry::invalidated_error,
                   "d2h channel {}: expected a usable channel, got one invalidated by a failed backend call: {}",
                   what, failure_reason());
      }
    }

    // counters
    std::atomic<std::uint64_t> c_reserved{0}, c_published{0}, c_drained{0}, c_bytes{0}, c_copies{0}, c_stalls{0},
      c_high{0}, c_overflows{0}, c_cb_errors{0}, c_publishes{0};

    // -- drainer state (drain thread, or the holder of drain_mu) --
    std::mutex drain_mu;
    std::thread::id poller{};
    bool poller_bound{false};
    std::deque<run> inflight;
    /// Copies whose completion can no longer be observed (event record and stream sync failed): their
    /// ring space and staging are never reclaimed, so no DMA can read or write reused memory.
    std::vector<run> stuck;
    std::uint64_t published_seen{0};
    std::thread drain_thread;
    std::mutex ready_mu;
    std::deque<entry_view> ready;
    std::string drain_error;

    impl(config c, B be, callback_type cb)
      : cfg{c}, b{be}, callback{std::move(cb)}, dev{be.current_device()},
        staging_bytes{c.staging_bytes != 0 ? c.staging_bytes : c.ring_bytes},
        drain_stream{validate(c, be)}, fifo{c.fifo_capacity}
    {
      const auto attrs = b.attributes(dev);
      sm_count = std::max(1, attrs.sm_count);
      FERRY_EXPECTS(cfg.placement != head_placement::managed || attrs.concurrent_managed_access, ferry::logic_error,
                    "d2h channel on {} device {} ({}): published_head placement 'managed' expected "
                    "concurrentManagedAccess == 1, got 0; use head_placement::pinned_mapped",
                    B::name(), dev.value, attrs.name);
      {
        std::lock_guard lock{detail::registry_mutex()};
        const auto key = std::make_pair(std::string{B::name()}, dev.value);
        FERRY_EXPECTS(detail::registry().count(key) == 0, ferry::logic_error,
                      "d2h channel: expected one channel per device, got a second channel for {} device {}", B::name(),
                      dev.value);
        detail::registry().insert(key);
        registered = true;
      }
      try {
        ring = ferry::backend::device_buffer<B>{cfg.ring_bytes, b};
        state_buf = ferry::backend::device_buffer<B>{sizeof(device_state), b};
        b.memset_async(state_buf.data(), 0, sizeof(device_state), drain_stream.handle());
        // Coalesced drain copies span the alignment padding between entries; give those bytes a defined
        // value once, so no D2H ever reads memory nothing wrote (compute-sanitizer initcheck stays clean).
        b.memset_async(ring.data(), 0, cfg.ring_bytes, drain_stream.handle());
        if (cfg.placement == head_placement::managed) {
          head_managed = ferry::backend::managed_buffer<B>{detail::cache_line, b};  // its own cache line
          head_managed.advise(ferry::backend::mem_advice::preferred_location_host, dev);
          head_managed.advise(ferry::backend::mem_advice::accessed_by_device, dev);
          head_host = head_managed.template as<std::uint64_t>();
          head_dev = head_host;
        } else {
          head_mapped = ferry::backend::mapped_buffer<B>{detail::cache_line, b};
          head_host = head_mapped.template as<std::uint64_t>();
          head_dev = head_mapped.template device_as<std::uint64_t>();
        }
        ferry::backend::host_store_release(head_host, 0);
        if (cfg.size_slots > 0) {
          size_ring = ferry::backend::managed_buffer<B>{align_up(cfg.size_slots * 8ULL, detail::cache_line), b};
          size_ring.advise(ferry::backend::mem_advice::preferred_location_host, dev);
          size_ring.advise(ferry::backend::mem_advice::accessed_by_device, dev);
        }
        auto pinned = std::make_shared<ferry::backend::pinned_buffer<B>>(staging_bytes, b);
        auto* base = static_cast<std::byte*>(pinned->data());
        staging = std::make_shared<detail::staging_pool>(base, staging_bytes, std::shared_ptr<void>(pinned, pinned.get()));
        if (cfg.branch_publish) {
          pub_stream.emplace(b);
          fork_ev.emplace(b, ferry::backend::event_flags::disable_timing);
          join_ev.emplace(b, ferry::backend::event_flags::disable_timing);
        }
        events.reserve(cfg.max_copies_in_flight);
        for (std::uint32_t i = 0; i < cfg.max_copies_in_flight; ++i) {
          events.emplace_back(b, ferry::backend::event_flags::disable_timing);
          free_events.push_back(i);
        }
        // Load every kernel the channel launches now: a lazy module load at a first launch would wait for
        // kernels already running on the device (see backend preload).
        const int arch = std::min({b.preload(detail::publish_head_kernel(typename B::tag{})),
                                   b.preload(detail::copy_entry_publish_kernel(typename B::tag{})),
                                   b.preload(detail::copy_entry_kernel(typename B::tag{}))});
        // Programmatic launch only where the device and the code that will run both support it.
        programmatic =
          cfg.programmatic_launch && ferry::backend::programmatic_launch_ok(attrs.compute_capability_major, arch);
        drain_stream.synchronize();  // the zeroed state block is in place before any kernel reads it
      } catch (...) {
        unregister();
        throw;
      }
    }

    static B validate(const config& c, const B& b)
    {
      FERRY_EXPECTS(c.publish_every >= 1, ferry::logic_error,
                    "d2h channel: publish_every (K) expected >= 1, got {}", c.publish_every);
      FERRY_EXPECTS(c.ring_bytes >= entry_alignment && c.ring_bytes % entry_alignment == 0, ferry::logic_error,
                    "d2h channel: ring_bytes expected a non-zero multiple of {}, got {}", entry_alignment, c.ring_bytes);
      FERRY_EXPECTS(c.staging_bytes == 0 || c.staging_bytes >= entry_alignment, ferry::logic_error,
                    "d2h channel: staging_bytes expected 0 (= ring_bytes) or >= {}, got {}", entry_alignment,
                    c.staging_bytes);
      FERRY_EXPECTS(c.fifo_capacity >= 1, ferry::logic_error, "d2h channel: fifo_capacity expected >= 1, got {}",
                    c.fifo_capacity);
      FERRY_EXPECTS(c.max_copies_in_flight >= 1, ferry::logic_error,
                    "d2h channel: max_copies_in_flight expected >= 1, got {}", c.max_copies_in_flight);
      return b;
    }

    void unregister() noexcept
    {
      if (!registered) { return; }
      std::lock_guard lock{detail::registry_mutex()};
      detail::registry().erase(std::make_pair(std::string{B::name()}, dev.value));
      registered = false;
    }

    void start()
    {
      if (cfg.drain == drain_mode::thread) {
        drain_thread = std::thread([this] { drain_loop(); });
      }
    }

    ~impl()
    {
      stop.store(true);
      if (drain_thread.joinable()) { drain_thread.join(); }
      try {
        if (pub_stream) { pub_stream->synchronize(); }  // nor the state block under a queued release
        drain_stream.synchronize();  // never free the ring or staging under a queued copy
      } catch (...) {
      }
      unregister();
    }

    // ============================== producer ==============================
    void check_producer(stream_view s, const char* what)
    {
      const auto me = std::this_thread::get_id();
      if (!owner_bound) {
        owner = me;
        owner_bound = true;
      }
      FERRY_EXPECTS(owner == me, ferry::logic_error,
                    "d2h channel {}: expected the producer thread that made the first producer call, got another "
                    "thread (one producer thread per channel)",
                    what);
      const auto cur = b.current_device();
      FERRY_EXPECTS(cur == dev, ferry::logic_error, "d2h channel {}: expected device {} current, got device {}", what,
                    dev.value, cur.value);
      FERRY_EXPECTS(!closed.load(), ferry::logic_error, "d2h channel {}: expected an open channel, got a closed one",
                    what);
      check_not_failed(what);
      last_stream = s.handle();
      have_last_stream = true;
    }

    [[nodiscard]] ring_ref make_ref(std::uint64_t reserved, bool dynamic) const noexcept
    {
      ring_ref r;
      r.ring = static_cast<std::byte*>(ring.data());
      r.ring_bytes = cfg.ring_bytes;
      r.state = state_buf.template as<device_state>();
      r.size_slots = cfg.size_slots > 0 ? size_ring.template device_as<std::uint64_t>() : nullptr;
      r.size_slot_count = cfg.size_slots;
      r.reserved = reserved;
      r.parity = parity;
      r.dynamic = dynamic ? 1U : 0U;
      return r;
    }

    void begin_forward(stream_view s)
    {
      check_producer(s, "begin_forward");
      FERRY_EXPECTS(!in_forward, ferry::logic_error,
                    "d2h channel begin_forward: expected no open forward, got begin_forward twice");
      capturing = b.stream_is_capturing(s.handle());
      in_forward = true;
      parity = 0;
      unpublished = 0;
      if (capturing) {
        recording = forward_plan{};
        recording.owner_ = this;
      }
    }

    forward_plan end_forward(stream_view s)
    {
      check_producer(s, "end_forward");
      FERRY_EXPECTS(in_forward, ferry::logic_error,
                    "d2h channel end_forward: expected an open forward, got end_forward without begin_forward");
      FERRY_EXPECTS(!write_open, ferry::logic_error,
                    "d2h channel end_forward: expected no open begin_write, got one (call end_write first)");
      const bool cap_now = b.stream_is_capturing(s.handle());
      FERRY_EXPECTS(cap_now == capturing, ferry::logic_error,
                    "d2h channel end_forward: expected the stream's capture state as at begin_forward ({}), got {}",
                    capturing, cap_now);
      // The forward boundary: one release covering every entry since the last one, and slot[0] = slot[parity].
      launch_publish(s.handle(), unpublished, parity);
      unpublished = 0;
      parity = 0;
      in_forward = false;
      if (capturing) {
        capturing = false;
        return std::exchange(recording, forward_plan{});
      }
      return forward_plan{};
    }

    /// A release on the producer stream `s` (the forward boundary, an eager flush, close): stream order after
    /// every writer enqueued on `s` is the join. An open branch is joined back first (join_ev recorded on
    /// pub_stream, waited by `s`), so this release also follows every branch release: published_head and
    /// `produced` are only ever advanced by releases in one chain.
    void launch_publish(stream_type s, std::uint64_t n, std::uint32_t normalize)
    {
      if (branch_open) {
        join_ev->record(pub_stream->view());
        b.stream_wait_event(s, join_ev->handle());
        branch_open = false;
      }
      detail::head_args a{state_buf.template as<device_state>(), head_dev, n, normalize};
      b.launch(detail::publish_head_kernel(typename B::tag{}), ferry::backend::launch_config{{1}, {1}, 0, programmatic}, s,
               a);
      c_publishes.fetch_add(1, std::memory_order_relaxed);
    }

    /// A batch release on the branch (config::branch_publish): fork_ev recorded on `s` after the batch's
    /// last writer, pub_stream waits for it (that wait is the writer join: every kernel enqueued on `s`
    /// before the record has completed), then the 1-thread release. Releases on pub_stream follow each
    /// other in stream order. Launched plainly: the kernel ahead of it on pub_stream is not its only
    /// dependency.
    void launch_branch_publish(stream_type s, std::uint64_t n)
    {
      if (cfg.debug != debug_fault::branch_publish_without_fork) {
        b.event_record(fork_ev->handle(), s);
        fork_ev->wait(pub_stream->view());
      }
      detail::head_args a{state_buf.template as<device_state>(), head_dev, n, 0};
      b.launch(detail::publish_head_kernel(typename B::tag{}), ferry::backend::launch_config{{1}, {1}, 0, false},
               pub_stream->handle(), a);
      branch_open = true;
      c_publishes.fetch_add(1, std::memory_order_relaxed);
    }

    void check_entry(hook_id hook, std::uint64_t bytes, bool dynamic, const char* what) const
    {
      FERRY_EXPECTS(bytes > 0, ferry::logic_error, "d2h channel {}: hook {} expected an entry of > 0 bytes, got 0",
                    what, hook.value);
      const std::uint64_t reserved = align_up(bytes, entry_alignment);
      const std::uint64_t limit = std::min<std::uint64_t>(cfg.ring_bytes, staging_bytes);
      FERRY_EXPECTS(reserved <= limit, ferry::logic_error,
                    "d2h channel {}: hook {} expected an entry of at most {} bytes (ring {} / staging {}), got {}",
                    what, hook.value, limit, cfg.ring_bytes, staging_bytes, bytes);
      FERRY_EXPECTS(!dynamic || cfg.size_slots > 0, ferry::logic_error,
                    "d2h channel {}: hook {} is dynamic: expected config::size_slots > 0, got 0", what, hook.value);
      FERRY_EXPECTS(in_forward, ferry::logic_error,
                    "d2h channel {}: hook {} expected inside begin_forward/end_forward, got no open forward", what,
                    hook.value);
    }

    /// Does `n_entries` more entries ending at virtual position `end` (with `n_dyn` dynamic) fit?
    [[nodiscard]] bool fits(std::uint64_t end, std::size_t n_entries, std::uint64_t n_dyn) const noexcept
    {
      // `end - tail` counts the wrap padding the new entries skip. When the ring is empty (every reserved
      // byte reclaimed) one entry always fits (reserved <= ring_bytes is checked): its padding holds no
      // data, and without this an entry larger than the reclaimed prefix could never be placed.
      const std::uint64_t tail = tail_pos.load(std::memory_order_acquire);
      const bool ring_ok = end - tail <= cfg.ring_bytes || (tail == head_pos && n_entries == 1);
      const bool fifo_ok = fifo.free_slots() >= n_entries;
      const bool dyn_ok = n_dyn == 0 || dyn_next + n_dyn - dyn_freed.load(std::memory_order_acquire) <= cfg.size_slots;
      return ring_ok && fifo_ok && dyn_ok;
    }

    /// Waits until `fits` (per policy). Returns false when full and fail-fast with nothrow_full.
    template <class Who>
    bool wait_for_space(std::uint64_t end, std::size_t n_entries, std::uint64_t n_dyn, bool fail_fast,
                        bool nothrow_full, std::optional<stream_type> flush_stream, Who&& who_fn)
    {
      if (fits(end, n_entries, n_dyn)) [[likely]] { return true; }
      const std::string who = who_fn();
      c_stalls.fetch_add(1, std::memory_order_relaxed);
      if (fail_fast) {
        if (nothrow_full) { return false; }
        FERRY_FAIL(ferry::out_of_memory,
                   "d2h channel: {}: ring full (fail_fast): expected {} free bytes, {} FIFO slots and {} size slots, "
                   "got {} of {} ring bytes in use, {} FIFO slots free",
                   who, end - head_pos, n_entries, n_dyn, head_pos - tail_pos.load(), cfg.ring_bytes, fifo.free_slots());
      }
      // Entries launched but not yet published cannot drain: publish them now (eager mode only).
      if (flush_stream && unpublished > 0) {
        launch_publish(*flush_stream, unpublished, 0);
        unpublished = 0;
      }
      const auto deadline = clock::now() + cfg.timeout;
      while (!fits(end, n_entries, n_dyn)) {
        check_not_failed(who.c_str());
        if (clock::now() >= deadline) {
          FERRY_FAIL(ferry::timeout_error,
                     "d2h channel: {}: expected ring space within {} ms, got {} of {} ring bytes still in use and {} "
                     "FIFO slots free (is the consumer releasing entries? is the drain running?)",
                     who, cfg.timeout.count(), head_pos - tail_pos.load(), cfg.ring_bytes, fifo.free_slots());
        }
        if (cfg.drain == drain_mode::poll) {
          std::unique_lock lock{drain_mu};
          if (drain_step() == 0) {
            lock.unlock();
            std::this_thread::sleep_for(std::chrono::microseconds(50));
          }
        } else {
          std::unique_lock lock{space_mu};
          space_cv.wait_for(lock, std::chrono::milliseconds(1));
        }
      }
      return true;
    }

    /// Launch shape (config: copy_block_threads, copy_vecs_per_thread, fused_copy_max_bytes,
    /// single_block_copy_max_bytes). `fuse`: one block (the kernel that may fuse the release); else
    /// enough blocks for one pass over the entry, at most enough to fill every SM.
    void launch_copy(detail::copy_args a, std::uint64_t bytes, bool fuse, stream_type s)
    {
      const detail::launch_shape sh = detail::copy_launch_shape(cfg, bytes, fuse, sm_count);
      a.vecs_per_thread = sh.vecs_per_thread;
      a.debug_skip_wait = cfg.debug == debug_fault::programmatic_without_wait ? 1U : 0U;
      const ferry::backend::launch_config lc{{sh.blocks}, {sh.threads}, 0, programmatic};
      if (sh.one_block) {
        b.launch(detail::copy_entry_publish_kernel(typename B::tag{}), lc, s, a);
      } else {
        b.launch(detail::copy_entry_kernel(typename B::tag{}), lc, s, a);
      }
    }

    /// Records one placed entry on the CPU side (after its writer was launched successfully).
    void commit_entry(hook_id hook, placement p, std::uint64_t reserved, std::uint64_t bytes, bool dynamic,
                      stream_type s, bool publish_fused)
    {
      const std::uint64_t after = unpublished + 1;
      if (capturing) {
        recording.entries_.push_back(plan_entry{hook, reserved, bytes, dynamic});
      } else {
        detail::entry_meta m{next_seq, p.start, reserved, bytes, dynamic ? dyn_next : 0, hook.value, dynamic};
        const bool pushed = fifo.try_push(m);
        (void)pushed;  // space was checked in wait_for_space; the producer is the only pusher
        ++next_seq;
        head_pos = p.end;
        if (dynamic) { ++dyn_next; }
        c_reserved.fetch_add(1, std::memory_order_relaxed);
        detail::atomic_max(c_high, head_pos - tail_pos.load(std::memory_order_relaxed));
      }
      parity ^= 1U;
      unpublished = after;
      if (after >= cfg.publish_every) {
        if (publish_fused) {
          c_publishes.fetch_add(1, std::memory_order_relaxed);
        } else if (cfg.branch_publish) {
          launch_branch_publish(s, after);  // the fork event after the copy kernel is the join
        } else {
          launch_publish(s, after, 0);  // stream order after the copy kernel is the join
        }
        unpublished = 0;
      }
    }

    bool capture(hook_id hook, const void* src, std::uint64_t bytes, const std::uint64_t* actual, bool dynamic,
                 stream_view s, bool fail_fast, bool nothrow_full = false)
    {
      check_producer(s, dynamic ? "capture_dynamic" : "capture");
      check_entry(hook, bytes, dynamic, dynamic ? "capture_dynamic" : "capture");
      FERRY_EXPECTS(!write_open, ferry::logic_error,
                    "d2h channel capture: hook {} expected no open begin_write, got one", hook.value);
      FERRY_EXPECTS(src != nullptr && (!dynamic || actual != nullptr), ferry::logic_error,
                    "d2h channel capture: hook {} expected non-null source{}, got null", hook.value,
                    dynamic ? " and size pointer" : "");
      const std::uint64_t reserved = align_up(bytes, entry_alignment);
      placement p{};
      if (!capturing) {
        p = place(head_pos, reserved, cfg.ring_bytes);
        if (!wait_for_space(p.end, 1, dynamic ? 1 : 0, fail_fast, nothrow_full, s.handle(),
                            [&] { return ferry::detail::format("hook {} ({} bytes)", hook.value, bytes); })) {
          return false;
        }
      }
      // Branch releases never fuse into a copy kernel (the release would sit on the producer stream).
      const bool publish_now = unpublished + 1 >= cfg.publish_every && !cfg.branch_publish;
      const bool fuse = detail::one_block_copy(cfg, reserved, publish_now);
      detail::copy_args a{make_ref(reserved, dynamic), static_cast<const std::byte*>(src), bytes, actual,
                          fuse && publish_now ? unpublished + 1 : 0, head_dev};
      launch_copy(a, bytes, fuse, s.handle());
      commit_entry(hook, p, reserved, bytes, dynamic, s.handle(), fuse && publish_now);
      return true;
    }

    write_ticket begin_write(hook_id hook, std::uint64_t reserved_bytes, bool dynamic, stream_view s)
    {
      check_producer(s, "begin_write");
      check_entry(hook, reserved_bytes, dynamic, "begin_write");
      FERRY_EXPECTS(!write_open, ferry::logic_error,
                    "d2h channel begin_write: hook {} expected no open begin_write, got one", hook.value);
      const std::uint64_t reserved = align_up(reserved_bytes, entry_alignment);
      write_ticket t;
      if (!capturing) {
        t.where_ = place(head_pos, reserved, cfg.ring_bytes);
        (void)wait_for_space(t.where_.end, 1, dynamic ? 1 : 0, cfg.on_full == full_policy::fail_fast, false, s.handle(),
                             [&] { return ferry::detail::format("hook {} ({} bytes)", hook.value, reserved_bytes); });
      }
      t.ref_ = make_ref(reserved, dynamic);
      t.hook_ = hook;
      t.bytes_ = reserved_bytes;
      t.live_ = true;
      write_open = true;
      return t;
    }

    void end_write(write_ticket&& t, stream_view s)
    {
      check_producer(s, "end_write");
      FERRY_EXPECTS(t.live_ && write_open, ferry::logic_error,
                    "d2h channel end_write: hook {} expected a ticket from begin_write, got a used or empty one",
                    t.hook_.value);
      write_open = false;
      t.live_ = false;
      commit_entry(t.hook_, t.where_, t.ref_.reserved, t.bytes_, t.ref_.dynamic != 0, s.handle(), false);
    }

    bool plan(const forward_plan& p, bool fail_fast, bool nothrow_full)
    {
      const auto me = std::this_thread::get_id();
      if (!owner_bound) {
        owner = me;
        owner_bound = true;
      }
      FERRY_EXPECTS(owner == me, ferry::logic_error,
                    "d2h channel plan: expected the producer thread, got another thread (one producer thread per channel)");
      const auto cur = b.current_device();
      FERRY_EXPECTS(cur == dev, ferry::logic_error, "d2h channel plan: expected device {} current, got device {}",
                    dev.value, cur.value);
      FERRY_EXPECTS(!closed.load(), ferry::logic_error, "d2h channel plan: expected an open channel, got a closed one");
      check_not_failed("plan");
      FERRY_EXPECTS(p.owner() == this, ferry::logic_error,
                    "d2h channel plan: expected a plan captured by this channel, got {}",
                    p.owner() == nullptr ? "an empty plan" : "a plan of another channel");
      FERRY_EXPECTS(!in_forward, ferry::logic_error,
                    "d2h channel plan: expected no open eager forward, got one (plan between forwards)");
      FERRY_EXPECTS(p.size() <= fifo.capacity(), ferry::logic_error,
                    "d2h channel plan: expected at most fifo_capacity = {} entries per forward, got {}",
                    fifo.capacity(), p.size());
      std::vector<placement> where;
      where.reserve(p.size());
      std::uint64_t pos = head_pos;
      std::uint64_t n_dyn = 0;
      for (const auto& e : p.entries()) {
        where.push_back(place(pos, e.reserved, cfg.ring_bytes));
        pos = where.back().end;
        n_dyn += e.dynamic ? 1 : 0;
      }
      FERRY_EXPECTS(pos - head_pos <= cfg.ring_bytes, ferry::logic_error,
                    "d2h channel plan: expected a forward of at most ring_bytes = {} (with wrap padding), got {}",
                    cfg.ring_bytes, pos - head_pos);
      FERRY_EXPECTS(n_dyn <= cfg.size_slots, ferry::logic_error,
                    "d2h channel plan: expected at most size_slots = {} dynamic entries per forward, got {}",
                    cfg.size_slots, n_dyn);
      if (!wait_for_space(pos, p.size(), n_dyn, fail_fast, nothrow_full, std::nullopt,
                          [&] { return ferry::detail::format("plan of {} entries", p.size()); })) {
        return false;
      }
      for (std::size_t i = 0; i < p.size(); ++i) {
        const auto& e = p.entries()[i];
        detail::entry_meta m{next_seq++, where[i].start, e.reserved, e.bytes, e.dynamic ? dyn_next : 0,
                             e.hook.value, e.dynamic};
        (void)fifo.try_push(m);
        if (e.dynamic) { ++dyn_next; }
      }
      head_pos = pos;
      c_reserved.fetch_add(p.size(), std::memory_order_relaxed);
      detail::atomic_max(c_high, head_pos - tail_pos.load(std::memory_order_relaxed));
      return true;
    }

    // ============================== drainer ==============================
    void drain_loop()
    {
      try {
        b.set_device(dev);
      } catch (...) {
      }
      unsigned idle = 0;
      while (!stop.load(std::memory_order_acquire)) {
        std::size_t n = 0;
        {
          std::lock_guard lock{drain_mu};
          n = drain_step();
        }
        if (n > 0) {
          idle = 0;
        } else if (++idle < 64) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(cfg.drain_idle_sleep);
        }
      }
    }

    std::size_t public_poll()
    {
      FERRY_EXPECTS(cfg.drain == drain_mode::poll, ferry::logic_error,
                    "d2h channel poll: expected drain_mode::poll, got drain_mode::thread (the channel's thread drains)");
      const auto me = std::this_thread::get_id();
      std::lock_guard lock{drain_mu};
      if (!poller_bound) {
        poller = me;
        poller_bound = true;
      }
      FERRY_EXPECTS(poller == me, ferry::logic_error,
                    "d2h channel poll: expected the thread that polled first, got another thread (one poller per channel)");
      return drain_step();
    }

    std::optional<entry_view> try_pop()
    {
      std::lock_guard lock{ready_mu};
      if (ready.empty()) { return std::nullopt; }
      entry_view v = std::move(ready.front());
      ready.pop_front();
      return v;
    }

    /// One drain pass (caller holds drain_mu). Returns entries delivered plus copies issued (progress).
    std::size_t drain_step()
    {
      std::size_t progress = 0;
      try {
        progress += complete_finished();
        // The acquire: everything the GPU wrote before its release of `h` is visible to this thread, and
        // so to the copies this same thread enqueues after this point.
        const std::uint64_t h = cfg.debug == debug_fault::drain_without_acquire
                                  ? ~std::uint64_t{0}
                                  : ferry::backend::host_load_acquire(head_host);
        if (h != ~std::uint64_t{0} && h > published_seen) {
          published_seen = h;
          c_published.store(h, std::memory_order_relaxed);
        }
        progress += issue_copies(h);
        progress += complete_finished();
      } catch (const std::exception& e) {
        // A failed enqueue left nothing queued (the staging was released); the drain retries, so what was
        // published is still delivered when the backend recovers, but the channel is invalidated.
        if (drain_error.empty()) {
          drain_error = e.what();
          std::fprintf(stderr, "ferry: d2h drain error (channel invalidated; drain retries): %s\n", e.what());
        }
        fail(e.what());
      }
      return progress;
    }

    std::uint64_t read_size_slot(std::uint64_t slot) const noexcept
    {
      // Written by the GPU before the release we acquired: a plain read is ordered after it.
      return size_ring.template as<std::uint64_t>()[slot % cfg.size_slots];
    }

    std::size_t issue_copies(std::uint64_t h)
    {
      std::size_t issued = 0;
      fifo.refresh();
      const std::uint64_t R = cfg.ring_bytes;
      while (!free_events.empty()) {
        const std::size_t avail = fifo.readable();
        if (avail == 0 || fifo.peek(0).seq >= h) { break; }
        run r;
        for (std::size_t i = 0; i < avail; ++i) {
          const detail::entry_meta& e = fifo.peek(i);
          if (e.seq >= h) { break; }
          std::uint64_t len = e.bytes;
          bool over = false;
          if (e.dynamic) {
            len = read_size_slot(e.slot);
            over = len > e.reserved;
          }
          if (i > 0) {
            const auto& prev = r.entries.back();
            const bool contiguous = e.start == prev.start + prev.reserved && e.start % R != 0;
            if (!contiguous || prev.dynamic || over || r.overflow.back()) { break; }
          }
          if (over) {  // rejected: its own run, no copy, no staging
            r.entries.push_back(e);
            r.sizes.push_back(len);
            r.overflow.push_back(true);
            break;
          }
          const std::uint64_t run_bytes = i == 0 ? len : (e.start - r.entries.front().start) + len;
          if (!staging->can_alloc(run_bytes)) { break; }
          r.entries.push_back(e);
          r.sizes.push_back(len);
          r.overflow.push_back(false);
          r.bytes = run_bytes;
          if (e.dynamic) { break; }
        }
        if (r.entries.empty()) { break; }  // staging full: the consumer has not released views yet
        const auto& last = r.entries.back();
        r.ring_end = last.start + last.reserved;
        const std::size_t ev = free_events.back();
        if (!r.overflow.front()) {
          const auto s = staging->alloc(r.bytes, static_cast<std::uint32_t>(r.entries.size()));
          r.staging_start = *s;  // can_alloc said yes and only this thread allocates
          r.has_staging = true;
          try {
            if (cfg.debug_copy_delay.count() > 0) { debug_delay(); }
            // The D2H is enqueued by the thread that performed the acquire, after it: the copy reads
            // payload bytes ordered before the GPU's release.
            b.memcpy_async(staging->base() + r.staging_start % staging->bytes(),
                           static_cast<const std::byte*>(ring.data()) + r.entries.front().start % R, r.bytes,
                           ferry::backend::memcpy_kind::device_to_host, drain_stream.handle());
          } catch (...) {
            for (std::size_t k = 0; k < r.entries.size(); ++k) { staging->release(r.staging_start); }
            throw;
          }
          c_copies.fetch_add(1, std::memory_order_relaxed);
        }
        std::uint64_t n_dyn = 0;
        for (const auto& e : r.entries) { n_dyn += e.dynamic ? 1 : 0; }
        fifo.pop(r.entries.size());
        if (n_dyn > 0) { dyn_freed.fetch_add(n_dyn, std::memory_order_acq_rel); }  // sizes consumed
        try {
          events[ev].record(drain_stream.view());
          r.event = ev;
          r.has_event = true;
          free_events.pop_back();
        } catch (const std::exception& e) {
          fail(e.what());
          try {
            drain_stream.synchronize();  // completion without an event
          } catch (...) {
            // Completion unobservable: never reclaim this run's ring space or staging.
            stuck.push_back(std::move(r));
            throw;
          }
          r.has_event = false;
        }
        if (cfg.debug == debug_fault::reclaim_before_copy_complete) { reclaim(r.ring_end); }
        inflight.push_back(std::move(r));
        ++issued;
      }
      return issued;
    }

    void debug_delay()
    {
      if constexpr (requires(const B& be) { be.host_func(typename B::stream_type{}, std::function<void()>{}); }) {
        const auto d = cfg.debug_copy_delay;
        b.host_func(drain_stream.handle(), [d] { std::this_thread::sleep_for(d); });
      }
    }

    void reclaim(std::uint64_t end)
    {
      if (end > tail_pos.load(std::memory_order_relaxed)) {
        {
          std::lock_guard lock{space_mu};
          tail_pos.store(end, std::memory_order_release);
        }
        space_cv.notify_all();
      }
    }

    std::size_t complete_finished()
    {
      std::size_t delivered = 0;
      while (!inflight.empty()) {
        run& r = inflight.front();
        if (r.has_event && !events[r.event].query()) { break; }
        if (r.has_event) { free_events.push_back(r.event); }
        // The copy completed: its ring bytes may be reused.
        reclaim(r.ring_end);
        run done = std::move(r);
        inflight.pop_front();
        std::uint64_t off = 0;
        for (std::size_t i = 0; i < done.entries.size(); ++i) {
          const auto& e = done.entries[i];
          entry_view::parts p{};
          p.hook = hook_id{e.hook};
          p.seq = entry_seq{e.seq};
          p.reserved = e.reserved;
          p.size = done.sizes[i];
          if (done.overflow[i]) {
            p.status = entry_status::size_overflow;
            c_overflows.fetch_add(1, std::memory_order_relaxed);
          } else {
            off = e.start - done.entries.front().start;
            p.pool = staging;
            p.region = done.staging_start;
            p.data = staging->base() + done.staging_start % staging->bytes() + off;
            p.status = entry_status::ok;
          }
          deliver(entry_view{std::move(p)});
          ++delivered;
        }
        c_bytes.fetch_add(done.bytes, std::memory_order_relaxed);
        c_drained.fetch_add(done.entries.size(), std::memory_order_release);
      }
      return delivered;
    }

    void deliver(entry_view&& v)
    {
      if (callback) {
        try {
          callback(std::move(v));
        } catch (...) {
          c_cb_errors.fetch_add(1, std::memory_order_relaxed);
        }
      } else {
        std::lock_guard lock{ready_mu};
        ready.push_back(std::move(v));
      }
    }

    [[nodiscard]] counters stats() const
    {
      counters c;
      c.entries_reserved = c_reserved.load();
      c.entries_published = c_published.load();
      c.entries_drained = c_drained.load();
      c.bytes_drained = c_bytes.load();
      c.copies = c_copies.load();
      c.stalls = c_stalls.load();
      c.high_watermark = c_high.load();
      c.size_overflows = c_overflows.load();
      c.callback_errors = c_cb_errors.load();
      c.publishes = c_publishes.load();
      return c;
    }

    // ============================== shutdown ==============================
    shutdown_report close(std::chrono::milliseconds timeout)
    {
      std::lock_guard close_lock{close_mu};
      if (final_report) {
        throw_if_failed(*final_report);
        return *final_report;
      }
      shutdown_report rep;
      // An eager forward left open: publish what it launched so nothing launched stays hidden.
      if (in_forward) {
        rep.forward_open = true;
        if (!capturing && unpublished > 0 && have_last_stream) {
          try {
            check_not_failed("close");
            launch_publish(last_stream, unpublished, 0);
            unpublished = 0;
          } catch (const std::exception& e) {
            fail(e.what());
          }
        }
      }
      closed.store(true);
      const auto deadline = clock::now() + timeout;
      const auto outstanding = [&] { return c_reserved.load() - c_drained.load(std::memory_order_acquire); };
      while (outstanding() > 0 && clock::now() < deadline) {
        if (cfg.drain == drain_mode::poll || !drain_thread.joinable()) {
          std::lock_guard lock{drain_mu};
          if (drain_step() == 0) { std::this_thread::sleep_for(std::chrono::microseconds(100)); }
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
      stop.store(true, std::memory_order_release);
      if (drain_thread.joinable()) { drain_thread.join(); }
      {
        // Final pass: every published entry is copied and delivered; in-flight copies complete first.
        std::lock_guard lock{drain_mu};
        for (int pass = 0; pass < 1000; ++pass) {
          try {
            drain_stream.synchronize();
          } catch (const std::exception& e) {
            fail(e.what());  // an asynchronous copy error: what was delivered may be incomplete
          }
          const std::size_t n = drain_step();
          if (n == 0 && inflight.empty()) { break; }
        }
        fifo.refresh();
        const std::size_t left = fifo.readable();
        // The final drain pass above acquired the head: an entry below it was published and is left only
        // because staging stayed full (views not released); the others were never published.
        const std::uint64_t head = ferry::backend::host_load_acquire(head_host);
        for (std::size_t i = 0; i < left; ++i) {
          const auto& e = fifo.peek(i);
          if (e.seq < head) {
            rep.undrained.push_back(entry_seq{e.seq});
          } else {
            rep.unpublished.push_back(entry_seq{e.seq});
            rep.unpublished_hooks.push_back(hook_id{e.hook});
          }
        }
      }
      rep.delivered = c_drained.load();
      {
        std::lock_guard lock{ready_mu};
        rep.pending_pop = ready.size();
      }
      final_report = rep;
      throw_if_failed(rep);
      if (!rep.clean()) { throw shutdown_error(rep); }
      return rep;
    }

    void throw_if_failed(const shutdown_report& rep) const
    {
      if (!failed.load()) { return; }
      FERRY_FAIL(ferry::invalidated_error,
                 "d2h channel close: expected no failed backend call, got: {}; {} of {} reserved entries delivered, "
                 "{} never published, {} copies with unobservable completion (ring and staging retained)",
                 failure_reason(), rep.delivered, c_reserved.load(), rep.unpublished.size(), stuck.size());
    }
  };
};

}  // namespace ferry::d2h
