// SPDX-License-Identifier: Apache-2.0
// Definitions of detail::producer<B> (declared in producer.hpp), graph replays: before_replay (the join of the
// replay's stream) and plan (the reservation of a captured forward's entries and the replay's token, which the
// claim kernel at the captured forward's start takes: kernels/d2h/replay/replay_token.cuh).
#pragma once

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
void producer<B>::before_replay(stream_view s)
{
  check_thread("replay");
  FERRY_EXPECTS(!in_forward_, ferry::logic_error,
                "d2h channel replay: expected no open forward, got one (replay between forwards)");
  join_last_stream(s.handle(), "replay");
}

/// The stream a replay's token goes on: `launch_stream` (joined to the last forward's stream first), else the
/// stream of the last executed forward or replay, else of the last producer call; none before any.
template <ferry::backend::backend B>
std::optional<typename producer<B>::stream_type> producer<B>::replay_stream(std::optional<stream_type> launch_stream,
                                                                            const char* what)
{
  if (launch_stream) {
    join_last_stream(*launch_stream, what);
    return launch_stream;
  }
  if (have_exec_stream_) { return exec_stream_; }
  if (have_last_stream_) { return last_stream_; }
  return std::nullopt;
}

/// One replay token on `s` (arm_replay): a plan()'s (carrying its `items`: forward_meta::selected), or a quiet one
/// while capture is disabled.
template <ferry::backend::backend B>
void producer<B>::arm_replay(stream_type s, bool quiet, std::uint64_t items)
{
  replay_token_args a = token_args();
  a.quiet = quiet ? 1U : 0U;
  a.items = items;
  st_.b.launch(arm_replay_kernel(typename B::tag{}), ferry::backend::launch_config{{1}, {1}, 0, false}, s, a);
}

template <ferry::backend::backend B>
bool producer<B>::plan(const forward_plan& p, when_full full, std::optional<stream_type> launch_stream,
                       forward_meta meta)
{
  check_thread("plan");
  check_capture_open("plan");
  FERRY_EXPECTS(p.owner() == &st_, ferry::logic_error,
                "d2h channel plan: expected a plan captured by this channel, got {}",
                p.owner() == nullptr ? "an empty plan" : "a plan of another channel");
  FERRY_EXPECTS(!in_forward_, ferry::logic_error,
                "d2h channel plan: expected no open eager forward, got one (plan between forwards)");
  FERRY_EXPECTS(p.size() <= st_.fifo.capacity(), ferry::logic_error,
                "d2h channel plan: expected at most fifo_capacity = {} entries per forward, got {}",
                st_.fifo.capacity(), p.size());
  for (const auto& e : p.entries()) {  // forward_meta::selected: at most the items each row entry reserved
    FERRY_EXPECTS(
        !meta.selected || e.row_bytes == 0 || *meta.selected <= e.items, ferry::logic_error,
        "d2h channel plan: hook {} expected forward_meta::selected at most the {} items its capture reserved, got {}",
        e.hook.value, e.items, meta.selected.value_or(0));
  }
  // With forward_meta::selected each row entry takes exactly its rows (row_reserved): the replay's row
  // kernels place it the same way from the count its token carries (arm_replay -> device_state::planned_items).
  const std::optional<std::uint64_t> selected = meta.selected;
  auto reserved_of = [&](std::size_t i) {
    const plan_entry& e = p.entries()[i];
    return selected && e.row_bytes != 0 ? row_reserved(*selected, e.per_item, e.row_bytes) : e.reserved;
  };
  std::vector<placement> where(p.size());
  const std::uint64_t pos = res_.place_run(res_.head(), p.size(), reserved_of, where.data());
  const std::uint64_t n_dyn = static_cast<std::uint64_t>(
    std::count_if(p.entries().begin(), p.entries().end(), [](const plan_entry& e) { return e.dynamic; }));
  FERRY_EXPECTS(pos - res_.head() <= st_.cfg.ring_bytes, ferry::logic_error,
                "d2h channel plan: expected a forward of at most ring_bytes = {} (with wrap padding), got {}",
                st_.cfg.ring_bytes, pos - res_.head());
  FERRY_EXPECTS(n_dyn <= st_.cfg.tuning.size_slots, ferry::logic_error,
                "d2h channel plan: expected at most size_slots = {} dynamic entries per forward, got {}",
                st_.cfg.tuning.size_slots, n_dyn);
  if (!wait_for_space(pos, p.size(), n_dyn, full, std::nullopt,
                      [&] { return ferry::detail::format("plan of {} entries", p.size()); })) {
    return false;
  }
  // The replay's token, on the stream it will be launched on, after that stream joined the last forward's
  // (the arm kernel must follow every earlier launch's claim). Enqueued before the FIFO records: a failed
  // launch leaves no reservation behind.
  const std::optional<stream_type> s = replay_stream(launch_stream, "plan");
  FERRY_EXPECTS(s.has_value(), ferry::logic_error,
                "d2h channel plan: expected a stream to arm the replay on, got none (no forward ran or was captured "
                "on this channel); call plan(plan, stream)");
  if (!launch_stream) {
    exec_stream_ = *s;
    have_exec_stream_ = true;
  }
  arm_replay(*s, false, selected.value_or(no_planned_items));
  start_forward(std::move(meta));  // before the replay's first FIFO record (forward_log.hpp)
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto& e = p.entries()[i];
    // a planned row entry expects exactly its rows: more is a size_overflow at the drain (coalesce)
    const std::uint64_t bytes = selected && e.row_bytes != 0 ? *selected * e.per_item * e.row_bytes : e.bytes;
    res_.push(e.hook, where[i], reserved_of(i), bytes, e.dynamic, e.row_bytes);
  }
  res_.advance(pos, p.size());
  return true;
}

}  // namespace ferry::d2h::detail
