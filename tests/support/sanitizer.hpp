// SPDX-License-Identifier: Apache-2.0
// Test support: whether this test binary runs under ThreadSanitizer, and the D2H faults (mutants, set through
// ferry::testing::d2h_access) a test may run there. A mutant of the D2H channel removes an ordering edge on purpose (drain without acquire,
// reclaim before the copy completed, ...): on the host backend that IS a data race, which TSan reports and
// stops on. Under TSan the tests therefore run their correct half only; the plain build runs both halves and
// requires the checker to catch each mutant.
#pragma once

#include <ferry/d2h/detail/test_hooks.hpp>

#include <vector>

namespace ferry::test {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool under_tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool under_tsan = true;
#else
inline constexpr bool under_tsan = false;
#endif
#else
inline constexpr bool under_tsan = false;
#endif

/// {none, mutant}, or {none} under TSan (see above).
inline std::vector<ferry::d2h::detail::debug_fault> with_mutant(ferry::d2h::detail::debug_fault mutant)
{
  if (under_tsan) { return {ferry::d2h::detail::debug_fault::none}; }
  return {ferry::d2h::detail::debug_fault::none, mutant};
}

}  // namespace ferry::test
