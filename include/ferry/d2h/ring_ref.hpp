// SPDX-License-Identifier: Apache-2.0
// The device side of a D2H channel: the device state block, the placement rule, and ring_ref, the
// trivially copyable view a kernel (ferry's copy kernel or a user kernel) uses to write one entry.
//
// Graph-safe placement without baked offsets ("two-slot cursor"):
//   device_state holds two cursors {pos, dyn}. The k-th entry of a forward (parity = k % 2) reads
//   slot[parity], places itself with place(), and exactly one thread writes slot[parity ^ 1] = {end, dyn'}.
//   No thread of the same kernel reads the slot being written; the next kernel on the stream reads it
//   (the kernel boundary orders the write before the read). The forward-boundary kernel copies the last
//   slot into slot[0], so every forward (eager or a graph replay) starts at parity 0. The CPU mirrors the
//   same arithmetic (same sizes, same place()) to fill the FIFO with the offsets the device will use.
//
// No fmt, no error.hpp: this header is compiled into device code.
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/d2h/types.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ferry::d2h {

/// Every entry starts on a 16-byte boundary (16-byte vector stores; the ring base is 256-byte aligned).
inline constexpr std::uint64_t entry_alignment = 16;

FERRY_HD constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) noexcept { return (v + a - 1) / a * a; }

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

struct cursor {
  std::uint64_t pos{0};  ///< virtual end of the last placed entry
  std::uint64_t dyn{0};  ///< dynamic entries placed so far (size-slot counter)
};

/// Device memory, one per channel. `produced` is the GPU-local produced-entry counter; only the
/// publishing thread (one thread, stream-ordered) touches it.
struct alignas(128) device_state {
  cursor slot[2];
  std::uint64_t produced{0};
};

/// The view a writer kernel uses for one entry. Trivially copyable: pass it by value to a kernel.
///   data()            where to write (any thread; a pure read of the current cursor slot)
///   capacity()        reserved bytes (the entry's upper bound)
///   commit()          exactly one thread of the writer grid, exactly once: advances the cursor
///   commit(actual)    same, for a dynamic entry: also writes the actual size into its size slot
/// The channel publishes the entry after the writer kernel (stream order is the join).
struct ring_ref {
  std::byte* ring{nullptr};
  std::uint64_t ring_bytes{0};
  device_state* state{nullptr};
  std::uint64_t* size_slots{nullptr};  ///< device view of the size ring (null without one)
  std::uint64_t size_slot_count{0};
  std::uint64_t reserved{0};
  std::uint32_t parity{0};
  std::uint32_t dynamic{0};

  [[nodiscard]] FERRY_HD placement where() const noexcept { return place(state->slot[parity].pos, reserved, ring_bytes); }
  [[nodiscard]] FERRY_HD std::byte* data() const noexcept
  {
    const std::uint64_t start = where().start;
    return ring + ((ring_bytes & (ring_bytes - 1)) == 0 ? start & (ring_bytes - 1) : start % ring_bytes);
  }
  [[nodiscard]] FERRY_HD std::uint64_t capacity() const noexcept { return reserved; }

  FERRY_HD void commit() const noexcept
  {
    const cursor c = state->slot[parity];
    state->slot[parity ^ 1U] = cursor{place(c.pos, reserved, ring_bytes).end, c.dyn + dynamic};
  }
  /// For a dynamic entry. `actual` may exceed capacity(): the drain then rejects the entry (the writer
  /// must not have written beyond capacity()).
  FERRY_HD void commit(std::uint64_t actual) const noexcept
  {
    if (dynamic != 0 && size_slot_count != 0) { size_slots[state->slot[parity].dyn % size_slot_count] = actual; }
    commit();
  }
};

static_assert(std::is_trivially_copyable_v<ring_ref>);
static_assert(std::is_trivially_copyable_v<device_state>);

}  // namespace ferry::d2h
