// SPDX-License-Identifier: Apache-2.0
// The row kernels' device helpers (select_rows, gather_rows_publish; FERRY_HD, GPU and host backend):
//   select_items        the item count of a row_selection (CPU-known, or the GPU-resolved *device_count);
//   select_source_row   the source row of an entry's row, validated (-1: the item is invalid, never read);
//   select_request_row  its checks of a last_token or window item, given the request id (select_request) and
//                       wherever the caller holds the request's offsets (mean_record: staged in shared memory);
//   select_item_first   an item's first source row (its row j is that + j), or -1;
//   note_select_error   a block's invalid item OR-ed into device_state::select_error, before its arrival (the
//                       publishing row gather);
//   entry_arrive        a one-entry row kernel's step 3 (select_rows, reduce_rows): the arrival, its error in
//                       the count, and the last block's commit of the entry's size (or selection_error_size);
//   copy_row            one row (or chunk) by a whole block: 16-byte moves when aligned, else bytes (the host
//                       backend runs a block as one thread: one memcpy).
// A selection's arrays (indices, query_start_loc, device_count) are read with load_evict_last (ring_ref.hpp), the
// cursor's L2 hint: each layer between two hooks streams tens of MB through L2, and a plain load would go to DRAM
// for each of the two dependent steps (a request id, then its offsets) before the first row's load.
#pragma once

#include "gather_chain.cuh"  // join_arrive
#include "vector_copy.cuh"

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/row_selection.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::kernels::d2h {

using ferry::d2h::load_evict_last;

/// The number of items the entry holds; `ok` false when a GPU-resolved count is negative or above max_count.
FERRY_HD inline std::uint64_t select_items(const ferry::d2h::row_selection& s, bool& ok) noexcept
{
  if (s.device_count == nullptr) { return s.count; }
  const std::int32_t c = load_evict_last(s.device_count);
  ok = c >= 0 && static_cast<std::uint64_t>(c) <= s.max_count;
  return ok ? static_cast<std::uint64_t>(c) : 0;
}

/// The request id of item `i` of a last_token or window selection (indices[i]; select_request_row checks it).
FERRY_HD inline std::int32_t select_request(const ferry::d2h::row_selection& s, std::uint64_t i) noexcept
{
  return load_evict_last(static_cast<const std::int32_t*>(s.indices) + i);
}

/// query_start_loc[q] read from global memory (select_source_row's reads).
struct global_offsets {
  const std::int32_t* qsl;
  FERRY_HD std::int64_t operator()(std::uint32_t q) const noexcept { return load_evict_last(qsl + q); }
};

/// The checks of the last_token and window forms: the source row of row `j` (`per_item` rows an item) of request `q`,
/// whose offsets `off(q)`, `off(q + 1)` gives (query_start_loc's entries, from wherever the caller holds them), or -1
/// when the item is invalid (a request outside [0, n_requests), offsets outside [0, n_rows] or decreasing, a
/// window past the request's span, a last token of an empty request).
template <class Offsets>
FERRY_HD inline std::int64_t select_request_row(const ferry::d2h::row_selection& s, std::uint64_t n_rows,
                                                std::uint64_t j, std::uint64_t per_item, std::int32_t q,
                                                const Offsets& off) noexcept
{
  const auto n = static_cast<std::int64_t>(n_rows);
  if (q < 0 || static_cast<std::uint32_t>(q) >= s.n_requests) { return -1; }
  const std::int64_t lo = off(static_cast<std::uint32_t>(q));
  const std::int64_t hi = off(static_cast<std::uint32_t>(q) + 1U);
  if (lo < 0 || hi < lo || hi > n) { return -1; }
  if (s.form == ferry::d2h::selection_form::last_token) { return hi > lo ? hi - 1 : -1; }
  return lo + s.window_end <= hi ? lo + s.window_begin + static_cast<std::int64_t>(j % per_item) : -1;
}

/// The source row of the entry's row `j` (item j / rows_per_item), or -1 when its item is invalid.
FERRY_HD inline std::int64_t select_source_row(const ferry::d2h::row_selection& s, std::uint64_t n_rows,
                                               std::uint64_t j, std::uint64_t per_item) noexcept
{
  const std::uint64_t i = j / per_item;
  if (s.form == ferry::d2h::selection_form::rows) {
    const auto n = static_cast<std::int64_t>(n_rows);
    const std::int64_t r = s.index_bytes == 8 ? load_evict_last(static_cast<const std::int64_t*>(s.indices) + i)
                                              : load_evict_last(static_cast<const std::int32_t*>(s.indices) + i);
    return r >= 0 && r < n ? r : -1;
  }
  return select_request_row(s, n_rows, j, per_item, select_request(s, i), global_offsets{s.query_start_loc});
}

/// The source row of item `item`'s first row, or -1 when the item is invalid. Its row j < per_item is that row + j:
/// only the window form has per_item > 1, its rows are the request's consecutive tokens, and select_source_row's
/// checks are of the item, not of j.
FERRY_HD inline std::int64_t select_item_first(const ferry::d2h::row_selection& s, std::uint64_t n_rows,
                                               std::uint64_t item, std::uint64_t per_item) noexcept
{
  return select_source_row(s, n_rows, item * per_item, per_item);
}

/// A block that met an invalid item notes it (relaxed OR; its acq_rel arrival at the join counter, which
/// follows, orders it before the last block's read of the flag).
FERRY_HD inline void note_select_error(ferry::d2h::device_state* st) noexcept
{
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  atomicOr(&st->select_error, 1U);
#else
  std::atomic_ref<std::uint32_t>{st->select_error}.fetch_or(1U, std::memory_order_relaxed);
#endif
}

/// entry_arrive's join counter (device_state::gather_join): a block adds 1, and entry_join_error more when it
/// met an invalid item; the low 16 bits count the arrivals (launch_rules::max_wave_blocks), the high 16 the errors.
inline constexpr std::uint32_t entry_join_error = 1U << 16;

/// Step 3 of a one-entry row kernel by thread 0 of a block after its barrier: one relaxed fetch_add (device scope)
/// on the join counter carries both its arrival and its error, so the block whose add counts `nblk` arrivals read
/// every other block's error in the value it read (one modification order of one counter); it resets the
/// counter and commits the entry placed at `dst` from cursor `c`, the value of dst.load() the block read at its
/// start (slot[parity] is written by no kernel between that load and this commit, which writes slot[parity ^ 1]):
/// `size` bytes, or selection_error_size when a block met an invalid item or the count was refused. No fence:
/// the commit needs no other block's stores (its size and cursor are every block's same values; the entry's
/// bytes reach the drain through the release, a later kernel after the kernel boundary).
FERRY_HD inline void entry_arrive(const ferry::d2h::ring_ref& dst, ferry::d2h::cursor c, std::uint32_t nblk,
                                  bool block_error, bool count_ok, std::uint64_t size) noexcept
{
  const std::uint32_t add = 1U + (block_error ? entry_join_error : 0U);
  std::uint32_t old;
  if (!join_arrive<std::memory_order_relaxed>(dst.state->gather_join, add, nblk, entry_join_error - 1U, old)) {
    return;
  }
  const bool bad = !count_ok || block_error || old >= entry_join_error;
  dst.commit(c, bad ? ferry::d2h::selection_error_size : size);
}

/// `bytes` from `from` to `to` by thread `t` of the block's `nt`: 16-byte moves when `vec` (both 16-byte aligned,
/// bytes a multiple of 16), else bytes. The host backend's block is one thread: one memcpy.
FERRY_HD_INLINE void copy_row(std::byte* to, const std::byte* from, std::uint64_t bytes, bool vec, std::uint32_t t,
                              std::uint32_t nt) noexcept
{
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  if (vec) {
    const auto* s = reinterpret_cast<const vec16*>(from);
    auto* d = reinterpret_cast<vec16*>(to);
    for (std::uint64_t k = t; k < bytes / 16; k += nt) { d[k] = s[k]; }
  } else {
    copy_tail(to, from, t, bytes, nt);
  }
#else
  (void)vec;
  (void)t;
  (void)nt;
  std::memcpy(to, from, bytes);
#endif
}

}  // namespace ferry::kernels::d2h
