// SPDX-License-Identifier: Apache-2.0
// The device side of a D2H channel: the device state block, the placement rule, and ring_ref, the
// trivially copyable view a kernel (ferry's copy kernel or a user kernel) uses to write one entry.
//
// Graph-safe placement without baked offsets ("two-slot cursor"):
//   device_state holds two cursors {phys, dyn_slot}. The k-th entry of a forward (parity = k % 2) reads
//   slot[parity], places itself with place_phys(), and exactly one thread writes slot[parity ^ 1] = {end, slot'}.
//   No thread of the same kernel reads the slot being written; the next kernel on the stream reads it
//   (the kernel boundary orders the write before the read). The forward-boundary kernel copies the last
//   slot into slot[0], so every forward (eager or a graph replay) starts at parity 0. The CPU mirrors the
//   same arithmetic (same sizes, place() on virtual positions) to fill the FIFO with the offsets the device
//   will use. The device keeps PHYSICAL offsets (and the size-slot index) already reduced, so a writer
//   never divides: a 64-bit `%` is a ~100-instruction software routine on the GPU, paid by every thread of
//   every copy kernel when the ring size is not a power of two.
//
// No fmt, no error.hpp: this header is compiled into device code.
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/detail/align.hpp>
#include <ferry/d2h/types.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ferry::d2h {

/// Every entry starts on a 16-byte boundary (16-byte vector stores; the ring base is 256-byte aligned).
inline constexpr std::uint64_t entry_alignment = 16;

using ferry::detail::align_up;  // `v` rounded up to a multiple of `a`

/// A placed entry, in monotonic virtual byte positions (physical offset = position % ring bytes).
struct placement {
  std::uint64_t start{0};
  std::uint64_t end{0};
};

/// Wrap rule (no straddle): an entry that would cross the physical end of the ring starts at the next
/// wrap instead; the skipped tail is padding, reclaimed with the entry. Neither the copy kernel nor the
/// drain ever splits an entry; the drain splits a coalesced copy only at the wrap.
FERRY_HD constexpr placement place(std::uint64_t pos, std::uint64_t reserved, std::uint64_t ring_bytes) noexcept
{
  // A power-of-two ring (the common configuration) avoids a 64-bit division in every copy kernel.
  const std::uint64_t phys = (ring_bytes & (ring_bytes - 1)) == 0 ? pos & (ring_bytes - 1) : pos % ring_bytes;
  const std::uint64_t start = phys + reserved > ring_bytes ? pos + (ring_bytes - phys) : pos;
  return {start, start + reserved};
}

/// The device-side placement rule, on physical offsets: where an entry of `reserved` bytes starts when the
/// ring's write offset is `phys` (in [0, ring_bytes)). Same decision as place(): phys == pos % ring_bytes.
FERRY_HD constexpr std::uint64_t place_phys(std::uint64_t phys, std::uint64_t reserved,
                                            std::uint64_t ring_bytes) noexcept
{
  return phys + reserved > ring_bytes ? 0 : phys;
}

/// A device cursor. Both fields are kept reduced (no division on the device):
///   phys      physical offset of the end of the last placed entry, in [0, ring_bytes); bit 63 (cursor_unplanned)
///             set: the forward is a graph launch that no plan() armed (the claim kernel, replay_token.cuh):
///             its writers store nothing and pass the cursor on unchanged
///   dyn_slot  low 32 bits: size slot of the next dynamic entry, in [0, size_slot_count) (0 without a size
///             ring); high 32 bits: the commit count (mod 2^32), +1 per commit. A missing commit shows as
///             slot[parity ^ 1] not one commit ahead of slot[parity] (the commit check, producer end_write).
struct alignas(16) cursor {
  std::uint64_t phys{0};
  std::uint64_t dyn_slot{0};
};

/// cursor::phys's bit that marks a forward no plan() armed (set by the claim kernel in slot[0], passed on by
/// every writer of the forward, cleared by its boundary release). Ring sizes are far below 2^63.
inline constexpr std::uint64_t cursor_unplanned = std::uint64_t{1} << 63;
/// Whether a writer holding cursor `c` may write: false inside a graph launch that no plan() armed.
FERRY_HD constexpr bool cursor_live(const cursor& c) noexcept { return (c.phys & cursor_unplanned) == 0; }

/// The size-slot index of a cursor's dyn_slot.
FERRY_HD constexpr std::uint64_t cursor_size_slot(std::uint64_t dyn_slot) noexcept { return dyn_slot & 0xffffffffULL; }
/// The commit count of a cursor's dyn_slot.
FERRY_HD constexpr std::uint32_t cursor_commits(std::uint64_t dyn_slot) noexcept
{
  return static_cast<std::uint32_t>(dyn_slot >> 32);
}

/// device_state::planned_items of a replay whose plan() gave no forward_meta::selected: its row entries take
/// their captured bound.
inline constexpr std::uint64_t no_planned_items = ~std::uint64_t{0};
/// The plan()s the replay token holds ahead of their launches (device_state::planned): one plan, one launch
/// needs one; more armed at once is reported (device_state::plan_overflow).
inline constexpr std::uint32_t planned_queue = 16;

/// Device memory, one per channel. `produced` is the GPU-local produced-entry counter; only the
/// publishing thread (one thread, stream-ordered) touches it. `gather_join` is the cross-block join counter
/// of a publishing gather kernel (acq_rel arrivals; the last block resets it before it publishes) and of a
/// one-entry row kernel (relaxed arrivals that carry the blocks' errors: kernels/detail/rows.cuh, entry_arrive).
/// The replay token (kernels/d2h/replay): `armed` counts plan()s whose replay has not started (+1 by the
/// arm kernel plan() enqueues on the replay's stream, -1 by the claim kernel, a captured forward's first
/// node); `launches` counts the graph launches the claim kernel saw; `skip` is set by a claim that found no
/// token (the releases of that forward publish nothing; the writers see cursor_unplanned instead) and cleared
/// by the forward's boundary release; `quiet` counts the tokens of replays launched while capture is disabled
/// (config::on_error): they skip the same way, unreported. Each token carries its plan()'s item count
/// (forward_meta::selected, or no_planned_items): the arm kernel queues it in `planned` (token k at
/// k % planned_queue, `claimed` tokens taken so far), the claim moves it into `planned_items`, where the
/// replay's row kernels read their placement. All stream-ordered, single-threaded.
struct alignas(128) device_state {
  cursor slot[2];
  std::uint64_t produced{0};
  std::uint32_t gather_join{0};
  std::uint32_t skip{0};
  std::uint64_t armed{0};
  std::uint64_t launches{0};
  std::uint32_t select_error{0};  ///< a block of the publishing row gather met an invalid item (reset by its last)
  std::uint32_t plan_overflow{0};  ///< an arm found planned_queue tokens armed: every later replay writes nothing
  std::uint64_t quiet{0};  ///< quiet tokens (a channel with capture disabled): the launch writes nothing, unreported
  std::uint64_t planned_items{no_planned_items};  ///< this replay's plan()'d items per row entry (its claim sets it)
  std::uint64_t claimed{0};                       ///< tokens claimed: the queue's read index
  std::uint64_t planned[planned_queue]{};         ///< the armed tokens' item counts, in arm order
};

/// The cursor slot's loads and stores on the GPU (CUDA, sm_80+) carry an L2 evict_last cache-policy hint: in a
/// model's forward each layer streams tens of MB of weights through L2 between two hooks, which evicts a line
/// touched once per hook, and every writer's first store waits for this load. One 128-byte line per channel is kept.
/// Elsewhere (HIP, host, older archs) a plain access. Ordinary weak accesses either way.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIP_DEVICE_COMPILE__)
#define FERRY_CURSOR_EVICT_LAST 1
/// The L2 evict_last cache policy of the cursor accesses.
__device__ inline std::uint64_t cursor_cache_policy() noexcept
{
  std::uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
#endif
FERRY_HD inline cursor load_cursor(const cursor* p) noexcept
{
#if defined(FERRY_CURSOR_EVICT_LAST)
  cursor c;
  const std::uint64_t pol = cursor_cache_policy();
  asm volatile("ld.global.L2::cache_hint.v2.u64 {%0, %1}, [%2], %3;"
               : "=l"(c.phys), "=l"(c.dyn_slot)
               : "l"(p), "l"(pol)
               : "memory");
  return c;
#else
  return *p;
#endif
}
FERRY_HD inline void store_cursor(cursor* p, cursor c) noexcept
{
#if defined(FERRY_CURSOR_EVICT_LAST)
  const std::uint64_t pol = cursor_cache_policy();
  asm volatile("st.global.L2::cache_hint.v2.u64 [%0], {%1, %2}, %3;" ::"l"(p), "l"(c.phys), "l"(c.dyn_slot), "l"(pol)
               : "memory");
#else
  *p = c;
#endif
}
/// A 4- or 8-byte element read with the cursor's hint where the cursor's accesses carry it (the row kernels'
/// selection arrays, kernels/detail/rows.cuh: a few lines read once a hook, as the cursor's); a plain load
/// elsewhere. Volatile, as load_cursor: it stays after the kernel's griddepcontrol.wait.
template <class T>
FERRY_HD inline T load_evict_last(const T* p) noexcept
{
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
#if defined(FERRY_CURSOR_EVICT_LAST)
  const std::uint64_t pol = cursor_cache_policy();
  if constexpr (sizeof(T) == 4) {
    std::uint32_t v;
    asm volatile("ld.global.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(pol) : "memory");
    return static_cast<T>(v);
  } else {
    std::uint64_t v;
    asm volatile("ld.global.L2::cache_hint.u64 %0, [%1], %2;" : "=l"(v) : "l"(p), "l"(pol) : "memory");
    return static_cast<T>(v);
  }
#else
  return *p;
#endif
}
#undef FERRY_CURSOR_EVICT_LAST
/// The forward boundary's normalization (a release after an odd number of entries): slot 1's cursor copied
/// into slot 0, where the next forward's first writer reads it.
FERRY_HD inline void normalize_cursor(device_state* st) noexcept
{
  store_cursor(&st->slot[0], load_cursor(&st->slot[1]));
}

/// The view a writer kernel uses for one entry. Trivially copyable: pass it by value to a kernel.
///   data()            where to write (any thread; a pure read of the current cursor slot)
///   offset()          the same, as a physical offset in the ring
///   capacity()        reserved bytes (the entry's upper bound)
///   commit()          exactly one thread of the writer grid, exactly once: advances the cursor
///   commit(actual)    same, for a dynamic entry: also writes the actual size into its size slot
///   live()            false inside a graph launch that no plan() armed: write nothing (commit() is still
///                     called: it passes the cursor on); ferry's own kernels test it with the cursor they load
/// The channel publishes the entry after the writer kernel (stream order is the join).
struct ring_ref {
  std::byte* ring{nullptr};
  device_state* state{nullptr};
  std::uint64_t* size_slots{nullptr};  ///< device view of the size ring (null without one)
  std::uint64_t ring_bytes{0};
  std::uint64_t reserved{0};
  std::uint32_t size_slot_count{0};
  std::uint32_t parity{0};
  std::uint32_t dynamic{0};

  [[nodiscard]] FERRY_HD std::uint64_t offset() const noexcept { return offset(load()); }
  [[nodiscard]] FERRY_HD std::byte* data() const noexcept { return ring + offset(); }
  [[nodiscard]] FERRY_HD std::uint64_t capacity() const noexcept { return reserved; }
  /// Whether this launch may write the entry (see cursor_unplanned). A user writer in a captured forward
  /// tests it before its stores.
  [[nodiscard]] FERRY_HD bool live() const noexcept { return cursor_live(load()); }

  FERRY_HD void commit() const noexcept { commit(load()); }
  /// For a dynamic entry. `actual` may exceed capacity(): the drain then rejects the entry (the writer
  /// must not have written beyond capacity()).
  FERRY_HD void commit(std::uint64_t actual) const noexcept { commit(load(), actual); }

  // The same operations on a cursor value read once (ferry's copy kernel reads the cursor once per thread
  // and commits from that value, so the committing thread issues no second, dependent load).
  /// The cursor this entry places itself from (one 16-byte load).
  [[nodiscard]] FERRY_HD cursor load() const noexcept { return load_cursor(&state->slot[parity]); }
  [[nodiscard]] FERRY_HD std::uint64_t offset(cursor c) const noexcept
  {
    return place_phys(c.phys & ~cursor_unplanned, reserved, ring_bytes);
  }
  /// The next cursor, written to slot[parity ^ 1]; an unplanned launch's cursor is passed on unchanged.
  FERRY_HD void commit(cursor c) const noexcept
  {
    if (!cursor_live(c)) {
      store_cursor(&state->slot[parity ^ 1U], c);
      return;
    }
    const std::uint64_t end = offset(c) + reserved;  // <= ring_bytes
    std::uint64_t slot = cursor_size_slot(c.dyn_slot);
    if (dynamic != 0) { slot = slot + 1 >= size_slot_count ? 0 : slot + 1; }
    const std::uint64_t commits = static_cast<std::uint32_t>(cursor_commits(c.dyn_slot) + 1U);
    store_cursor(&state->slot[parity ^ 1U], cursor{end == ring_bytes ? 0 : end, slot | commits << 32});
  }
  FERRY_HD void commit(cursor c, std::uint64_t actual) const noexcept
  {
    if (dynamic != 0 && size_slot_count != 0 && cursor_live(c)) { size_slots[cursor_size_slot(c.dyn_slot)] = actual; }
    commit(c);
  }
};

static_assert(std::is_trivially_copyable_v<ring_ref>);
static_assert(std::is_trivially_copyable_v<device_state>);
static_assert(sizeof(device_state) == 256, "device_state: two 128-byte lines (the cursor's first)");

}  // namespace ferry::d2h
