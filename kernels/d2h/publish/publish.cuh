// SPDX-License-Identifier: Apache-2.0
// Bodies of the two one-thread kernels publish_head (the batch release) and commit_check (the commit check
// after a user-written entry), shared by the GPU wrapper (publish.cu) and the host backend's
// (publish_host.cpp), and the release phase publish_phase, which the fused releases of copy_entry_publish and
// gather_publish run too.
#pragma once

#include <ferry/backend/system_atomic.hpp>
#include <ferry/d2h/detail/kernel_args.hpp>

#include <cstdint>

namespace ferry::kernels::d2h {

/// One thread, after every payload writer of the batch is joined (block barrier or stream order):
/// produced += n, then ONE system-scope release store of published_head. Nothing else is needed: the
/// release orders every write that happens-before it (this block's stores via the barrier, earlier
/// kernels' stores via the kernel boundary) before the CPU's matching acquire. In a graph launch that no
/// plan() armed (device_state::skip, set by its claim kernel) it publishes nothing: its writers wrote nothing.
FERRY_HD inline void publish_phase(ferry::d2h::device_state* state, std::uint64_t* head, std::uint64_t n) noexcept
{
  const std::uint32_t skip = state->skip;  // same line as `produced`: the two loads are in flight together
  const std::uint64_t produced = state->produced + n;
  if (skip != 0) { return; }
  state->produced = produced;
  ferry::backend::store_release_system(head, produced);
}

/// The boundary of a forward no plan() armed (skip set; replay_token.cuh): instead of a release, slot[0] =
/// the forward's cursor (slot `current`, passed on unchanged by its writers) without cursor_unplanned, and
/// skip cleared, so the next forward (eager or planned) places from where the last planned one ended.
/// Returns whether it did.
FERRY_HD inline bool end_unplanned(ferry::d2h::device_state* state, std::uint32_t current) noexcept
{
  if (state->skip == 0) { return false; }
  ferry::d2h::cursor c = ferry::d2h::load_cursor(&state->slot[current]);
  c.phys &= ~ferry::d2h::cursor_unplanned;
  ferry::d2h::store_cursor(&state->slot[0], c);
  state->skip = 0;
  return true;
}

/// The publish_head kernel's body (one thread): at a forward boundary the cursor normalization first.
FERRY_HD inline void publish_head_body(const ferry::d2h::detail::head_args& a) noexcept
{
  if (a.boundary != 0 && end_unplanned(a.state, a.normalize)) { return; }
  if (a.normalize != 0) { ferry::d2h::normalize_cursor(a.state); }
  publish_phase(a.state, a.head, a.n);
}

/// The commit_check kernel's body (see commit_check_args), in stream order after the writer kernel:
/// when the writer did not commit (slot[parity ^ 1] is not one commit ahead of slot[parity]), commits in
/// its place with size ~0 and, first time only, releases the tag into the host-visible flag.
FERRY_HD inline void commit_check_body(const ferry::d2h::detail::commit_check_args& a) noexcept
{
  const ferry::d2h::cursor from = a.entry.state->slot[a.entry.parity];
  if (!ferry::d2h::cursor_live(from)) {  // an unplanned launch: the cursor passed on, whatever the writer did
    ferry::d2h::store_cursor(&a.entry.state->slot[a.entry.parity ^ 1U], from);
    return;
  }
  const ferry::d2h::cursor to = a.entry.state->slot[a.entry.parity ^ 1U];
  const std::uint32_t want = ferry::d2h::cursor_commits(from.dyn_slot) + 1U;
  if (ferry::d2h::cursor_commits(to.dyn_slot) == want) { return; }
  a.entry.commit(from, ~std::uint64_t{0});  // the next entry is placed right; an unknown size is rejected
  if (ferry::backend::load_relaxed_system(a.flag) == 0) { ferry::backend::store_release_system(a.flag, a.tag); }
}

}  // namespace ferry::kernels::d2h
