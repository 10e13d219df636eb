// SPDX-License-Identifier: Apache-2.0
// Definitions of detail::producer<B> (declared in producer.hpp), reduced capture (channel::capture_reduced): the
// checks the CPU can make of a reducer (reducer.hpp) and its input, the entry's reservation (check_rows of the
// records: the selection's item bound x records per item, or one stats record), the reduce_rows launch
// (kernels/d2h/reduce), one block per record at a time. The entry is a dynamic row entry whose rows are records
// (entry_view::row_bytes() = record_bytes): its kernel writes its size (or selection_error_size) into its size slot
// before the release that publishes it, as capture_rows (docs/design/d2h.md).
#pragma once

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
bool producer<B>::capture_reduced(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t width,
                                  reduce_input in, const row_selection& sel, const reducer& r, stream_view s,
                                  when_full full, source_owner owner)
{
  constexpr const char* what = "capture_reduced";
  check_producer(s, what);
  check_reducer(hook, width, r, what);
  const std::uint64_t row_bytes = width * input_bytes(in);
  const std::uint64_t bytes = check_rows(hook, src, n_rows, row_bytes, sel, what, &r, width);
  const std::uint64_t rec = record_bytes(r, width);
  auto who = [&] {
    return ferry::detail::format("hook {} ({} of {} selected rows of {} elements: {} bytes)", hook.value,
                                 reduce_op_name(r.op), sel.item_bound() * sel.rows_per_item(), width, bytes);
  };
  const std::optional<reserved_entry> got = reserve_entry(bytes, 1, full, s.handle(), who, what);
  if (!got) { return false; }
  held_source h = hold_source<B>(src, n_rows * row_bytes, std::move(owner), capturing_);
  row_batch held = hold_selection(sel, n_rows, h.snapshot != nullptr);
  reduce_args a;
  a.dst = make_ref(got->reserved, entry_kind::dynamic);
  a.src = static_cast<const std::byte*>(h.src);
  a.n_rows = n_rows;
  a.width = width;
  a.input = in;
  a.r = r;
  a.sel = held.read;
  // a replay's plan() may give its item count (forward_meta::selected); a stats record does not depend on it
  const bool stats = r.op == reduce_op::stats;
  a.planned = capturing_ && !stats ? 1U : 0U;
  const std::uint64_t records = records_of(r, sel.item_bound(), sel.rows_per_item());
  namespace rules = ferry::detail::launch_rules;
  const std::uint64_t blocks =
    std::clamp<std::uint64_t>(work_units(r, records, width), 1, rules::one_wave_blocks(st_.sm_count, reduce_threads));
  st_.launch.own(reduce_rows_kernel(typename B::tag{}, r.op), static_cast<std::uint32_t>(blocks), reduce_threads,
                 s.handle(), a);
  retire(std::move(h), s.handle());
  for (auto& x : held.arrays) { st_.b.release_after(s.handle(), std::move(x.snapshot)); }
  // a stats entry is one record whatever the items: no row plan (row_bytes 0 keeps its captured reservation)
  commit_entry(hook, got->where, got->reserved, bytes, entry_kind::dynamic, s.handle(), false, stats ? 0 : rec,
               records_per_item(r, sel.rows_per_item()), sel.item_bound());
  return true;
}

/// The checks of a reducer the CPU makes at the call (capture_reduced, capture_reduced_deferred).
template <ferry::backend::backend B>
void producer<B>::check_reducer(hook_id hook, std::uint64_t width, const reducer& r, const char* what) const
{
  FERRY_EXPECTS(width > 0 && width < (std::uint64_t{1} << 31), ferry::logic_error,
                "d2h channel {}: hook {} expected rows of 1 to 2^31 - 1 elements, got {}", what, hook.value, width);
  FERRY_EXPECTS(r.op != reduce_op::topk || (r.k >= 1 && r.k <= topk_max && r.k <= width), ferry::logic_error,
                "d2h channel {}: hook {} expected topk's k in [1, min(row width {}, {})], got {}", what, hook.value,
                width, topk_max, r.k);
  FERRY_EXPECTS(r.op == reduce_op::topk || r.k == 0, ferry::logic_error,
                "d2h channel {}: hook {} expected k = 0 for {}, got {}", what, hook.value, reduce_op_name(r.op), r.k);
}

/// capture_reduced recorded in the deferred batch: the checks and the reservation bound as capture_reduced's; the
/// batch shares its selection, reducer and input type (another starts a new batch), and launch_deferred makes its
/// records with ONE reduce_rows_publish (kernels/d2h/reduce/reduce_rows_publish.cuh).
template <ferry::backend::backend B>
void producer<B>::capture_reduced_deferred(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t width,
                                           reduce_input in, const row_selection& sel, const reducer& r, stream_view s,
                                           source_owner owner)
{
  constexpr const char* what = "capture_reduced_deferred";
  check_producer(s, what);
  check_reducer(hook, width, r, what);
  FERRY_EXPECTS(record_per_row(r), ferry::logic_error,
                "d2h channel capture_reduced_deferred: hook {} expected a reducer with one record per row (topk, "
                "fp8_e4m3), got {} (capture_reduced takes it)",
                hook.value, reduce_op_name(r.op));
  const std::uint64_t row_bytes = width * input_bytes(in);
  const std::uint64_t bytes = check_rows(hook, src, n_rows, row_bytes, sel, what, &r, width);
  record_rows_deferred(hook, src, row_bytes, bytes, deferred_rows{&sel, n_rows, record_bytes(r, width), &r, in, width},
                       s, std::move(owner), what);
}

}  // namespace ferry::d2h::detail
