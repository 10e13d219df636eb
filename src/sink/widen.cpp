// SPDX-License-Identifier: Apache-2.0
// sink::widen_to_f32 (sink/widen.hpp).
#include <ferry/sink/widen.hpp>

#include <ferry/error.hpp>

#include "detail/float_bits.cuh"  // half_to_float: the reduce kernels' f16 conversion

#include <bit>
#include <cstddef>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FERRY_WIDEN_X86 1
#endif

namespace ferry::sink {

namespace {

float bf16_float(std::uint16_t h) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

#ifdef FERRY_WIDEN_X86
/// bf16 -> float bits, 8 values a step: each value into the high half of a zero word (SSE2, every x86-64 CPU).
std::size_t bf16_vectors(const std::uint16_t* s, float* d, std::size_t n) noexcept
{
  const __m128i zero = _mm_setzero_si128();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm_unpacklo_epi16(zero, x));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 4), _mm_unpackhi_epi16(zero, x));
  }
  return i;
}
#endif

}  // namespace

void widen_to_f32(std::span<const std::uint16_t> src, widen_from from, std::span<float> dst)
{
  FERRY_EXPECTS(src.size() == dst.size(), ferry::logic_error,
                "sink::widen_to_f32: expected an output of {} floats (one per input value), got {}", src.size(),
                dst.size());
  const std::size_t n = src.size();
  std::size_t i = 0;
#ifdef FERRY_WIDEN_X86
  if (from == widen_from::bf16) { i = bf16_vectors(src.data(), dst.data(), n); }
#endif
  using ferry::kernels::d2h::half_to_float;
  for (; i < n; ++i) { dst[i] = from == widen_from::bf16 ? bf16_float(src[i]) : half_to_float(src[i]); }
}

}  // namespace ferry::sink
