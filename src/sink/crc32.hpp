// SPDX-License-Identifier: Apache-2.0
// CRC-32 (IEEE 802.3, the polynomial of zlib, gzip and PNG: Python's zlib.crc32 computes the same value): what a
// sink records per forward so that a reader finds corrupted bytes. Two implementations of one function: carry-less
// multiplication folding (x86-64 with PCLMULQDQ and SSE4.1, chosen at run time; Intel's "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ", the bit-reflected constants of its appendix, as zlib and Linux use them),
// about 10x the table's rate, so a sink's writer computes it faster than a disk or a copy runs; and slicing by 8
// tables everywhere else and for the < 64-byte pieces. tests/sink compares them on every length and alignment.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#include <immintrin.h>
#define FERRY_CRC32_CLMUL 1
#endif

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

/// The table CRC on the raw register (not inverted on entry or exit).
[[nodiscard]] inline std::uint32_t crc32_tables_raw(const unsigned char* b, std::size_t n, std::uint32_t c) noexcept
{
  const auto& t = crc32_table.t;
  for (; n >= 8; n -= 8, b += 8) {
    const std::uint32_t lo = c ^ (std::uint32_t{b[0]} | std::uint32_t{b[1]} << 8 | std::uint32_t{b[2]} << 16 |
                                  std::uint32_t{b[3]} << 24);
    c = t[7][lo & 0xFFU] ^ t[6][(lo >> 8) & 0xFFU] ^ t[5][(lo >> 16) & 0xFFU] ^ t[4][lo >> 24] ^ t[3][b[4]] ^
        t[2][b[5]] ^ t[1][b[6]] ^ t[0][b[7]];
  }
  for (; n > 0; --n, ++b) { c = t[0][(c ^ *b) & 0xFFU] ^ (c >> 8); }
  return c;
}

#ifdef FERRY_CRC32_CLMUL
/// One fold: x times the constants k (low and high halves) plus the next 16 bytes.
[[gnu::target("pclmul,sse4.1")]] inline __m128i crc32_fold(__m128i x, __m128i k, __m128i next) noexcept
{
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}
[[gnu::target("pclmul,sse4.1")]] inline __m128i crc32_load(const unsigned char* p) noexcept
{
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

/// Folding on the raw register; `n` >= 64 and a multiple of 16.
[[gnu::target("pclmul,sse4.1")]] inline std::uint32_t crc32_clmul_raw(const unsigned char* b, std::size_t n,
                                                                      std::uint32_t c) noexcept
{
  const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);  // x^(4*128+32), x^(4*128-32) mod P
  const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);  // x^(128+32), x^(128-32) mod P
  const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);                 // x^64 mod P
  const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);  // mu, P (Barrett)
  __m128i x1 = _mm_xor_si128(crc32_load(b), _mm_cvtsi32_si128(static_cast<int>(c)));
  __m128i x2 = crc32_load(b + 16), x3 = crc32_load(b + 32), x4 = crc32_load(b + 48);
  for (b += 64, n -= 64; n >= 64; b += 64, n -= 64) {
    x1 = crc32_fold(x1, k1k2, crc32_load(b));
    x2 = crc32_fold(x2, k1k2, crc32_load(b + 16));
    x3 = crc32_fold(x3, k1k2, crc32_load(b + 32));
    x4 = crc32_fold(x4, k1k2, crc32_load(b + 48));
  }
  x1 = crc32_fold(crc32_fold(crc32_fold(x1, k3k4, x2), k3k4, x3), k3k4, x4);
  for (; n >= 16; b += 16, n -= 16) { x1 = crc32_fold(x1, k3k4, crc32_load(b)); }
  // 128 bits to 64, then Barrett reduction to 32.
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, k3k4, 0x10));
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00), _mm_srli_si128(x1, 4));
  __m128i x2b = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
  x2b = _mm_clmulepi64_si128(_mm_and_si128(x2b, low32), poly, 0x00);
  return static_cast<std::uint32_t>(_mm_extract_epi32(_mm_xor_si128(x1, x2b), 1));
}

[[nodiscard]] inline bool crc32_clmul_available() noexcept
{
  static const bool ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return ok;
}
#else
[[nodiscard]] constexpr bool crc32_clmul_available() noexcept { return false; }
#endif

/// The CRC-32 of `n` bytes at `p` continuing from `crc` (start with 0): crc32(ab) == crc32(b, n_b, crc32(a)).
/// `portable` forces the tables (tests compare the two).
[[nodiscard]] inline std::uint32_t crc32(const void* p, std::size_t n, std::uint32_t crc = 0,
                                         bool portable = false) noexcept
{
  const auto* b = static_cast<const unsigned char*>(p);
  std::uint32_t c = ~crc;
#ifdef FERRY_CRC32_CLMUL
  if (!portable && n >= 64 && crc32_clmul_available()) {
    const std::size_t m = n & ~std::size_t{15};
    c = crc32_clmul_raw(b, m, c);
    b += m;
    n -= m;
  }
#else
  (void)portable;
#endif
  return ~crc32_tables_raw(b, n, c);
}

/// a * b modulo the CRC's polynomial, both bit-reflected (zlib's multmodp).
[[nodiscard]] constexpr std::uint32_t crc32_multmodp(std::uint32_t a, std::uint32_t b) noexcept
{
  std::uint32_t p = 0;
  for (std::uint32_t m = 1U << 31; m != 0; m >>= 1) {
    if ((a & m) != 0) { p ^= b; }
    b = (b & 1U) != 0 ? (b >> 1) ^ 0xEDB88320U : b >> 1;
  }
  return p;
}

struct crc32_powers {
  std::array<std::uint32_t, 64> x2n{};  ///< x^(2^k) modulo the polynomial
  constexpr crc32_powers()
  {
    x2n[0] = 1U << 30;  // x^1
    for (std::size_t k = 1; k < x2n.size(); ++k) { x2n[k] = crc32_multmodp(x2n[k - 1], x2n[k - 1]); }
  }
};
inline constexpr crc32_powers crc32_power{};

/// The CRC-32 of a then b from crc32(a), crc32(b) and b's length: crc32_combine(crc32(a), crc32(b), |b|) ==
/// crc32(ab) (zlib's crc32_combine), so that pieces computed apart (a lent entry's, on an I/O thread) make one
/// forward's CRC.
[[nodiscard]] constexpr std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                                                  std::uint64_t len_b) noexcept
{
  std::uint32_t p = 1U << 31;  // x^0: then x^(8 len_b)
  for (std::size_t k = 3; len_b != 0; len_b >>= 1, ++k) {
    if ((len_b & 1U) != 0) { p = crc32_multmodp(crc32_power.x2n[k & 63], p); }
  }
  return crc32_multmodp(p, crc_a) ^ crc_b;
}

}  // namespace ferry::sink::detail
