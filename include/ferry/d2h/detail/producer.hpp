// SPDX-License-Identifier: Apache-2.0
// The producer side of a channel (one thread, the channel's device current): the forward state machine
// (begin_forward / end_forward, eager or captured), ring reservation (reserve_entry, wait_for_space), the copy launch
// (capture), user-written entries (begin_write / end_write) and the pre-replay reservation (plan).
// Ordering steps here (docs/design/d2h.md): the writer is enqueued on the producer stream before its
// release (commit_entry -> release_chain), the forward boundary always releases (end_forward), and an eager
// producer about to wait on a full ring first releases what it launched (wait_for_space).
#pragma once

#include <ferry/backend/buffer.hpp>
#include <ferry/backend/event.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/d2h/detail/access.hpp>
#include <ferry/d2h/detail/channel_state.hpp>
#include <ferry/d2h/detail/deferred.hpp>
#include <ferry/d2h/detail/gather.hpp>
#include <ferry/d2h/detail/launch_shape.hpp>
#include <ferry/d2h/detail/release_chain.hpp>
#include <ferry/d2h/detail/reservation.hpp>
#include <ferry/d2h/source_owner.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// The commit check (a 1-thread kernel after every begin_write/end_write entry's writer): always on the host
// backend, and in builds without NDEBUG; FERRY_D2H_CHECK_COMMIT=0/1 overrides it for the GPU backends.
#if !defined(FERRY_D2H_CHECK_COMMIT)
#if defined(NDEBUG)
#define FERRY_D2H_CHECK_COMMIT 0
#else
#define FERRY_D2H_CHECK_COMMIT 1
#endif
#endif

namespace ferry::d2h::detail {

/// Whether an entry's size is CPU-known (`fixed`) or resolved on the GPU through the size ring (`dynamic`).
enum class entry_kind : bool { fixed, dynamic };

/// An entry's reservation (producer::reserve_entry): its ring bytes and, eager, its place (a captured forward
/// places at plan()).
struct reserved_entry {
  std::uint64_t reserved{0};
  placement where{};
};

template <ferry::backend::backend B>
class producer {
 public:
  using stream_type = typename B::stream_type;
  using stream_view = ferry::backend::stream_view<B>;
  using progress_fn = typename reservation<B>::progress_fn;

  /// Whether end_write enqueues the commit check (FERRY_D2H_CHECK_COMMIT, or the host backend).
  static constexpr bool check_commits =
    FERRY_D2H_CHECK_COMMIT != 0 || std::is_same_v<typename B::tag, ferry::backend::host_tag>;

  producer(channel_state<B>& st, release_chain<B>& rel, progress_fn progress)
    : st_{st}, rel_{rel}, res_{st, std::move(progress)}, join_ev_{st.b, ferry::backend::event_flags::disable_timing},
      deferred_{deferred_limit(st.cfg, st.fifo.capacity()), st.cfg.ring_bytes}
  {
    if constexpr (check_commits) {
      commit_flag_.emplace(cache_line, st_.b);
      ferry::backend::host_store_release(commit_flag_->template as<std::uint64_t>(), 0);
      (void)st_.b.preload(commit_check_kernel(typename B::tag{}));
    }
    if (st_.cfg.on_error == error_policy::disable) {  // the state block of disabled tickets (disabled_ticket)
      off_state_.emplace(sizeof(device_state), st_.b);
      device_state off{};
      off.slot[0].phys = off.slot[1].phys = cursor_unplanned;
      st_.b.memcpy_async(off_state_->data(), &off, sizeof off, ferry::backend::memcpy_kind::host_to_device,
                         st_.drain_stream.handle());
      st_.drain_stream.synchronize();
    }
  }

  /// Opens a forward; `meta` (forward_info.hpp) travels to its entries (an eager forward only: a captured
  /// forward's metadata is given per replay, to plan()).
  void begin_forward(stream_view s, forward_meta meta = {});
  forward_plan end_forward(stream_view s);
  bool capture(hook_id hook, const void* src, std::uint64_t bytes, const std::uint64_t* actual, entry_kind kind,
               stream_view s, when_full full, source_owner owner = {});
  /// The rows `sel` names of the [n_rows, row_bytes] device tensor `src`, as one dynamic entry (producer_rows.inl).
  bool capture_rows(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                    const row_selection& sel, stream_view s, when_full full, source_owner owner = {});
  /// The records of `r` over the rows `sel` names of the [n_rows, width] tensor `src` of `in` elements, as one
  /// dynamic entry (producer_reduce.inl).
  bool capture_reduced(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t width, reduce_input in,
                       const row_selection& sel, const reducer& r, stream_view s, when_full full,
                       source_owner owner = {});
  /// capture_reduced recorded in the deferred batch (a reducer with a record per row); one reduce_rows_publish per
  /// batch sharing a selection and reducer (producer_reduce.inl).
  void capture_reduced_deferred(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t width,
                                reduce_input in, const row_selection& sel, const reducer& r, stream_view s,
                                source_owner owner = {});
  void capture_deferred(hook_id hook, const void* src, std::uint64_t bytes, stream_view s, source_owner owner = {});
  /// capture_rows recorded in the deferred batch; one gather_rows_publish per batch sharing a selection.
  void capture_rows_deferred(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                             const row_selection& sel, stream_view s, source_owner owner = {});
  void flush(stream_view s);
  write_ticket begin_write(hook_id hook, std::uint64_t reserved_bytes, entry_kind kind, stream_view s);
  void end_write(write_ticket&& t, stream_view s);
  /// Reserves `p`'s entries and arms one replay (kernels/d2h/replay) on `launch_stream` (joined to the last
  /// forward's stream first; the null handle: the legacy default stream, channel::plan(p, default_stream)),
  /// or without one on the stream of the last executed forward or replay (else of the last producer call).
  bool plan(const forward_plan& p, when_full full, std::optional<stream_type> launch_stream = std::nullopt,
            forward_meta meta = {});
  bool abort_forward(stream_view s);
  /// channel::replay: the graph is about to be launched on `s`; joins the stream of the last executed forward.
  void before_replay(stream_view s);

  // Capture disabled (config::on_error = disable; producer_disable.inl).
  /// A producer call failed: disables capture (`what` kept) and closes the open forward.
  void disable(std::string_view what);
  /// Every producer call while capture is disabled: closes a forward still open (once).
  void while_disabled();
  /// The engine's forward open or closed while capture is disabled (its begin_forward / end_forward).
  void set_user_open(bool open) noexcept { user_open_ = open; }
  /// plan / replay while capture is disabled: a quiet replay token (the replay writes nothing, unreported).
  void arm_quiet(std::optional<stream_type> launch_stream) noexcept;
  [[nodiscard]] write_ticket disabled_ticket(hook_id hook, std::uint64_t reserved);
  /// Re-enables capture at a forward boundary (not on an invalidated channel: invalidated_error).
  void recover();
  void release_thread();  ///< channel::release_producer_thread (producer_checks.inl)
  [[nodiscard]] std::optional<open_forward_state<B>> open_forward() const noexcept
  {
    if (!in_forward_) { return std::nullopt; }
    return open_forward_state<B>{last_stream_, capturing_};
  }
  /// Deferred entries (and bounce captures) recorded and not yet flushed (producer thread).
  [[nodiscard]] std::uint32_t deferred_pending() const noexcept { return deferred_.size(); }
  /// close(): the owners of sources captured into graphs go back (no replay runs after close).
  void release_graph_sources() noexcept { graph_sources_.clear(); }

  /// channel::close(): when the commit check found a writer kernel that did not commit, invalidates the
  /// channel and throws invalidated_error naming the hook (every check before the last release has run).
  void raise_commit_fault(const char* what)
  {
    if (check_commit_flag()) { st_.check_not_failed(what); }
  }

  /// close(): an eager forward left open publishes what it launched, so nothing launched stays hidden; also
  /// after a commit fault (its entries are placed right: every entry accepted before the report is
  /// delivered, whichever call saw it), not after any other failure. Returns whether a forward was open.
  bool close_open_forward()
  {
    if (!in_forward_) { return false; }
    if (!capturing_ && (unpublished_ > 0 || !deferred_.empty()) && have_last_stream_) {
      try {
        if (!commit_fault_) { st_.check_not_failed("close"); }
        try {
          deferred_.check_sources("close");
        } catch (const ferry::logic_error&) {
          deferred_.keep_bounced();  // a written deferred source is not copied: dropped as abort_forward drops it
        }
        launch_deferred(last_stream_, false);  // recorded deferred entries are copied, not silently dropped
        rel_.release_inline(last_stream_, unpublished_, 0);
        unpublished_ = 0;
      } catch (const std::exception& e) {
        st_.fail(e.what());
      }
    }
    return true;
  }

 private:
  void check_thread(const char* what);
  void check_producer(stream_view s, const char* what);
  void join_last_stream(stream_type s, const char* what);
  void check_capture_open(const char* what);
  bool check_commit_flag();
  void check_entry(hook_id hook, std::uint64_t bytes, entry_kind kind, const char* what) const;
  [[nodiscard]] ring_ref make_ref(std::uint64_t reserved, entry_kind kind) const noexcept;
  [[nodiscard]] std::optional<stream_type> replay_stream(std::optional<stream_type> launch_stream, const char* what);
  /// `items`: the plan()'s forward_meta::selected, carried by the token to the replay's row kernels.
  void arm_replay(stream_type s, bool quiet, std::uint64_t items = no_planned_items);
  [[nodiscard]] replay_token_args token_args() const noexcept
  {
    return {st_.device_state_ptr(), st_.replay_report.template device_as<std::uint64_t>()};
  }
  /// reservation::wait_for_space from a producer call: an eager producer about to wait first releases what
  /// it launched on `release_stream` (entries launched but not published cannot drain).
  template <class Who>
  bool wait_for_space(std::uint64_t end, std::size_t n_entries, std::uint64_t n_dyn, when_full full,
                      std::optional<stream_type> release_stream, Who&& who_fn);
  /// The reservation of one entry of `bytes` written by its own kernel (capture, capture_rows, begin_write):
  /// align, fits_after_deferred, flush_deferred, place, wait_for_space (producer.inl). Empty: refused under `full`.
  template <class Who>
  std::optional<reserved_entry> reserve_entry(std::uint64_t bytes, std::uint64_t n_dyn, when_full full,
                                              stream_type s, Who&& who_fn, const char* what);
  void launch_copy(copy_args a, std::uint64_t bytes, bool one_block, stream_type s);
  /// capture() of a static entry up to tuning::bounce_capture_max_bytes: the source copied into the staging
  /// slot of its batch position, the slot recorded as a deferred entry (producer_deferred.inl).
  bool capture_bounced(hook_id hook, const void* src, std::uint64_t bytes, stream_view s, when_full full,
                      source_owner owner);
  /// capture_deferred's and capture_bounced's common step: reserves the batch with an entry of `bytes` under
  /// `full` (refused: returns false, nothing enqueued), flushes a batch that cannot hold it, records the entry
  /// from `source()` (called after that flush), flushes a full batch.
  template <class Who, class Source>
  bool record_deferred(hook_id hook, std::uint64_t bytes, when_full full, stream_type s, Who&& who, Source&& source,
                       bool bounced, const char* what, deferred_rows part = {});
  // Row capture's parts (producer_rows.inl): the CPU's checks (returns the payload bound), the host snapshot of a
  // selection's arrays, a row batch's gather arguments and shape (but its release part: launch_deferred).
  // `red` (capture_reduced): the entry holds its records of rows of `width` elements instead of the rows.
  std::uint64_t check_rows(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                           const row_selection& sel, const char* what, const reducer* red = nullptr,
                           std::uint64_t width = 0);
  row_batch hold_selection(const row_selection& sel, std::uint64_t n_rows, bool snapshot);
  void record_rows_deferred(hook_id hook, const void* src, std::uint64_t src_row_bytes, std::uint64_t bytes,
                            const deferred_rows& part, stream_view s, source_owner owner, const char* what);
  void check_reducer(hook_id hook, std::uint64_t width, const reducer& r, const char* what) const;
  void row_gather_args(gather_rows_args& a, gather_shape& sh) const;
  /// Gives a held source back once the copy enqueued on `s` no longer needs it: the backend's release_after
  /// (eager), or with the channel's graph sources (a captured forward: every replay reads it again).
  void retire(held_source&& h, stream_type s);
  /// Copies the recorded deferred batch (one gather launch), its sources checked first (check_sources). `boundary`
  /// (end_forward): the gather's last block also does the forward boundary's release (every entry since the last
  /// release, and the cursor normalization), so end_forward launches no release of its own. Returns whether the gather
  /// did that.
  bool flush_deferred(stream_type s, bool boundary, const char* what);
  /// flush_deferred after the sources were checked (or hold none that could change).
  bool launch_deferred(stream_type s, bool boundary);
  /// Where the recorded deferred batch ends (placed from head_pos_ as flush_deferred places it).
  [[nodiscard]] std::uint64_t deferred_end() const noexcept;
  /// For a writer that flushes the recorded deferred batch first (reserve_entry), under a refusing
  /// policy (fail_fast, try_capture): whether `reserved` bytes placed after that batch fit, checked BEFORE the
  /// batch is flushed, so a refused call flushes nothing. True without a batch (the writer's own check follows).
  template <class Who>
  [[nodiscard]] bool fits_after_deferred(std::uint64_t reserved, std::uint64_t n_dyn, when_full full, stream_type s,
                                         Who&& who_fn);
  void commit_entry(hook_id hook, placement p, std::uint64_t reserved, std::uint64_t bytes, entry_kind kind,
                    stream_type s, bool publish_fused, std::uint64_t row_bytes = 0, std::uint64_t per_item = 1,
                    std::uint64_t items = 0);
  /// A forward starts (eager begin_forward, or plan()): its index for the FIFO records, its metadata to the log.
  void start_forward(forward_meta&& meta)
  {
    const std::uint64_t index = forwards_++;
    res_.set_forward(index);
    if (!meta.empty()) { st_.forwards.push(index, std::make_shared<const forward_meta>(std::move(meta))); }
  }

  channel_state<B>& st_;
  release_chain<B>& rel_;
  reservation<B> res_;
  std::thread::id owner_{};
  bool owner_bound_{false};
  bool in_forward_{false};
  bool capturing_{false};
  bool write_open_{false};
  std::uint32_t parity_{0};        ///< entries since begin_forward, mod 2: the device cursor slot
  std::uint64_t unpublished_{0};   ///< entries launched since the last release
  stream_type last_stream_{};
  bool have_last_stream_{false};
  /// The stream the channel's last executed device work (an eager forward, a replay) was enqueued on: a
  /// forward or replay on another stream joins it first (join_last_stream). Captures do not change it.
  stream_type exec_stream_{};
  bool have_exec_stream_{false};
  ferry::backend::event<B> join_ev_;
  forward_plan recording_;
  std::uint32_t fwd_entries_{0};  ///< entries since begin_forward (names an entry in the commit check)
  std::uint64_t forwards_{0};     ///< forwards started (eager begin_forward and plan()): the next one's index
  std::optional<ferry::backend::mapped_buffer<B>> commit_flag_;  ///< the commit check's report (check_commits)
  bool wrote_user_entry_{false};  ///< a commit check was enqueued: the CPU reads its flag from then on
  bool commit_fault_{false};      ///< the channel's first failure was a commit fault (check_commit_flag)
  deferred_batch deferred_;  ///< capture_deferred entries not yet copied (flush_deferred)
  std::vector<std::shared_ptr<void>> graph_sources_;  ///< owners of sources captured into graphs (until close)
  bool user_open_{false};  ///< capture disabled: the engine's forward is open (begin_forward seen, end_forward not)
  std::optional<ferry::backend::device_buffer<B>> off_state_;  ///< disabled tickets' state block (on_error = disable)
};

}  // namespace ferry::d2h::detail

#include <ferry/d2h/detail/producer.inl>
#include <ferry/d2h/detail/producer_checks.inl>
#include <ferry/d2h/detail/producer_deferred.inl>
#include <ferry/d2h/detail/producer_plan.inl>
#include <ferry/d2h/detail/producer_disable.inl>
#include <ferry/d2h/detail/producer_rows.inl>
#include <ferry/d2h/detail/producer_reduce.inl>
