// SPDX-License-Identifier: Apache-2.0
// Bodies of the two one-thread kernels of the replay token, shared by the GPU wrapper (replay_token.cu) and
// the host backend's (replay_token_host.cpp). A graph launch that no plan() reserved must write nothing into
// the ring: its entries have no reservation, so their bytes would land where the next planned forward's go
// (or on entries not yet drained), and its releases would publish entries the CPU never placed.
//   arm_replay    plan() enqueues it on the stream the replay will be launched on: armed += 1 (with capture
//                 disabled, config::on_error, a quiet token: quiet += 1; the replay then skips unreported).
//   claim_replay  the first node of every captured forward (begin_forward under capture): counts the launch;
//                 takes a token (armed -= 1) when there is one; else marks the forward unplanned: skip = 1
//                 (its releases publish nothing, publish.cuh) and cursor_unplanned in slot[0] (its writers,
//                 which load that cursor anyway, store nothing and pass it on: ring_ref::commit), and reports
//                 the launch into the host-visible word pair `report` (first unplanned launch, count).
// Stream order makes the token exact: the arm kernel of a plan() runs after every earlier launch's claim and
// before its own replay's claim, so a launch without a plan() finds armed == 0, whatever the CPU ran ahead.
// The forward's boundary release (publish_head_body / gather_release) clears both marks.
// A token carries its plan()'s item count (forward_meta::selected, else no_planned_items): the arm queues it
// (device_state::planned, in arm order), the claim that takes the token moves it into planned_items, where the
// replay's row kernels read the placement plan() gave them (kernels/d2h/select). A plan() armed while
// planned_queue tokens wait (plans far ahead of their launches) has no room: device_state::plan_overflow is set
// and reported (report[2]); every later planned launch then writes and publishes nothing, as an unplanned one.
#pragma once

#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/kernel_args.hpp>

#include <cstdint>

namespace ferry::kernels::d2h {

FERRY_HD inline void arm_replay_body(const ferry::d2h::detail::replay_token_args& a) noexcept
{
  ferry::d2h::device_state* st = a.state;
  if (a.quiet != 0) {
    st->quiet += 1;
    return;
  }
  if (st->armed >= ferry::d2h::planned_queue) {
    st->plan_overflow = 1;
    ferry::backend::store_release_system(&a.report[2], std::uint64_t{1});
  } else {
    st->planned[(st->claimed + st->armed) % ferry::d2h::planned_queue] = a.items;
  }
  st->armed += 1;
}

FERRY_HD inline void claim_replay_body(const ferry::d2h::detail::replay_token_args& a) noexcept
{
  ferry::d2h::device_state* st = a.state;
  const std::uint64_t launch = st->launches + 1;
  st->launches = launch;
  const bool token = st->armed > 0;
  st->planned_items = ferry::d2h::no_planned_items;
  if (token) {
    st->armed -= 1;
    st->planned_items = st->planned[st->claimed % ferry::d2h::planned_queue];
    st->claimed += 1;
    if (st->plan_overflow == 0) {
      st->skip = 0;
      return;
    }
  }
  st->skip = 1;
  ferry::d2h::cursor c = ferry::d2h::load_cursor(&st->slot[0]);
  c.phys |= ferry::d2h::cursor_unplanned;
  ferry::d2h::store_cursor(&st->slot[0], c);
  if (token) { return; }  // planned, after the token queue overflowed: skipped, reported by the arm
  if (st->quiet > 0) {  // a replay of a channel with capture disabled: skipped as planned, not reported
    st->quiet -= 1;
    return;
  }
  // report[0]: the first unplanned launch (1-based over this channel's graph launches), report[1]: how many.
  // One writer (stream order); the CPU acquire-loads report[1] and reads report[0] after it.
  if (ferry::backend::load_relaxed_system(&a.report[0]) == 0) {
    ferry::backend::store_release_system(&a.report[0], launch);
  }
  ferry::backend::store_release_system(&a.report[1], ferry::backend::load_relaxed_system(&a.report[1]) + 1);
}

}  // namespace ferry::kernels::d2h
