// SPDX-License-Identifier: Apache-2.0
// Definitions of detail::producer<B> (declared in producer.hpp), row-selected capture (channel::capture_rows):
// the checks the CPU can make of a row_selection, the entry's reservation (every item the selection may hold:
// its CPU-known count, or the bound of a GPU-resolved one), and the select_rows launch (kernels/d2h/select).
// The entry is a dynamic one: the kernel writes its size (or selection_error_size) into its size slot before
// the release that publishes it, and the drainer reads that slot only after the acquire (docs/design/d2h.md).
#pragma once

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
bool producer<B>::capture_rows(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                               const row_selection& sel, stream_view s, when_full full, source_owner owner)
{
  constexpr const char* what = "capture_rows";
  check_producer(s, what);
  FERRY_EXPECTS(src != nullptr && sel.indices != nullptr, ferry::logic_error,
                "d2h channel capture_rows: hook {} expected a non-null source and selection, got {}", hook.value,
                src == nullptr ? "a null source" : "a null selection (indices / requests)");
  FERRY_EXPECTS(n_rows > 0 && row_bytes > 0, ferry::logic_error,
                "d2h channel capture_rows: hook {} expected a [n_rows, row_bytes] source with both > 0, got [{}, {}]",
                hook.value, n_rows, row_bytes);
  FERRY_EXPECTS(sel.form != selection_form::rows || sel.index_bytes == 4 || sel.index_bytes == 8, ferry::logic_error,
                "d2h channel capture_rows: hook {} expected int32 or int64 row indices (4 or 8 bytes), got {} bytes",
                hook.value, sel.index_bytes);
  FERRY_EXPECTS(sel.form == selection_form::rows || (sel.query_start_loc != nullptr && sel.n_requests > 0),
                ferry::logic_error,
                "d2h channel capture_rows: hook {} expected query_start_loc and n_requests > 0 for a per-request "
                "selection, got {} and {}",
                hook.value, sel.query_start_loc == nullptr ? "null" : "non-null", sel.n_requests);
  FERRY_EXPECTS(sel.form != selection_form::window || (sel.window_begin >= 0 && sel.window_end > sel.window_begin),
                ferry::logic_error,
                "d2h channel capture_rows: hook {} expected a window 0 <= begin < end, got [{}, {})", hook.value,
                sel.window_begin, sel.window_end);
  FERRY_EXPECTS(sel.device_count == nullptr || sel.max_count > 0, ferry::logic_error,
                "d2h channel capture_rows: hook {} expected max_count > 0 with a device count, got 0", hook.value);
  const std::uint64_t items = sel.item_bound();
  const std::uint64_t per_item = sel.rows_per_item();
  const std::uint64_t limit = st_.cfg.ring_bytes;
  // every factor first: the product of user sizes must not wrap
  FERRY_EXPECTS(items <= limit && per_item <= limit && (items == 0 || items * per_item <= limit / row_bytes),
                ferry::logic_error,
                "d2h channel capture_rows: hook {} expected at most ring_bytes = {} bytes of rows, got {} items x {} rows "
                "x {} bytes",
                hook.value, limit, items, per_item, row_bytes);
  const std::uint64_t bytes = std::max<std::uint64_t>(items * per_item * row_bytes, entry_alignment);
  check_entry(hook, bytes, entry_kind::dynamic, what);
  FERRY_EXPECTS(!write_open_, ferry::logic_error, "d2h channel capture_rows: hook {} expected no open begin_write, got one",
                hook.value);
  const std::uint64_t reserved = align_up(bytes, entry_alignment);
  auto who = [&] { return ferry::detail::format("hook {} ({} selected rows of {} bytes)", hook.value, items * per_item, row_bytes); };
  if (!fits_after_deferred(reserved, 1, full, s.handle(), who)) { return false; }
  flush_deferred(s.handle(), false, what);  // entry order: the recorded deferred entries are copied first
  placement p{};
  if (!capturing_) {
    p = place(res_.head(), reserved, st_.cfg.ring_bytes);
    if (!wait_for_space(p.end, 1, 1, full, s.handle(), who)) { return false; }
  }
  // `owner` holds the source and the selection arrays until the kernel read them (retire); the host snapshot
  // rule (hold_source) applies to every array the kernel reads: a host-written source and selection are
  // copied at the call in an eager forward on the host backend, as stream order makes it so on a GPU.
  held_source h = hold_source<B>(src, n_rows * row_bytes, std::move(owner), capturing_);
  row_selection read = sel;
  std::array<held_source, 3> arrays{};
  if (h.snapshot) {
    auto snap = [&](std::size_t k, const void* p, std::uint64_t n) {
      source_owner o;
      o.host_written = true;
      arrays[k] = hold_source<B>(p, n, std::move(o), false);
      return arrays[k].src;
    };
    read.indices = snap(0, sel.indices, items * (sel.form == selection_form::rows ? sel.index_bytes : 4));
    if (sel.query_start_loc != nullptr) {
      read.query_start_loc = static_cast<const std::int32_t*>(snap(1, sel.query_start_loc, (sel.n_requests + 1ULL) * 4));
    }
    if (sel.device_count != nullptr) { read.device_count = static_cast<const std::int32_t*>(snap(2, sel.device_count, 4)); }
  }
  select_args a;
  a.dst = make_ref(reserved, entry_kind::dynamic);
  a.src = static_cast<const std::byte*>(h.src);
  a.n_rows = n_rows;
  a.row_bytes = row_bytes;
  a.sel = read;
  a.vec = row_bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.src) % 16 == 0 ? 1U : 0U;
  namespace rules = ferry::detail::launch_rules;
  const auto threads = static_cast<std::uint32_t>(rules::block_threads(st_.cfg.copy_block_threads));
  const std::uint64_t wave = rules::one_wave_blocks(st_.sm_count, threads);
  const auto blocks = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(items * per_item, 1, wave));
  st_.launch.own(select_rows_kernel(typename B::tag{}), blocks, threads, s.handle(), a);
  retire(std::move(h), s.handle());
  for (auto& x : arrays) { st_.b.release_after(s.handle(), std::move(x.snapshot)); }
  commit_entry(hook, p, reserved, bytes, entry_kind::dynamic, s.handle(), false, row_bytes);
  return true;
}

}  // namespace ferry::d2h::detail
