// SPDX-License-Identifier: Apache-2.0
// Definitions of detail::producer<B> (declared in producer.hpp), capture disabled (config::on_error =
// disable): the error that disables it (disable), the producer's side of a disabled channel (while_disabled:
// the open forward closed once; quiet tokens for replays; tickets nothing is written through) and recover().
// A disabled channel's producer calls are no-ops (channel.hpp, produce); its graph replays keep running and,
// holding a quiet replay token, write and publish nothing (kernels/d2h/replay).
#pragma once

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
void producer<B>::disable(std::string_view what)
{
  (void)st_.disable_capture(what);
  while_disabled();
}

/// Once per disabling, from the producer thread: an open forward is closed as abort_forward closes it (an eager
/// one publishes what it launched, with the cursor normalized; a captured one forgets its recording), and the
/// engine's own forward counts as open until its end_forward (a no-op). When that close fails the channel is
/// invalidated (its cursor may not be normalized: recover() refuses it).
template <ferry::backend::backend B>
void producer<B>::while_disabled()
{
  if (!in_forward_) { return; }
  user_open_ = true;
  try {
    (void)abort_forward(stream_view{st_.b, last_stream_});
  } catch (const std::exception& e) {
    st_.fail(ferry::detail::format("closing the forward open when capture was disabled failed: {}", e.what()));
    deferred_.clear();
    write_open_ = false;
    unpublished_ = 0;
    parity_ = 0;
    in_forward_ = false;
    capturing_ = false;
    st_.launch.set_capture_open(false);
  }
}

/// A replay while capture is disabled: a quiet token on its stream (joined to the last forward's first), so
/// the graph's claim kernel skips it unreported. Best effort: a failure leaves no token, and the launch is
/// then reported as unplanned (nothing is written either way).
template <ferry::backend::backend B>
void producer<B>::arm_quiet(std::optional<stream_type> launch_stream) noexcept
{
  try {
    if (const auto s = replay_stream(launch_stream, "replay")) { arm_replay(*s, true); }
  } catch (...) {
  }
}

/// begin_write while capture is disabled: a ticket whose ref() is not live() (its cursors carry
/// cursor_unplanned, in a state block of its own) and whose ring is null: a writer kernel that tests live()
/// writes nothing; its commit() writes that private state block only.
template <ferry::backend::backend B>
write_ticket producer<B>::disabled_ticket(hook_id hook, std::uint64_t reserved)
{
  ring_ref r;
  if (off_state_) { r.state = off_state_->template as<device_state>(); }
  r.reserved = reserved;
  return access::open_ticket(r, hook, reserved, placement{});
}

template <ferry::backend::backend B>
void producer<B>::recover()
{
  check_thread("recover");
  FERRY_EXPECTS(!in_forward_ && !user_open_, ferry::logic_error,
                "d2h channel recover: expected a forward boundary (no open forward), got a forward open (call "
                "end_forward first)");
  st_.enable_capture();
}

}  // namespace ferry::d2h::detail
