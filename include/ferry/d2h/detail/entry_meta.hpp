// SPDX-License-Identifier: Apache-2.0
// The FIFO record between the producer and the drainer: everything the drain needs about one entry,
// known on the CPU when the entry is reserved (eager: after its writer was launched; graph: at plan()).
#pragma once

#include <atomic>
#include <cstdint>

namespace ferry::d2h::detail {

/// One FIFO record.
struct entry_meta {
  std::uint64_t seq{0};
  std::uint64_t start{0};     ///< virtual ring position (physical = start % ring bytes)
  std::uint64_t reserved{0};  ///< ring bytes reserved (16-byte multiple)
  std::uint64_t bytes{0};     ///< static payload size (dynamic: read from the size slot after the acquire)
  std::uint64_t slot{0};      ///< dynamic entries: index into the size ring (dyn counter % slots)
  std::uint32_t hook{0};
  bool dynamic{false};
  std::uint64_t forward{0};    ///< the forward's index in the channel (forward_log.hpp: its metadata)
  std::uint64_t row_bytes{0};  ///< capture_rows: bytes per row (0: not a row entry)
};

/// a = max(a, v) (relaxed; statistics only).
template <class T>
void atomic_max(std::atomic<T>& a, T v) noexcept
{
  T cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace ferry::d2h::detail
