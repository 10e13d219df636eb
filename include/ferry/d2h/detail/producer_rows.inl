// SPDX-License-Identifier: Apache-2.0
// Definitions of detail::producer<B> (declared in producer.hpp), row-selected capture (channel::capture_rows and
// capture_rows_deferred): the checks the CPU can make of a row_selection, the entry's reservation (every item the
// selection may hold: its CPU-known count, or the bound of a GPU-resolved one), the select_rows launch
// (kernels/d2h/select), and the row batch's gather (gather_rows_publish: one launch per batch sharing a selection).
// Every row entry is a dynamic one: its kernel writes its size (or selection_error_size) into its size slot before
// the release that publishes it, and the drainer reads that slot only after the acquire (docs/design/d2h.md).
#pragma once

namespace ferry::d2h::detail {

/// The checks of a row capture the CPU can make; returns the entry's payload bound in bytes (at least 16).
template <ferry::backend::backend B>
std::uint64_t producer<B>::check_rows(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                                      const row_selection& sel, const char* what)
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
  const std::uint64_t items = sel.item_bound();
  const std::uint64_t per_item = sel.rows_per_item();
  const std::uint64_t limit = st_.cfg.ring_bytes;
  // every factor first: the product of user sizes must not wrap
  FERRY_EXPECTS(items <= limit && per_item <= limit && n_rows <= limit && (items == 0 || items * per_item <= limit / row_bytes),
                ferry::logic_error,
                "d2h channel {}: hook {} expected at most ring_bytes = {} bytes of rows, got {} items x {} rows x {} bytes",
                what, hook.value, limit, items, per_item, row_bytes);
  const std::uint64_t bytes = std::max<std::uint64_t>(items * per_item * row_bytes, entry_alignment);
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
    r.read.query_start_loc = static_cast<const std::int32_t*>(snap(1, sel.query_start_loc, (sel.n_requests + 1ULL) * 4));
  }
  if (sel.device_count != nullptr) { r.read.device_count = static_cast<const std::int32_t*>(snap(2, sel.device_count, 4)); }
  return r;
}

template <ferry::backend::backend B>
bool producer<B>::capture_rows(hook_id hook, const void* src, std::uint64_t n_rows, std::uint64_t row_bytes,
                               const row_selection& sel, stream_view s, when_full full, source_owner owner)
{
  constexpr const char* what = "capture_rows";
  check_producer(s, what);
  const std::uint64_t bytes = check_rows(hook, src, n_rows, row_bytes, sel, what);
  const std::uint64_t rows = sel.item_bound() * sel.rows_per_item();
  const std::uint64_t reserved = align_up(bytes, entry_alignment);
  auto who = [&] { return ferry::detail::format("hook {} ({} selected rows of {} bytes)", hook.value, rows, row_bytes); };
  if (!fits_after_deferred(reserved, 1, full, s.handle(), who)) { return false; }
  flush_deferred(s.handle(), false, what);  // entry order: the recorded deferred entries are copied first
  placement p{};
  if (!capturing_) {
    p = place(res_.head(), reserved, st_.cfg.ring_bytes);
    if (!wait_for_space(p.end, 1, 1, full, s.handle(), who)) { return false; }
  }
  // `owner` holds the source and the selection arrays until the kernel read them (retire).
  held_source h = hold_source<B>(src, n_rows * row_bytes, std::move(owner), capturing_);
  row_batch held = hold_selection(sel, n_rows, h.snapshot != nullptr);
  select_args a;
  a.dst = make_ref(reserved, entry_kind::dynamic);
  a.src = static_cast<const std::byte*>(h.src);
  a.n_rows = n_rows;
  a.row_bytes = row_bytes;
  a.sel = held.read;
  a.vec = row_bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.src) % 16 == 0 ? 1U : 0U;
  a.planned = capturing_ ? 1U : 0U;  // a replay's plan() may give its item count (forward_meta::selected)
  namespace rules = ferry::detail::launch_rules;
  const auto threads = static_cast<std::uint32_t>(rules::block_threads(st_.cfg.tuning.copy_block_threads));
  const std::uint64_t wave = rules::one_wave_blocks(st_.sm_count, threads);
  const auto blocks = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(rows, 1, wave));
  st_.launch.own(select_rows_kernel(typename B::tag{}), blocks, threads, s.handle(), a);
  retire(std::move(h), s.handle());
  for (auto& x : held.arrays) { st_.b.release_after(s.handle(), std::move(x.snapshot)); }
  commit_entry(hook, p, reserved, bytes, entry_kind::dynamic, s.handle(), false, row_bytes, sel.rows_per_item(),
               sel.item_bound());
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
                "d2h channel capture_rows_deferred: hook {} expected rows of at most 2^32 - 1 bytes, got {}", hook.value,
                row_bytes);
  auto who = [&] {
    return ferry::detail::format("capture_rows_deferred (hook {}, {} bytes, batch of {} recorded)", hook.value, bytes,
                                 deferred_.size());
  };
  auto source = [&] {  // after any flush record_deferred does: an empty batch starts with this selection
    held_source h = hold_source<B>(src, n_rows * row_bytes, std::move(owner), capturing_);
    if (deferred_.empty()) { deferred_.start_rows(hold_selection(sel, n_rows, h.snapshot != nullptr)); }
    return h;
  };
  const deferred_rows part{&sel, n_rows, row_bytes};
  (void)record_deferred(hook, bytes, blocking_policy(st_.cfg), s.handle(), who, source, false, what, part);
}

/// The row gather's work item: at most this many bytes of one row (a wider row is split into chunks).
inline constexpr std::uint32_t row_gather_chunk = 16 << 10;

/// The arguments of a row batch's gather (deferred_batch::rows()) from the batch and `rel` (the release part
/// launch_deferred decided), and its shape `sh`: (entry, row) work items over at most one wave of blocks, each
/// block as wide as the widest row's 16-byte vectors (32 .. copy_block_threads threads).
template <ferry::backend::backend B>
gather_rows_args producer<B>::row_gather_args(const gather_rows_args& rel, std::uint32_t n, gather_shape& sh) const
{
  const row_batch& rb = *deferred_.rows();
  gather_rows_args a = rel;
  a.dst = make_ref(0, entry_kind::dynamic);
  a.n = n;
  a.n_rows = rb.n_rows;
  a.sel = rb.read;
  a.pre[0] = 0;
  a.cpre[0] = 0;
  a.vec = 1;
  a.chunk_bytes = row_gather_chunk;
  a.planned = capturing_ ? 1U : 0U;  // a replay's plan() may give its item count (forward_meta::selected)
  a.rpre16_ok = 1;  // the planned prefix sums in closed form: every row a 16-byte multiple, the sums in 32 bits
  a.rpre16[0] = 0;
  std::uint64_t widest = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto& e = deferred_[i];
    a.src[i] = static_cast<const std::byte*>(e.source.src);
    a.row_bytes[i] = static_cast<std::uint32_t>(e.row_bytes);
    a.pre[i + 1] = a.pre[i] + e.reserved;
    const std::uint64_t r16 = std::uint64_t{a.rpre16[i]} + e.row_bytes / 16;
    if (e.row_bytes % 16 != 0 || r16 > 0xffffffffULL) { a.rpre16_ok = 0; }
    a.rpre16[i + 1] = static_cast<std::uint32_t>(r16);
    a.cpre[i + 1] = a.cpre[i] + static_cast<std::uint32_t>((e.row_bytes + row_gather_chunk - 1) / row_gather_chunk);
    widest = std::max(widest, std::min<std::uint64_t>(e.row_bytes, row_gather_chunk));
    if (e.row_bytes % 16 != 0 || reinterpret_cast<std::uintptr_t>(a.src[i]) % 16 != 0) { a.vec = 0; }
  }
  namespace rules = ferry::detail::launch_rules;
  const auto cap = static_cast<std::uint64_t>(rules::block_threads(st_.cfg.tuning.copy_block_threads));
  sh.threads = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((widest / 16 + 31) / 32 * 32, 32, cap));
  const std::uint64_t wave = rules::one_wave_blocks(st_.sm_count, sh.threads);
  const std::uint64_t work = std::uint64_t{a.cpre[n]} * rb.sel.item_bound() * rb.sel.rows_per_item();
  sh.blocks = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(work, 1, wave));
  return a;
}

}  // namespace ferry::d2h::detail
