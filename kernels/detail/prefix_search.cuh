// SPDX-License-Identifier: Apache-2.0
// The prefix-sum lookup of the gather kernels (FERRY_HD, GPU and host backend): which range of a nondecreasing
// prefix table holds a position. gather_publish finds a block's entry in first_block (gather_entry_of),
// gather_rows_publish a work item's entry in cpre (gather_rows_at).
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD

#include <cstdint>

namespace ferry::kernels {

/// The i in [0, n) with pre[i] <= u < pre[i + 1], by binary search of the nondecreasing `pre[0..n]` (pre[0] <= u <
/// pre[n]); `i` itself when every range holds one position (pre[n] == n, the common case: pre[i] == i). `Prefix`:
/// an array of the kernel's parameters, indexed in place (a pointer to kernel parameters held in a variable would
/// put the whole argument block in local memory).
template <class Prefix>
FERRY_HD constexpr std::uint32_t prefix_find(const Prefix& pre, std::uint32_t n, std::uint64_t u) noexcept
{
  if (pre[n] == n) { return static_cast<std::uint32_t>(u); }
  std::uint32_t lo = 0;
  std::uint32_t hi = n;  // pre[lo] <= u < pre[hi]
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (pre[mid] <= u) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace ferry::kernels
