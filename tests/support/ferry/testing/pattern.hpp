// SPDX-License-Identifier: Apache-2.0
// Sequence-derived data: every 64-bit word is a function of (sequence, word index), so a torn, stale or
// misplaced word is detected by recomputing it. Used by tests, benchmarks and the probe kernels.
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::testing {

FERRY_HD constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept
{
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// Never zero for any (seq, i), so a word left at zero is always detected.
FERRY_HD constexpr std::uint64_t pattern_word(std::uint64_t seq, std::uint64_t i) noexcept
{
  const std::uint64_t w = splitmix64((seq << 24) ^ i ^ (seq >> 40));
  return w == 0 ? 0x1ULL : w;
}

/// Byte `b` of the sequence-derived stream (for sizes that are not a multiple of 8).
FERRY_HD constexpr std::uint8_t pattern_byte(std::uint64_t seq, std::uint64_t b) noexcept
{
  return static_cast<std::uint8_t>(pattern_word(seq, b / 8) >> ((b % 8) * 8));
}

/// Host side: byte offset of the first part of `n` bytes at `p` that differs from the sequence-derived stream
/// of `seq` (word-aligned offsets compare whole 64-bit words, the tail byte by byte), or `n` when all match.
/// An offset below `n / 8 * 8` is the start of the first mismatching word.
inline std::uint64_t first_pattern_mismatch(const std::byte* p, std::uint64_t n, std::uint64_t seq) noexcept
{
  const std::uint64_t words = n / 8;
  for (std::uint64_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    if (w != pattern_word(seq, i)) { return i * 8; }
  }
  for (std::uint64_t i = words * 8; i < n; ++i) {
    if (static_cast<std::uint8_t>(p[i]) != pattern_byte(seq, i)) { return i; }
  }
  return n;
}

}  // namespace ferry::testing
