// SPDX-License-Identifier: Apache-2.0
// The checks of detail::producer<B> (declared in producer.hpp): the producer thread, one stream per forward,
// a capture still open, the commit check's flag, entry sizes, and the join of a new forward's stream.
#pragma once

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
void producer<B>::check_thread(const char* what)
{
  const auto me = std::this_thread::get_id();
  if (!owner_bound_) {
    owner_ = me;
    owner_bound_ = true;
  }
  FERRY_EXPECTS(owner_ == me, ferry::logic_error,
                "d2h channel {}: expected the producer thread that made the first producer call, got another "
                "thread (one producer thread per channel)",
                what);
  const auto cur = st_.b.current_device();
  FERRY_EXPECTS(cur == st_.dev, ferry::logic_error, "d2h channel {}: expected device {} current, got device {}", what,
                st_.dev.value, cur.value);
  FERRY_EXPECTS(!st_.closed.load(), ferry::logic_error, "d2h channel {}: expected an open channel, got a closed one",
                what);
  (void)check_commit_flag();
  st_.check_replay_report();
  st_.check_not_failed(what);
}

/// channel::release_producer_thread: the producer thread gives its role up between forwards; the next thread to
/// make a producer call becomes the producer thread (check_thread binds it). No synchronization of its own: the
/// caller orders the two threads' calls (a thread start or join, a lock), as it orders any two producer calls.
template <ferry::backend::backend B>
void producer<B>::release_thread()
{
  if (!owner_bound_) { return; }
  check_thread("release_producer_thread");
  FERRY_EXPECTS(!open_forward().has_value(), ferry::logic_error,
                "d2h channel release_producer_thread: expected no open forward, got one (end_forward or abort_forward "
                "it first)");
  owner_bound_ = false;
}

/// The commit check's report (one load of pinned host memory once a user-written entry was checked): a
/// writer kernel that did not call ring_ref::commit() invalidates the channel, naming its hook and entry.
/// Returns whether it did.
template <ferry::backend::backend B>
bool producer<B>::check_commit_flag()
{
  if constexpr (check_commits) {
    if (!wrote_user_entry_) { return false; }
    const std::uint64_t tag = ferry::backend::host_load_acquire(commit_flag_->template as<std::uint64_t>());
    if (tag == 0) { return false; }
    // The channel's first failure: the check committed in the writer's place, so the entries launched since
    // are placed right, and close() still publishes the open forward's (close_open_forward). This call
    // itself changes nothing (a rejected call has no effect).
    if (!st_.is_failed()) { commit_fault_ = true; }
    st_.fail(ferry::detail::format(
      "hook {} (entry {} of its forward, written by a user kernel through begin_write/end_write): expected its "
      "writer kernel to call ring_ref::commit() once, got no commit (the commit check committed in its place, "
      "so later entries are placed right; a dynamic entry is delivered as size_overflow)",
      tag >> 32, (tag & 0xffffffffULL) - 1));
    return true;
  }
  return false;
}

/// A capturing forward whose capture ended without end_forward (the capture body threw, or forgot
/// end_forward) can never be closed: every later producer call and plan() refuse it, naming the stream, until
/// abort_forward drops it. One stream_is_capturing query per call, only while a captured forward is open.
template <ferry::backend::backend B>
void producer<B>::check_capture_open(const char* what)
{
  FERRY_EXPECTS(!(in_forward_ && capturing_) || st_.b.stream_is_capturing(last_stream_), ferry::logic_error,
                "d2h channel {}: expected the captured forward begun on stream {} to end with end_forward while "
                "the capture is open, got that stream no longer capturing (the capture ended without "
                "end_forward); call abort_forward(stream) to drop the forward",
                what, static_cast<const void*>(last_stream_));
}

template <ferry::backend::backend B>
void producer<B>::check_producer(stream_view s, const char* what)
{
  check_thread(what);
  check_capture_open(what);
  // One compute stream per forward: every entry's writer and the forward's releases are ordered by that
  // stream alone, so a call on another stream inside a forward would publish bytes not yet written.
  FERRY_EXPECTS(!in_forward_ || s.handle() == last_stream_, ferry::logic_error,
                "d2h channel {}: expected the forward's stream {} (from begin_forward), got stream {} (one "
                "compute stream per forward)",
                what, static_cast<const void*>(last_stream_), static_cast<const void*>(s.handle()));
  last_stream_ = s.handle();
  have_last_stream_ = true;
}

/// A new forward (or replay) on `s` while the last executed one ran on another stream: that forward's
/// publish and cursor normalization (device_state::produced, slot[0]) may still be queued there, and the
/// new forward's writers read the cursor and its releases add to `produced`. join_ev recorded on the last
/// stream, waited by `s`, orders all of it before everything enqueued on `s` from now on.
template <ferry::backend::backend B>
void producer<B>::join_last_stream(stream_type s, const char* what)
{
  if (have_exec_stream_ && exec_stream_ != s && !st_.hooks.is(debug_fault::new_stream_without_join)) {
    FERRY_EXPECTS(!st_.b.stream_is_capturing(exec_stream_), ferry::logic_error,
                  "d2h channel {}: expected to join the last forward's stream {} into stream {}, got stream {} "
                  "being captured (end that capture first)",
                  what, static_cast<const void*>(exec_stream_), static_cast<const void*>(s),
                  static_cast<const void*>(exec_stream_));
    st_.b.event_record(join_ev_.handle(), exec_stream_);
    st_.b.stream_wait_event(s, join_ev_.handle());
  }
  exec_stream_ = s;
  have_exec_stream_ = true;
}

template <ferry::backend::backend B>
void producer<B>::check_entry(hook_id hook, std::uint64_t bytes, entry_kind /*kind: any (a derived size ring)*/,
                              const char* what) const
{
  FERRY_EXPECTS(bytes > 0, ferry::logic_error, "d2h channel {}: hook {} expected an entry of > 0 bytes, got 0", what,
                hook.value);
  const std::uint64_t limit = std::min<std::uint64_t>(st_.cfg.ring_bytes, st_.staging_bytes);
  // `bytes` first: near 2^64 its aligned size wraps to a small one
  const std::uint64_t reserved = bytes <= limit ? align_up(bytes, entry_alignment) : limit + 1;
  FERRY_EXPECTS(reserved <= limit, ferry::logic_error,
                "d2h channel {}: hook {} expected an entry of at most {} bytes (ring {} / staging {}), got {}", what,
                hook.value, limit, st_.cfg.ring_bytes, st_.staging_bytes, bytes);
  FERRY_EXPECTS(in_forward_, ferry::logic_error,
                "d2h channel {}: hook {} expected inside begin_forward/end_forward, got no open forward", what,
                hook.value);
}

}  // namespace ferry::d2h::detail
