// SPDX-License-Identifier: Apache-2.0
// Definitions of detail::producer<B> (declared in producer.hpp), row-selected capture (channel::capture_rows and
// capture_rows_deferred): the checks the CPU can make of a row_selection, the entry's reservation (every item the
// selection may hold: its CPU-known count, or the bound of a GPU-resolved one; row_entry_bytes, reserve_entry), the
// select_rows launch (kernels/d2h/select), and the row batch's gather arguments (gather_rows_publish: one launch per
// batch sharing a selection); both shapes are gather.hpp's rows_shape.
// Every row entry is a dynamic one: its kernel writes its size (or selection_error_size) into its size slot before
// the release that publishes it, and the drainer reads that slot only after the acquire (docs/design/d2h.md).
#pragma once

namespace ferry::d2h::detail {

/// The checks of a row capture the CPU can make; returns the entry's payload bound in bytes (row_entry_bytes of
/// the selection's item bound: at least 16).
template <ferry::backend::backend B>
std::uint64_t producer<B>::check_rows(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                                      const row_selection& sel, const char* what, const reducer* red,
                                      std::uint64_t width)
{
  FERRY_EXPECTS(src != nullptr && sel.indices != nullptr, ferry::logic_error,
                "d2h channel {}: hook {} expected a non-null source and selection, got {}", what, hook.value,
                src == nullptr ? "a null source" : "a null selection (indices / requests)");
  FERRY_EXPECTS(n_rows > 0 && row_bytes > 0, ferry::logic_error,
                "d2h channel {}: hook {} expected a [n_rows, row_bytes] source with both > 0, got [{}, {}]", what,
                hook.value, n_rows, row_bytes);
  FERRY_EXPECTS(sel.form != selection_form::rows || sel.index_bytes == 4 || sel.index_bytes == 8, ferry::logic_error,
                "d2h channel {}: hook {} expected int32 or int64 row indices (4 or 8 bytes), got {} bytes", what,
                hook.value, sel.index_bytes);
  FERRY_EXPECTS(sel.form == selection_form::rows || (sel.query_start_loc != nullptr && sel.n_requests > 0),
                ferry::logic_error,
                "d2h channel {}: hook {} expected query_start_loc and n_requests > 0 for a per-request selection, got "
                "{} and {}",
                what, hook.value, sel.query_start_loc == nullptr ? "null" : "non-null", sel.n_requests);
  FERRY_EXPECTS(sel.form != selection_form::window || (sel.window_begin >= 0 && sel.window_end > sel.window_begin),
                ferry::logic_error, "d2h channel {}: hook {} expected a window 0 <= begin < end, got [{}, {})", what,
                hook.value, sel.window_begin, sel.window_end);
  FERRY_EXPECTS(sel.device_count == nullptr || sel.max_count > 0, ferry::logic_error,
                "d2h channel {}: hook {} expected max_count > 0 with a device count, got 0", what, hook.value);
  const std::uint64_t limit = st_.cfg.ring_bytes;
  // the entry's items x per_item rows of row_bytes (a reduced entry: its records, reducer.hpp)
  const std::uint64_t items = red == nullptr || red->op != reduce_op::stats ? sel.item_bound() : 1;
  const std::uint64_t per_rec = red == nullptr ? sel.rows_per_item() : records_per_item(*red, sel.rows_per_item());
  const std::uint64_t per_item = per_rec == 0 ? 1 : per_rec;  // stats: one record for the entry
  const std::uint64_t out_row = red == nullptr ? row_bytes : record_bytes(*red, width);
  // every factor first: the product of user sizes must not wrap
  FERRY_EXPECTS(sel.item_bound() <= limit && sel.rows_per_item() <= limit && n_rows <= limit &&
                    (items == 0 || items * per_item <= limit / out_row),
                ferry::logic_error,
                "d2h channel {}: hook {} expected at most ring_bytes = {} bytes of {}, got {} items x {} {} x {} bytes",
                what, hook.value, limit, red == nullptr ? "rows" : "records", items, per_item,
                red == nullptr ? "rows" : "records", out_row);
  const std::uint64_t bytes = row_entry_bytes(items, per_item, out_row);
  check_entry(hook, bytes, entry_kind::dynamic, what);
  FERRY_EXPECTS(!write_open_, ferry::logic_error, "d2h channel {}: hook {} expected no open begin_write, got one", what,
                hook.value);
  return bytes;
}

/// The host snapshot rule (hold_source) for the arrays a selection kernel reads: with `snapshot` (a host-written
/// source in an eager forward on the host backend) the index / request list, query_start_loc and the device count
/// are copied now, as stream order makes it so on a GPU; `read` points at the copies.
template <ferry::backend::backend B>
row_batch producer<B>::hold_selection(const row_selection& sel, std::uint64_t n_rows, bool snapshot)
{
  row_batch r{sel, n_rows, sel, {}};
  if (!snapshot) { return r; }
  auto snap = [&](std::size_t k, const void* p, std::uint64_t n) {
    source_owner o;
    o.host_written = true;
    r.arrays[k] = hold_source<B>(p, n, std::move(o), false);
    return r.arrays[k].src;
  };
  r.read.indices = snap(0, sel.indices, sel.item_bound() * (sel.form == selection_form::rows ? sel.index_bytes : 4));
  if (sel.query_start_loc != nullptr) {
    r.read.query_start_loc =
        static_cast<const std::int32_t*>(snap(1, sel.query_start_loc, (sel.n_requests + 1ULL) * 4));
  }
  if (sel.device_count != nullptr) {
    r.read.device_count = static_cast<const std::int32_t*>(snap(2, sel.device_count, 4));
  }
  return r;
}

template <ferry::backend::backend B>
bool producer<B>::capture_rows(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                               const row_selection& sel, stream_view s, when_full full, source_owner owner)
{
  constexpr const char* what = "capture_rows";
  check_producer(s, what);
  const std::uint64_t bytes = check_rows(hook, src, n_rows, row_bytes, sel, what);
  auto who = [&] {
    return ferry::detail::format("hook {} ({} selected rows of {} bytes)", hook.value,
                                 sel.item_bound() * sel.rows_per_item(), row_bytes);
  };
  const std::optional<reserved_entry> r = reserve_entry(bytes, 1, full, s.handle(), who, what);
  if (!r) { return false; }
  // `owner` holds the source and the selection arrays until the kernel read them (retire).
  held_source h = hold_source<B>(src, n_rows * row_bytes, std::move(owner), capturing_);
  row_batch held = hold_selection(sel, n_rows, h.snapshot != nullptr);
  select_args a;
  a.dst = make_ref(r->reserved, entry_kind::dynamic);
  a.src = static_cast<const std::byte*>(h.src);
  a.n_rows = n_rows;
  a.row_bytes = row_bytes;
  a.sel = held.read;
  a.planned = capturing_ ? 1U : 0U;  // a replay's plan() may give its item count (forward_meta::selected)
  const gather_shape sh = rows_shape(st_.cfg, a, st_.sm_count);
  st_.launch.own(select_rows_kernel(typename B::tag{}), sh.blocks, sh.threads, s.handle(), a);
  retire(std::move(h), s.handle());
  for (auto& x : held.arrays) { st_.b.release_after(s.handle(), std::move(x.snapshot)); }
  commit_entry(hook, r->where, r->reserved, bytes, entry_kind::dynamic, s.handle(), false, row_bytes,
               sel.rows_per_item(), sel.item_bound());
  return true;
}

template <ferry::backend::backend B>
void producer<B>::capture_rows_deferred(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                                        const row_selection& sel, stream_view s, source_owner owner)
{
  constexpr const char* what = "capture_rows_deferred";
  check_producer(s, what);
  const std::uint64_t bytes = check_rows(hook, src, n_rows, row_bytes, sel, what);
  FERRY_EXPECTS(row_bytes <= 0xffffffffULL, ferry::logic_error,
                "d2h channel capture_rows_deferred: hook {} expected rows of at most 2^32 - 1 bytes, got {}",
                hook.value, row_bytes);
  record_rows_deferred(hook, src, row_bytes, bytes, deferred_rows{&sel, n_rows, row_bytes}, s, std::move(owner), what);
}

/// A row entry (capture_rows_deferred) or a reduced one (capture_reduced_deferred) into the deferred batch, after the
/// caller's checks: `src` of [part.n_rows, src_row_bytes], `bytes` its reservation bound; an empty batch starts with
/// the entry's selection (and reducer).
template <ferry::backend::backend B>
void producer<B>::record_rows_deferred(hook_id hook, const void* src, std::uint64_t src_row_bytes, std::uint64_t bytes,
                                       const deferred_rows& part, stream_view s, source_owner owner, const char* what)
{
  auto who = [&] {
    return ferry::detail::format("{} (hook {}, {} bytes, batch of {} recorded)", what, hook.value, bytes,
                                 deferred_.size());
  };
  auto source = [&] {  // after any flush record_deferred does: an empty batch starts with this selection
    held_source h = hold_source<B>(src, part.n_rows * src_row_bytes, std::move(owner), capturing_);
    if (deferred_.empty()) {
      row_batch b = hold_selection(*part.sel, part.n_rows, h.snapshot != nullptr);
      if (part.r != nullptr) { b.r = *part.r; }
      b.in = part.in;
      deferred_.start_rows(std::move(b));
    }
    return h;
  };
  (void)record_deferred(hook, bytes, blocking_policy(st_.cfg), s.handle(), who, source, false, what, part);
}

/// The arguments of a row batch's gather (deferred_batch::rows()) but its release part and test hook
/// (launch_deferred), and its shape `sh` (gather.hpp: set_gather_rows, rows_shape; a reduced batch's:
/// reduce_rows_shape).
template <ferry::backend::backend B>
void producer<B>::row_gather_args(gather_rows_args& a, gather_shape& sh) const
{
  const row_batch& rb = *deferred_.rows();
  a.dst = make_ref(0, entry_kind::dynamic);
  a.n_rows = rb.n_rows;
  a.sel = rb.read;
  a.planned = capturing_ ? 1U : 0U;  // a replay's plan() may give its item count (forward_meta::selected)
  set_gather_rows(a, deferred_.size(), [&](std::uint32_t i) {
    const auto& e = deferred_[i];
    return gather_row_entry{static_cast<const std::byte*>(e.source.src), e.row_bytes, e.reserved};
  });
  if (!rb.r) {
    sh = rows_shape(st_.cfg, a, st_.sm_count);
    return;
  }
  a.r = *rb.r;  // a reduced batch: row_bytes are its records', width its source rows' elements
  a.in = rb.in;
  for (std::uint32_t i = 0; i < a.n; ++i) { a.width[i] = deferred_[i].width; }
  sh = reduce_rows_shape(a, st_.sm_count);
}

}  // namespace ferry::d2h::detail
