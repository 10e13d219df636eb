// SPDX-License-Identifier: Apache-2.0
// The state every part of a channel shares: configuration, device resources (ring, state block,
// published_head, size ring, staging), the FIFO, the ring tail, the failure flag and the counters; the
// launch policy (launch_policy.hpp) and the config's validation sit beside them.
// Producer (producer.hpp), release chain (release_chain.hpp) and drainer (drainer.hpp) each hold a reference;
// channel_impl.hpp creates it and tears it down. Who writes what:
//   producer thread   FIFO push side, dyn counter (in producer)
//   drainer           FIFO pop side, tail_pos (reclaim), dyn_freed
//   any thread        failure (fail), counters (relaxed atomics)
#pragma once

#include <ferry/backend/buffer.hpp>
#include <ferry/backend/concepts.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/d2h/detail/entry_meta.hpp>
#include <ferry/d2h/detail/launch_policy.hpp>
#include <ferry/d2h/detail/forward_log.hpp>
#include <ferry/d2h/detail/spsc_fifo.hpp>
#include <ferry/d2h/detail/staging.hpp>
#include <ferry/d2h/detail/test_hooks.hpp>
#include <ferry/d2h/errors.hpp>
#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/row_selection.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/error.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
struct channel_state {
  using stream_type = typename B::stream_type;

  channel_state(config c, B be)
    : cfg{derive(validate(c))}, b{be}, dev{be.current_device()},
      staging_bytes{c.staging_bytes != 0 ? c.staging_bytes : c.ring_bytes}, drain_stream{be}, fifo{c.fifo_capacity}
  {
  }

  // -- configuration and resources (set at construction, read-only after) --
  config cfg;
  B b;
  ferry::backend::device_id dev{};
  std::uint64_t staging_bytes{0};
  int sm_count{1};
  ferry::backend::stream<B> drain_stream;
  ferry::backend::device_buffer<B> ring;
  ferry::backend::device_buffer<B> state_buf;
  ferry::backend::device_buffer<B> bounce;  ///< bounce capture's slots (tuning::bounce_capture_max_bytes)
  std::uint64_t bounce_slot{0};             ///< bytes per slot (0: bounce off); slot i = batch position i
  ferry::backend::managed_buffer<B> head_managed;
  ferry::backend::mapped_buffer<B> head_mapped;
  /// The size ring (tuning::size_slots slots; derived: one per FIFO slot), placed as published_head is.
  ferry::backend::managed_buffer<B> size_managed;
  ferry::backend::mapped_buffer<B> size_mapped;
  std::uint64_t* head_host{nullptr};
  std::uint64_t* head_dev{nullptr};
  std::uint64_t* size_host{nullptr};
  std::uint64_t* size_dev{nullptr};
  /// The replay token's report (kernels/d2h/replay): {first unplanned graph launch, unplanned launches}, written
  /// by the claim kernel, and {token queue overflow} by the arm kernel; read by check_replay_report once a forward
  /// was captured (`captured`).
  ferry::backend::mapped_buffer<B> replay_report;
  std::atomic<bool> captured{false};
  std::shared_ptr<staging_pool> staging;
  spsc_fifo<entry_meta> fifo;
  forward_log forwards;  ///< forward metadata, producer -> drainer (forward_log.hpp)
  test_hooks hooks;

  // -- ring space, shared between producer and drainer --
  std::atomic<std::uint64_t> tail_pos{0};   ///< virtual ring position below which every byte is reclaimed
  std::atomic<std::uint64_t> dyn_freed{0};  ///< dynamic entries whose size slot the drainer consumed
  std::mutex space_mu;
  std::condition_variable space_cv;
  std::atomic<bool> closed{false};

  // -- counters (relaxed; stats() is a snapshot) --
  std::atomic<std::uint64_t> c_reserved{0}, c_published{0}, c_drained{0}, c_bytes{0}, c_copies{0}, c_stalls{0},
    c_high{0}, c_overflows{0}, c_cb_errors{0}, c_publishes{0}, c_bytes_copied{0}, c_capture_errors{0},
    c_selection_errors{0};

  launch_policy<B> launch{b};  ///< how the channel's kernels are launched on the producer stream

  [[nodiscard]] device_state* device_state_ptr() const noexcept { return state_buf.template as<device_state>(); }

  /// The drainer gives ring bytes below `end` back to the producer (called only after the D2H reading them
  /// completed; see drainer::complete_finished).
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

  // -- failure (any thread) --
  void fail(std::string_view what)
  {
    {
      std::lock_guard lock{fail_mu};
      if (failure.empty()) { failure = std::string{what}; }
    }
    failed.store(true);
    space_cv.notify_all();
  }
  [[nodiscard]] bool is_failed() const noexcept { return failed.load(); }

  // -- capture disabled (config::on_error = disable; any thread sets it, the producer thread clears it) --
  /// Disables capture: counted, the first message kept and printed once; the producer's next call closes its
  /// open forward and every later one is a no-op until recover(). Returns whether it was enabled.
  bool disable_capture(std::string_view what)
  {
    c_capture_errors.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard lock{fail_mu};
      if (capture_error.empty()) {
        capture_error = std::string{what};
        std::fprintf(stderr, "ferry: d2h channel capture disabled (on_error = disable; recover() re-enables it): %s\n",
                     capture_error.c_str());
      }
    }
    const bool was = !capture_off.exchange(true, std::memory_order_acq_rel);
    space_cv.notify_all();
    return was;
  }
  [[nodiscard]] bool capture_disabled() const noexcept { return capture_off.load(std::memory_order_acquire); }
  void enable_capture() noexcept { capture_off.store(false, std::memory_order_release); }
  /// The first error that disabled capture (empty: none).
  [[nodiscard]] std::string first_capture_error() const
  {
    std::lock_guard lock{fail_mu};
    return capture_error;
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
                 "d2h channel {}: expected a usable channel, got one invalidated by a failed backend call: {}", what,
                 failure_reason());
    }
  }

  /// A graph launch that no plan() armed (the claim kernel's report; it wrote and published nothing, every
  /// planned forward is delivered), or a plan() armed with planned_queue plans already waiting for their launches
  /// (the arm kernel's; every planned launch from then on writes and publishes nothing): invalidates the channel,
  /// naming the launch. Two acquire loads of pinned host memory once a forward was captured; any thread
  /// (producer calls, the drain, close).
  void check_replay_report()
  {
    if (!captured.load(std::memory_order_relaxed)) [[likely]] { return; }
    auto* r = replay_report.template as<std::uint64_t>();
    const std::uint64_t count = ferry::backend::host_load_acquire(&r[1]);
    if (ferry::backend::host_load_acquire(&r[2]) != 0 && !is_failed()) [[unlikely]] {
      fail(ferry::detail::format(
        "d2h channel: more than {} plan()s armed ahead of their graph launches (expected one plan, then its launch: "
        "channel::replay, or plan(plan, stream) right before each launch); the token queue overflowed, so the "
        "replays launched from then on wrote and published nothing",
        planned_queue));
    }
    if (count == 0 || is_failed()) [[likely]] { return; }
    fail(ferry::detail::format(
      "d2h channel: graph replayed without plan(): launch {} of this channel's captured forwards ({} such launch{} so "
      "far) found no plan() token; expected channel::replay(graph, plan, stream), or plan(plan, stream) on the stream "
      "it is launched on, before every launch. The unplanned launch wrote and published nothing (its kernels saw no "
      "token); every planned forward is delivered",
      ferry::backend::host_load_acquire(&r[0]), count, count == 1 ? "" : "es"));
  }

  [[nodiscard]] counters stats() const
  {
    counters c;
    c.entries_reserved = c_reserved.load();
    c.entries_published = c_published.load();
    c.entries_drained = c_drained.load();
    c.bytes_drained = c_bytes.load();
    c.copies = c_copies.load();
    c.bytes_copied = c_bytes_copied.load();
    c.stalls = c_stalls.load();
    c.high_watermark = c_high.load();
    c.size_overflows = c_overflows.load();
    c.callback_errors = c_cb_errors.load();
    c.publishes = c_publishes.load();
    c.capture_errors = c_capture_errors.load();
    c.selection_errors = c_selection_errors.load();
    return c;
  }

 private:
  static const config& validate(const config& c)
  {
    FERRY_EXPECTS(c.publish_every >= 1, ferry::logic_error, "d2h channel: publish_every (K) expected >= 1, got {}",
                  c.publish_every);
    FERRY_EXPECTS(c.ring_bytes >= entry_alignment && c.ring_bytes % entry_alignment == 0, ferry::logic_error,
                  "d2h channel: ring_bytes expected a non-zero multiple of {}, got {}", entry_alignment, c.ring_bytes);
    FERRY_EXPECTS(c.staging_bytes == 0 || c.staging_bytes >= entry_alignment, ferry::logic_error,
                  "d2h channel: staging_bytes expected 0 (= ring_bytes) or >= {}, got {}", entry_alignment,
                  c.staging_bytes);
    FERRY_EXPECTS(c.fifo_capacity >= 1 && c.fifo_capacity <= (1U << 30), ferry::logic_error,
                  "d2h channel: fifo_capacity expected in [1, 2^30], got {}", c.fifo_capacity);
    FERRY_EXPECTS(c.tuning.bounce_capture_max_bytes <= c.ring_bytes, ferry::logic_error,
                  "d2h channel: bounce_capture_max_bytes expected at most ring_bytes = {} (a bounced entry goes into "
                  "the ring), got {}",
                  c.ring_bytes, c.tuning.bounce_capture_max_bytes);
    const tuning& t = c.tuning;
    FERRY_EXPECTS(t.size_slots <= (1U << 30), ferry::logic_error,
                  "d2h channel: size_slots expected at most 2^30, got {}", t.size_slots);
    FERRY_EXPECTS(t.copy_vecs_per_thread == 1 || t.copy_vecs_per_thread == 2 || t.copy_vecs_per_thread == 4 ||
                    t.copy_vecs_per_thread == 8,
                  ferry::logic_error, "d2h channel: expected copy_vecs_per_thread 1, 2, 4 or 8, got {}",
                  t.copy_vecs_per_thread);
    FERRY_EXPECTS(t.max_copies_in_flight >= 1, ferry::logic_error,
                  "d2h channel: max_copies_in_flight expected >= 1, got {}", t.max_copies_in_flight);
    FERRY_EXPECTS(t.gather_batch >= 1, ferry::logic_error, "d2h channel: gather_batch expected >= 1, got {}",
                  t.gather_batch);
    return c;
  }
  /// The derived values, their one home: tuning::size_slots 0 is one slot per FIFO slot (a dynamic entry holds
  /// a FIFO slot as long as its size slot, so the size ring never fills first). head_memory::platform is
  /// resolved against the device in channel_impl::init_resources.
  static config derive(config c)
  {
    if (c.tuning.size_slots == 0) { c.tuning.size_slots = c.fifo_capacity; }
    return c;
  }

  std::atomic<bool> failed{false};
  std::atomic<bool> capture_off{false};
  mutable std::mutex fail_mu;
  std::string failure;
  std::string capture_error;
};

}  // namespace ferry::d2h::detail
