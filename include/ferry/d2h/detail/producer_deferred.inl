// SPDX-License-Identifier: Apache-2.0
// Deferred capture of detail::producer<B> (declared in producer.hpp): capture_deferred records on the CPU,
// flush_deferred copies the batch with ONE gather launch (kernels/d2h/gather/gather_publish.cuh).
// Ordering (docs/design/d2h.md, "Gather publication"): the gather is enqueued on the producer stream before
// the next writer (entry order, cursor parity), and when it publishes, the open branch is joined back first
// (release_chain::join_for_fused_release: one chain), then its last block releases after the acq_rel block join.
#pragma once

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
void producer<B>::capture_deferred(hook_id hook, const void* src, std::uint64_t bytes, stream_view s,
                                   source_owner owner)
{
  check_producer(s, "capture_deferred");
  check_entry(hook, bytes, entry_kind::fixed, "capture_deferred");
  FERRY_EXPECTS(!write_open_, ferry::logic_error,
                "d2h channel capture_deferred: hook {} expected no open begin_write, got one", hook.value);
  FERRY_EXPECTS(src != nullptr, ferry::logic_error,
                "d2h channel capture_deferred: hook {} expected a non-null source, got null", hook.value);
  auto who = [&] {
    return ferry::detail::format("capture_deferred (hook {}, {} bytes, batch of {} recorded)", hook.value, bytes,
                                 deferred_.size());
  };
  auto source = [&] { return hold_source<B>(src, bytes, std::move(owner), capturing_); };
  (void)record_deferred(hook, bytes, blocking_policy(st_.cfg), s.handle(), who, source, false, "capture_deferred");
}

template <ferry::backend::backend B>
bool producer<B>::capture_bounced(hook_id hook, const void* src, std::uint64_t bytes, stream_view s, when_full full,
                                 source_owner owner)
{
  // Called by capture() after its checks, under capture()'s policy (`refuse`: try_capture).
  auto who = [&] {
    return ferry::detail::format("capture (bounce; hook {}, {} bytes, batch of {} recorded)", hook.value, bytes,
                                 deferred_.size());
  };
  // Slot = batch position: a slot is rewritten only by a later batch, whose copies are enqueued on this stream
  // after this batch's gather (stream order: the gather has read it). The caller's source goes back once the
  // copy into the slot no longer needs it; the batch holds the slot, which is the channel's.
  auto copy_to_slot = [&] {
    held_source h = hold_source<B>(src, bytes, std::move(owner), capturing_);
    std::byte* slot = st_.bounce.template as<std::byte>() + std::uint64_t{deferred_.size()} * st_.bounce_slot;
    st_.b.memcpy_async(slot, h.src, bytes, ferry::backend::memcpy_kind::device_to_device, s.handle());
    retire(std::move(h), s.handle());
    return held_source{slot, {}, {}};
  };
  return record_deferred(hook, bytes, full, s.handle(), who, copy_to_slot, true, "capture");
}

template <ferry::backend::backend B>
template <class Who, class Source>
bool producer<B>::record_deferred(hook_id hook, std::uint64_t bytes, when_full full, stream_type s, Who&& who,
                                  Source&& source, bool bounced, const char* what, deferred_rows part)
{
  const std::uint64_t reserved = align_up(bytes, entry_alignment);
  // A call that flushes checks the recorded sources first, before it changes anything.
  if (deferred_.record_flushes(reserved, part)) { deferred_.check_sources(what); }
  // Reserve (eager): ring space and FIFO slots for the recorded batch with this entry, placed as
  // flush_deferred will place them (the gather's chain is place()'s). Under fail_fast (or refuse) a full ring
  // refuses THIS entry before anything else happens: the batch recorded so far stays intact and nothing is
  // enqueued; nothing is accepted that its flush could not hold. Under block_with_timeout the wait comes
  // after a batch that must go first was flushed (its space frees only once it is launched). Nothing else
  // advances the reservation's head before the flush (every other writer flushes first), so it holds.
  auto reserve = [&] {
    if (capturing_) { return true; }  // a captured forward reserves at plan()
    return wait_for_space(place(deferred_end(), reserved, st_.cfg.ring_bytes).end, deferred_.size() + 1U,
                          deferred_.dynamic_count() + (part.sel != nullptr ? 1U : 0U), full, s, who);
  };
  if (full != when_full::wait && !reserve()) { return false; }  // refused before the flush below
  if (deferred_.needs_flush_before(reserved, part)) { launch_deferred(s, false); }
  if (full == when_full::wait) { (void)reserve(); }
  // source() after the flush: a bounce slot is free, a row batch starts with its selection
  deferred_.push(hook, bytes, reserved, source(), bounced, part.row_bytes, static_cast<std::uint32_t>(part.width));
  if (deferred_.size() >= deferred_.limit()) { launch_deferred(s, false); }
  return true;
}

template <ferry::backend::backend B>
std::uint64_t producer<B>::deferred_end() const noexcept
{
  return res_.place_run(res_.head(), deferred_.size(),
                        [&](std::size_t i) { return deferred_[static_cast<std::uint32_t>(i)].reserved; });
}

template <ferry::backend::backend B>
template <class Who>
bool producer<B>::fits_after_deferred(std::uint64_t reserved, std::uint64_t n_dyn, when_full full, stream_type s,
                                      Who&& who_fn)
{
  // captured: plan() reserves; wait: after the flush; no batch: the caller's own check is the same check
  if (capturing_ || full == when_full::wait || deferred_.empty()) { return true; }
  return wait_for_space(place(deferred_end(), reserved, st_.cfg.ring_bytes).end, deferred_.size() + 1U,
                        n_dyn + deferred_.dynamic_count(), full, s, std::forward<Who>(who_fn));
}

template <ferry::backend::backend B>
void producer<B>::flush(stream_view s)
{
  check_producer(s, "flush");
  flush_deferred(s.handle(), false, "flush");
}

template <ferry::backend::backend B>
bool producer<B>::flush_deferred(stream_type s, bool boundary, const char* what)
{
  if (deferred_.empty()) { return false; }
  deferred_.check_sources(what);
  return launch_deferred(s, boundary);
}

/// Places the batch (reservation::place_run from the head, the device's place_phys chain), reserves it
/// (eager) or records it into the plan (graph), launches its gather (gather_publish; a row batch:
/// gather_rows_publish; a reduced row batch: reduce_rows_publish), then gives the sources back. The gather
/// publishes when the entries since the last release reach K.
template <ferry::backend::backend B>
bool producer<B>::launch_deferred(stream_type s, bool boundary)
{
  const std::uint32_t n = deferred_.size();
  if (n == 0) { return false; }
  const bool rows = deferred_.rows() != nullptr;  // every entry dynamic, its size slot after the cursor's
  const bool reduced = rows && deferred_.rows()->r.has_value();  // a record per row: reduce_rows_publish
  std::array<placement, gather_max_entries> where{};
  const std::uint64_t pos = res_.place_run(
      res_.head(), n, [&](std::size_t i) { return deferred_[static_cast<std::uint32_t>(i)].reserved; }, where.data());
  if (!capturing_) {  // reserved at capture_deferred already: this finds the space (kept as the check)
    (void)wait_for_space(pos, n, deferred_.dynamic_count(), blocking_policy(st_.cfg), s, [&] {
      return ferry::detail::format("deferred batch of {} entries ({} bytes)", n, pos - res_.head());
    });
  }
  const std::uint64_t after = unpublished_ + n;
  // At the forward boundary the gather releases every entry since the last release whatever their number,
  // in its own last block (never on the branch: the boundary's release is on the producer stream).
  const bool publish = boundary || after >= st_.cfg.publish_every;
  // The batch's release: fused into the gather's last block, or (gather_branch_publish) on the branch
  // after the launch, behind a fork event recorded after the gather (release_chain::release_on_branch).
  const bool on_branch = publish && !boundary && st_.cfg.tuning.branch_publish && st_.cfg.tuning.gather_branch_publish;
  gather_release_args rel{};  // the release part, one block in both gather argument blocks
  rel.head = st_.head_dev;
  if (publish && !on_branch) {
    rel_.join_for_fused_release(s);  // joins an open branch first: the gather's release stays in the one chain
    rel.head_n = after;
    // the gather writes slot[1]; the next forward starts at parity 0 and reads slot[0]
    rel.normalize = boundary && parity_ == 0 && !st_.hooks.is(debug_fault::boundary_gather_without_normalize) ? 1U : 0U;
    rel.boundary = boundary ? 1U : 0U;
  }
  const std::uint32_t skip_wait = st_.hooks.is(debug_fault::programmatic_without_wait) ? 1U : 0U;
  // The FIFO records go in BEFORE the launch that may release them: the drainer's check that published_head
  // never passes the entries the CPU placed (check_planned) relies on it (a fused release with its records
  // pushed after the launch would look like an unplanned replay of up to a whole batch).
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto& e = deferred_[i];
    if (capturing_) {
      const row_selection* sel = rows ? &deferred_.rows()->sel : nullptr;
      access::record(recording_, plan_entry{e.hook, e.reserved, e.bytes, rows, e.row_bytes,
                                            sel ? sel->rows_per_item() : 1, sel ? sel->item_bound() : 0});
    } else {
      res_.push(e.hook, where[i], e.reserved, e.bytes, rows, e.row_bytes);  // space was checked in wait_for_space
    }
  }
  gather_args a{};
  gather_rows_args ra{};
  gather_shape sh{};
  if (rows) {
    row_gather_args(ra, sh);
    ra.rel = rel;
    ra.test_skip_wait = skip_wait;
  } else {
    a.dst = make_ref(0, entry_kind::fixed);
    a.rel = rel;
    a.test_skip_wait = skip_wait;
    set_gather_entries(a, n, [&](std::uint32_t i) {
      return gather_entry{static_cast<const std::byte*>(deferred_[i].source.src), deferred_[i].bytes};
    });
    sh = apportion_gather(st_.cfg, a, st_.sm_count);
    a.vecs_per_thread = sh.vecs_per_thread;
  }
  // The sources (and a row batch's selection) leave the batch before the launch: a failed launch invalidates
  // the channel and leaves no batch behind. The gather reads them (stream order) before they go back.
  std::array<held_source, 3> selection = deferred_.take_selection();
  std::array<held_source, gather_max_entries> sources{};
  std::uint32_t k = 0;
  deferred_.take_sources([&](held_source&& h) { sources[k++] = std::move(h); });
  if (rows) {
    const auto kernel = reduced ? reduce_rows_publish_kernel(typename B::tag{}, ra.r.op)
                                : gather_rows_publish_kernel(typename B::tag{});
    st_.launch.own(kernel, sh.blocks, sh.threads, s, ra);
  } else {
    st_.launch.own(gather_publish_kernel(typename B::tag{}, vec_form(sh.vecs_per_thread)), sh.blocks, sh.threads, s, a);
  }
  for (std::uint32_t i = 0; i < k; ++i) { retire(std::move(sources[i]), s); }
  for (auto& x : selection) { retire(std::move(x), s); }
  if (on_branch) { rel_.release_batch(s, after, false); }
  if (!capturing_) { res_.advance(pos, n); }
  parity_ ^= 1U;  // one writer: the gather commits the cursor once for the whole batch
  unpublished_ = publish ? 0 : after;
  return boundary;
}

}  // namespace ferry::d2h::detail
