// SPDX-License-Identifier: Apache-2.0
// CRC-32 (IEEE 802.3, the polynomial of zlib, gzip and PNG: Python's zlib.crc32 computes the same value),
// slicing by 8: what a sink records per forward so that a reader finds corrupted bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace ferry::sink::detail {

struct crc32_tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  constexpr crc32_tables()
  {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) { c = (c & 1U) != 0 ? 0xEDB88320U ^ (c >> 1) : c >> 1; }
      t[0][i] = c;
    }
    for (std::size_t s = 1; s < 8; ++s) {
      for (std::size_t i = 0; i < 256; ++i) { t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFU]; }
    }
  }
};
inline constexpr crc32_tables crc32_table{};

/// The CRC-32 of `n` bytes at `p` continuing from `crc` (start with 0): crc32(ab) == crc32(b, n_b, crc32(a)).
[[nodiscard]] inline std::uint32_t crc32(const void* p, std::size_t n, std::uint32_t crc = 0) noexcept
{
  const auto& t = crc32_table.t;
  const auto* b = static_cast<const unsigned char*>(p);
  std::uint32_t c = ~crc;
  for (; n >= 8; n -= 8, b += 8) {
    const std::uint32_t lo = c ^ (std::uint32_t{b[0]} | std::uint32_t{b[1]} << 8 | std::uint32_t{b[2]} << 16 |
                                  std::uint32_t{b[3]} << 24);
    c = t[7][lo & 0xFFU] ^ t[6][(lo >> 8) & 0xFFU] ^ t[5][(lo >> 16) & 0xFFU] ^ t[4][lo >> 24] ^ t[3][b[4]] ^
        t[2][b[5]] ^ t[1][b[6]] ^ t[0][b[7]];
  }
  for (; n > 0; --n, ++b) { c = t[0][(c ^ *b) & 0xFFU] ^ (c >> 8); }
  return ~c;
}

}  // namespace ferry::sink::detail
