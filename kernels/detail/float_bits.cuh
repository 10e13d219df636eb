// SPDX-License-Identifier: Apache-2.0
// Element conversions of the reduce kernels (FERRY_HD, GPU and host backend alike, by bits: no cuda_fp16 /
// cuda_bf16 / cuda_fp8 headers, so the host backend computes the same bits as the GPU):
//   load_element   element c of a row of f32, f16 or bf16 as float (exact);
//   order_key      an unsigned key whose order is the value order (NaN above +inf), for top-k's radix select;
//   e4m3fn_of      float -> float8_e4m3fn as torch casts it (c10::detail::fp8e4m3fn_from_fp32_value: round to
//                  nearest even, subnormals kept, |x| >= 464 -> NaN 0x7f | sign); sm_89+ by the hardware's cvt.
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/d2h/reducer.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::kernels::d2h {

FERRY_HD inline float float_of_bits(std::uint32_t u) noexcept
{
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
FERRY_HD inline std::uint32_t bits_of_float(float f) noexcept
{
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// IEEE binary16 bits as float (exact: every half is a float).
FERRY_HD inline float half_to_float(std::uint16_t h) noexcept
{
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fU;
  const std::uint32_t m = h & 0x3ffU;
  if (e == 0) {  // zero or subnormal: m x 2^-24, exact in float
    const float v = static_cast<float>(m) * 5.9604644775390625e-8F;
    return sign != 0 ? -v : v;
  }
  if (e == 31) { return float_of_bits(sign | 0x7f800000U | (m << 13)); }
  return float_of_bits(sign | ((e + 112) << 23) | (m << 13));
}

/// The raw bits of element `c` of `row` (16 or 32 significant bits).
FERRY_HD inline std::uint32_t element_bits(const std::byte* row, std::uint64_t c, ferry::d2h::reduce_input in) noexcept
{
  if (in == ferry::d2h::reduce_input::f32) {
    std::uint32_t u;
    std::memcpy(&u, row + 4 * c, 4);
    return u;
  }
  std::uint16_t h;
  std::memcpy(&h, row + 2 * c, 2);
  return h;
}

/// Element bits `u` of type `in` as float.
FERRY_HD inline float float_of(std::uint32_t u, ferry::d2h::reduce_input in) noexcept
{
  switch (in) {
    case ferry::d2h::reduce_input::f32: return float_of_bits(u);
    case ferry::d2h::reduce_input::bf16: return float_of_bits(u << 16);
    default: return half_to_float(static_cast<std::uint16_t>(u));
  }
}

FERRY_HD inline float load_element(const std::byte* row, std::uint64_t c, ferry::d2h::reduce_input in) noexcept
{
  return float_of(element_bits(row, c, in), in);
}

/// Value order as unsigned order: a negative value's bits inverted, a positive value's sign bit set (16-bit types
/// in the low 16 bits). Positive NaN orders above +inf.
FERRY_HD inline std::uint32_t order_key(std::uint32_t u, ferry::d2h::reduce_input in) noexcept
{
  const std::uint32_t sign = in == ferry::d2h::reduce_input::f32 ? 0x80000000U : 0x8000U;
  const std::uint32_t mask = in == ferry::d2h::reduce_input::f32 ? 0xffffffffU : 0xffffU;
  return ((u & sign) != 0 ? ~u : (u | sign)) & mask;
}
/// The element bits of `key` (order_key's inverse).
FERRY_HD inline std::uint32_t bits_of_key(std::uint32_t key, ferry::d2h::reduce_input in) noexcept
{
  const std::uint32_t sign = in == ferry::d2h::reduce_input::f32 ? 0x80000000U : 0x8000U;
  const std::uint32_t mask = in == ferry::d2h::reduce_input::f32 ? 0xffffffffU : 0xffffU;
  return ((key & sign) != 0 ? (key & ~sign) : ~key) & mask;
}

/// float -> float8_e4m3fn bits, torch's rounding (c10/util/Float8_e4m3fn.h, fp8e4m3fn_from_fp32_value). On sm_89+
/// one cvt.rn.satfinite.e4m3x2.f32 (round to nearest even, subnormals kept, as torch) after the one case where the
/// two differ: |x| >= 464 (and NaN), which torch makes NaN and satfinite would make 448.
FERRY_HD inline std::uint8_t e4m3fn_of(float f) noexcept
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const std::uint32_t u = bits_of_float(f);
  if ((u & 0x7fffffffU) >= (UINT32_C(1087) << 20)) { return static_cast<std::uint8_t>(0x7fU | ((u >> 24) & 0x80U)); }
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0F), "f"(f));  // f: the low byte
  return static_cast<std::uint8_t>(pair & 0xffU);
#else
  constexpr std::uint32_t fp8_max = UINT32_C(1087) << 20;  // 464.0f: at or above it, NaN
  constexpr std::uint32_t denorm_mask = UINT32_C(141) << 23;
  std::uint32_t bits = bits_of_float(f);
  const std::uint32_t sign = bits & UINT32_C(0x80000000);
  bits ^= sign;
  std::uint8_t result = 0;
  if (bits >= fp8_max) {
    result = 0x7f;
  } else if (bits < (UINT32_C(121) << 23)) {  // below 2^-6: the subnormal range, rounded by a float add
    bits = bits_of_float(float_of_bits(bits) + float_of_bits(denorm_mask));
    result = static_cast<std::uint8_t>(bits - denorm_mask);
  } else {
    const std::uint32_t mant_odd = (bits >> 20) & 1U;
    bits += (static_cast<std::uint32_t>(7 - 127) << 23) + 0x7FFFFU;
    bits += mant_odd;
    result = static_cast<std::uint8_t>(bits >> 20);
  }
  return static_cast<std::uint8_t>(result | static_cast<std::uint8_t>(sign >> 24));
#endif
}

}  // namespace ferry::kernels::d2h
