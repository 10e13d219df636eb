// SPDX-License-Identifier: Apache-2.0
// Definitions of detail::producer<B> (declared in producer.hpp).
#pragma once

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
ring_ref producer<B>::make_ref(std::uint64_t reserved, entry_kind kind) const noexcept
{
  ring_ref r;
  r.ring = static_cast<std::byte*>(st_.ring.data());
  r.ring_bytes = st_.cfg.ring_bytes;
  r.state = st_.device_state_ptr();
  r.size_slots = st_.size_dev;
  r.size_slot_count = st_.cfg.tuning.size_slots;
  r.reserved = reserved;
  r.parity = parity_;
  r.dynamic = kind == entry_kind::dynamic ? 1U : 0U;
  return r;
}

template <ferry::backend::backend B>
void producer<B>::begin_forward(stream_view s, forward_meta meta)
{
  check_producer(s, "begin_forward");
  FERRY_EXPECTS(!in_forward_, ferry::logic_error,
                "d2h channel begin_forward: expected no open forward, got begin_forward twice");
  capturing_ = st_.b.stream_is_capturing(s.handle());
  FERRY_EXPECTS(
      !meta.selected, ferry::logic_error,
      "d2h channel begin_forward: expected no forward_meta::selected (a plan() hint for a replay's row entries), "
      "got {}",
      meta.selected.value_or(0));
  FERRY_EXPECTS(!capturing_ || meta.empty(), ferry::logic_error,
                "d2h channel begin_forward: expected no forward metadata (tag, requests, user bytes) for a forward "
                "being captured into a graph, got some: give each replay's to plan() or replay()");
  if (!capturing_) { start_forward(std::move(meta)); }
  if (!capturing_) { join_last_stream(s.handle(), "begin_forward"); }  // a capture runs nothing: its replay joins
  in_forward_ = true;
  parity_ = 0;
  unpublished_ = 0;
  fwd_entries_ = 0;
  if (capturing_) {
    access::start_recording(recording_, &st_);
    // The forward's first node: the replay token's claim (kernels/d2h/replay). A launch of this graph that no
    // plan() armed then writes and publishes nothing, and is reported (channel_state::check_replay_report).
    st_.captured.store(true, std::memory_order_relaxed);
    if (!st_.hooks.is(debug_fault::capture_without_claim)) {
      st_.b.launch(claim_replay_kernel(typename B::tag{}), ferry::backend::launch_config{{1}, {1}, 0, false},
                   s.handle(), token_args());
    }
  }
  st_.launch.set_capture_open(capturing_);
}

template <ferry::backend::backend B>
forward_plan producer<B>::end_forward(stream_view s)
{
  check_producer(s, "end_forward");
  FERRY_EXPECTS(in_forward_, ferry::logic_error,
                "d2h channel end_forward: expected an open forward, got end_forward without begin_forward");
  FERRY_EXPECTS(!write_open_, ferry::logic_error,
                "d2h channel end_forward: expected no open begin_write, got one (call end_write first)");
  const bool cap_now = st_.b.stream_is_capturing(s.handle());
  FERRY_EXPECTS(cap_now == capturing_, ferry::logic_error,
                "d2h channel end_forward: expected the stream's capture state as at begin_forward ({}), got {}",
                capturing_, cap_now);
  // The forward boundary: one release covering every entry since the last one, and slot[0] = slot[parity].
  // A partial deferred batch is copied first, by a gather that does that release itself in its last block
  // (one kernel fewer on the stream per forward); else the publish kernel does it.
  if (!flush_deferred(s.handle(), true, "end_forward")) {
    rel_.release_inline(s.handle(), unpublished_, parity_, true);
  }
  unpublished_ = 0;
  parity_ = 0;
  in_forward_ = false;
  st_.launch.set_capture_open(false);
  if (capturing_) {
    capturing_ = false;
    return std::exchange(recording_, forward_plan{});
  }
  return forward_plan{};
}

/// Drops the open forward: an eager one publishes what it launched (as end_forward would: nothing launched
/// stays hidden, the cursor is normalized); a captured one forgets its recording (nothing was reserved; the
/// capture's work never runs). An open begin_write ticket and the capture_deferred entries not yet flushed
/// (never launched, no seq given) are dropped with it. Returns whether one was open.
template <ferry::backend::backend B>
bool producer<B>::abort_forward(stream_view s)
{
  check_thread("abort_forward");
  if (!in_forward_) { return false; }
  FERRY_EXPECTS(s.handle() == last_stream_, ferry::logic_error,
                "d2h channel abort_forward: expected the forward's stream {} (from begin_forward), got stream {}",
                static_cast<const void*>(last_stream_), static_cast<const void*>(s.handle()));
  if (capturing_) {
    access::start_recording(recording_, nullptr);
    rel_.forget_captured_branch();
  } else {
    FERRY_EXPECTS(!st_.b.stream_is_capturing(s.handle()), ferry::logic_error,
                  "d2h channel abort_forward: the eager forward's stream {} is being captured: expected it not "
                  "capturing (end that capture first)",
                  static_cast<const void*>(s.handle()));
    deferred_.keep_bounced();  // bounce captures were launched (their copies into the channel's slots): kept
    (void)launch_deferred(s.handle(), false);
    rel_.release_inline(s.handle(), unpublished_, parity_, true);
  }
  deferred_.clear();  // recorded capture_deferred entries were never launched: dropped with the forward
  write_open_ = false;
  unpublished_ = 0;
  parity_ = 0;
  in_forward_ = false;
  capturing_ = false;
  st_.launch.set_capture_open(false);
  return true;
}

template <ferry::backend::backend B>
template <class Who>
bool producer<B>::wait_for_space(std::uint64_t end, std::size_t n_entries, std::uint64_t n_dyn, when_full full,
                                 std::optional<stream_type> release_stream, Who&& who_fn)
{
  return res_.wait_for_space(end, n_entries, n_dyn, full, [&] {
    if (release_stream && unpublished_ > 0) {
      rel_.release_inline(*release_stream, unpublished_, 0);
      unpublished_ = 0;
    }
  }, std::forward<Who>(who_fn));
}

/// The one reservation of an entry written by its own kernel (capture, capture_rows, begin_write), in this order:
/// align; under a refusing policy, whether it fits after the recorded deferred batch (fits_after_deferred: a
/// refused call flushes nothing); flush that batch (entry order: its gather is enqueued on `s` before this
/// entry's writer, so the writer reads the cursor slot the gather wrote); place it from the head and wait for its
/// space (eager; a captured forward reserves at plan()). Empty when refused (nothing enqueued for this entry).
template <ferry::backend::backend B>
template <class Who>
std::optional<reserved_entry> producer<B>::reserve_entry(std::uint64_t bytes, std::uint64_t n_dyn, when_full full,
                                                         stream_type s, Who&& who_fn, const char* what)
{
  reserved_entry r{align_up(bytes, entry_alignment), {}};
  if (!fits_after_deferred(r.reserved, n_dyn, full, s, who_fn)) { return std::nullopt; }  // nothing flushed
  flush_deferred(s, false, what);
  if (!capturing_) {
    r.where = place(res_.head(), r.reserved, st_.cfg.ring_bytes);
    if (!wait_for_space(r.where.end, 1, n_dyn, full, s, who_fn)) { return std::nullopt; }
  }
  return r;
}

template <ferry::backend::backend B>
void producer<B>::retire(held_source&& h, stream_type s)
{
  if (capturing_) {
    if (h.owner.keep) { graph_sources_.push_back(std::move(h.owner.keep)); }
    return;
  }
  st_.b.release_after(s, std::move(h.owner.keep));
  st_.b.release_after(s, std::move(h.snapshot));
}

/// Launch shape: detail::copy_launch_shape (launch_shape.hpp), the same function bench/d2h uses.
template <ferry::backend::backend B>
void producer<B>::launch_copy(copy_args a, std::uint64_t bytes, bool one_block, stream_type s)
{
  const launch_shape sh = copy_launch_shape(st_.cfg, bytes, one_block, st_.sm_count);
  a.vecs_per_thread = sh.vecs_per_thread;
  a.test_skip_wait = st_.hooks.is(debug_fault::programmatic_without_wait) ? 1U : 0U;
  const copy_form f = copy_form_of(a.src, sh.vecs_per_thread);
  st_.launch.own(sh.one_block
                     ? copy_entry_publish_kernel(typename B::tag{}, f)
                     : copy_entry_kernel(typename B::tag{}, lean_form(st_.cfg, f, sh, bytes, a.dst.dynamic != 0)),
                 sh.blocks, sh.threads, s, a);
}

/// Records one placed entry on the CPU side (after its writer was launched successfully), then releases
/// the batch when it is complete: the release is enqueued after the writer (release_chain).
template <ferry::backend::backend B>
void producer<B>::commit_entry(hook_id hook, placement p, std::uint64_t reserved, std::uint64_t bytes, entry_kind kind,
                               stream_type s, bool publish_fused, std::uint64_t row_bytes, std::uint64_t per_item,
                               std::uint64_t items)
{
  const bool dynamic = kind == entry_kind::dynamic;
  const std::uint64_t after = unpublished_ + 1;
  if (capturing_) {
    access::record(recording_, plan_entry{hook, reserved, bytes, dynamic, row_bytes, per_item, items});
  } else {
    res_.push(hook, p, reserved, bytes, dynamic, row_bytes);
    res_.advance(p.end, 1);
  }
  parity_ ^= 1U;
  ++fwd_entries_;
  unpublished_ = after;
  if (after >= st_.cfg.publish_every) {
    rel_.release_batch(s, after, publish_fused);  // the fork event or stream order after the writer is the join
    unpublished_ = 0;
  }
}

template <ferry::backend::backend B>
bool producer<B>::capture(hook_id hook, const void* src, std::uint64_t bytes, const std::uint64_t* actual,
                          entry_kind kind, stream_view s, when_full full, source_owner owner)
{
  const bool dynamic = kind == entry_kind::dynamic;
  const char* what = dynamic ? "capture_dynamic" : "capture";
  check_producer(s, what);
  check_entry(hook, bytes, kind, what);
  FERRY_EXPECTS(!write_open_, ferry::logic_error, "d2h channel capture: hook {} expected no open begin_write, got one",
                hook.value);
  FERRY_EXPECTS(src != nullptr && (!dynamic || actual != nullptr), ferry::logic_error,
                "d2h channel capture: hook {} expected non-null source{}, got null", hook.value,
                dynamic ? " and size pointer" : "");
  if (!dynamic && bounce_capture(st_.cfg.tuning.bounce_capture_max_bytes, bytes)) {
    return capture_bounced(hook, src, bytes, s, full, std::move(owner));
  }
  auto who = [&] { return ferry::detail::format("hook {} ({} bytes)", hook.value, bytes); };
  const std::optional<reserved_entry> r = reserve_entry(bytes, dynamic ? 1 : 0, full, s.handle(), who, what);
  if (!r) { return false; }
  const std::uint64_t reserved = r->reserved;
  held_source h = hold_source<B>(src, bytes, std::move(owner), capturing_);
  // Branch releases never fuse into a copy kernel (the release would sit on the producer stream).
  const bool publish_now = unpublished_ + 1 >= st_.cfg.publish_every && !st_.cfg.tuning.branch_publish;
  const bool one_block = one_block_copy(st_.cfg, reserved, publish_now);
  const copy_args a{make_ref(reserved, kind), static_cast<const std::byte*>(h.src), bytes, actual,
                    one_block && publish_now ? unpublished_ + 1 : 0, st_.head_dev};
  launch_copy(a, bytes, one_block, s.handle());
  retire(std::move(h), s.handle());
  commit_entry(hook, r->where, reserved, bytes, kind, s.handle(), one_block && publish_now);
  return true;
}

template <ferry::backend::backend B>
write_ticket producer<B>::begin_write(hook_id hook, std::uint64_t reserved_bytes, entry_kind kind, stream_view s)
{
  check_producer(s, "begin_write");
  check_entry(hook, reserved_bytes, kind, "begin_write");
  FERRY_EXPECTS(!write_open_, ferry::logic_error,
                "d2h channel begin_write: hook {} expected no open begin_write, got one", hook.value);
  auto who = [&] { return ferry::detail::format("hook {} ({} bytes)", hook.value, reserved_bytes); };
  // a blocking policy never refuses: it throws (fail_fast, timeout) instead
  const reserved_entry r =
    reserve_entry(reserved_bytes, kind == entry_kind::dynamic ? 1 : 0, blocking_policy(st_.cfg), s.handle(), who,
                  "begin_write")
      .value();
  write_open_ = true;
  return access::open_ticket(make_ref(r.reserved, kind), hook, reserved_bytes, r.where);
}

template <ferry::backend::backend B>
void producer<B>::end_write(write_ticket&& t, stream_view s)
{
  check_producer(s, "end_write");
  FERRY_EXPECTS(access::live(t) && write_open_, ferry::logic_error,
                "d2h channel end_write: hook {} expected a ticket from begin_write, got a used or empty one",
                access::hook(t).value);
  write_open_ = false;
  access::close_ticket(t);
  const ring_ref& ref = t.ref();
  if constexpr (check_commits) {  // after the writer (stream order): did it commit? (commit_check_args)
    const commit_check_args a{ref, commit_flag_->template device_as<std::uint64_t>(),
                              std::uint64_t{access::hook(t).value} << 32 | (fwd_entries_ + 1ULL)};
    st_.b.launch(commit_check_kernel(typename B::tag{}), ferry::backend::launch_config{{1}, {1}, 0, false},
                 s.handle(), a);
    wrote_user_entry_ = true;
  }
  commit_entry(access::hook(t), access::where(t), ref.reserved, access::bytes(t),
               ref.dynamic != 0 ? entry_kind::dynamic : entry_kind::fixed, s.handle(), false);
}

}  // namespace ferry::d2h::detail
