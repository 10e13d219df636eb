// SPDX-License-Identifier: Apache-2.0
// The drain's coalescing rule as a pure function: which FIFO entries the next D2H copies. No backend, no
// state: the drainer passes what it sees (the readable FIFO entries, the published_head it acquired, the
// size slots it may read after that acquire, the room left in staging). Unit-tested in tests/d2h.
#pragma once

#include <ferry/d2h/detail/entry_meta.hpp>

#include <cstddef>
#include <cstdint>

namespace ferry::d2h::detail {

/// The next run: entries [0, count) of the readable FIFO, copied by ONE D2H of `bytes` bytes from the ring
/// position of entry 0 (count == 0: nothing can be copied now).
struct run_plan {
  std::size_t count{0};
  std::uint64_t bytes{0};      ///< bytes of the D2H: the span from entry 0's start to the end of the last payload
  std::uint64_t last_size{0};  ///< payload bytes of the last entry (a dynamic entry's GPU-resolved size)
  bool overflow{false};        ///< the run is ONE dynamic entry whose size exceeds its reservation: no copy
  friend constexpr bool operator==(const run_plan&, const run_plan&) = default;
};

/// The run that starts at the oldest readable entry. `peek(i)` is the i-th readable entry (i < avail),
/// `head` the published_head the caller acquired (entries with seq >= head are not published: never copied),
/// `size_of(e)` the size slot of a dynamic entry (read only for entries below `head`), `staging_fits(n)`
/// whether staging has room for a run of n bytes. A run is contiguous in the ring and never crosses the wrap
/// (an entry at physical offset 0 starts a new run); a dynamic entry whose size is not the `bytes` the CPU asked
/// for ends its run (its size ends the useful bytes); one whose size exceeds its reservation is a run of its
/// own, with no copy, and so is a row entry (row_bytes > 0) whose size exceeds its `bytes`, the rows the CPU
/// reserved (a plan()'s forward_meta::selected: exactly those rows; the kernel wrote no more).
template <class Peek, class SizeOf, class StagingFits>
[[nodiscard]] constexpr run_plan coalesce(std::size_t avail, Peek&& peek, std::uint64_t head, std::uint64_t ring_bytes,
                                          SizeOf&& size_of, StagingFits&& staging_fits)
{
  run_plan r;
  for (std::size_t i = 0; i < avail; ++i) {
    const entry_meta& e = peek(i);
    if (e.seq >= head) { break; }
    std::uint64_t len = e.bytes;
    bool over = false;
    if (e.dynamic) {
      len = size_of(e);
      over = len > e.reserved || (e.row_bytes != 0 && len > e.bytes);
    }
    if (i > 0) {
      const entry_meta& prev = peek(i - 1);
      const bool contiguous = e.start == prev.start + prev.reserved && e.start % ring_bytes != 0;
      if (!contiguous || over) { break; }
    }
    if (over) { return run_plan{1, 0, len, true}; }  // i == 0: rejected, its own run
    const std::uint64_t run_bytes = i == 0 ? len : (e.start - peek(0).start) + len;
    if (!staging_fits(run_bytes)) { break; }  // the consumer has not released enough views yet
    r = run_plan{i + 1, run_bytes, len, false};
    // A dynamic entry shorter than the bytes the CPU asked for ends its run (its size ends the useful bytes);
    // one that filled them (capture_rows with a CPU-known count) lies like a fixed entry: the run goes on.
    if (e.dynamic && len != e.bytes) { break; }
  }
  return r;
}

}  // namespace ferry::d2h::detail
