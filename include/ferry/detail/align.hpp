// SPDX-License-Identifier: Apache-2.0
// ferry::detail::align_up: the one rounding-up of a size to an alignment, for both sides and device code
// (the D2H ring's entry alignment, the H2D arena's).
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD

#include <cstdint>

namespace ferry::detail {

/// `v` rounded up to a multiple of `a` (a > 0).
FERRY_HD constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) noexcept { return (v + a - 1) / a * a; }

}  // namespace ferry::detail
