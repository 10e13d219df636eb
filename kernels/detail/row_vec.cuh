// SPDX-License-Identifier: Apache-2.0
// A row of the reduce kernels read as 16-byte vectors (one load instruction per 8 bf16 / f16 or 4 f32 elements):
//   vec16      16 bytes, aligned as one vector load wants them;
//   vec_ok     the row can be read so: 16-byte aligned, its width a whole number of vectors;
//   vec_bits   element e of a vector, as element_bits gives it.
// The bodies that use them (fp8_record, topk_block.cuh) keep their scalar loop for the other rows and the host.
#pragma once

#include "float_bits.cuh"

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD
#include <ferry/d2h/reducer.hpp>

#include <cstddef>
#include <cstdint>

namespace ferry::kernels::d2h {

struct alignas(16) vec16 {
  std::uint32_t w[4];
};

/// Elements of `in` in one vec16.
FERRY_HD constexpr std::uint32_t per_vec(ferry::d2h::reduce_input in) noexcept
{
  return in == ferry::d2h::reduce_input::f32 ? 4U : 8U;
}

FERRY_HD inline bool vec_ok(const std::byte* row, std::uint64_t width, ferry::d2h::reduce_input in) noexcept
{
  return (reinterpret_cast<std::uintptr_t>(row) & 15U) == 0 && width % per_vec(in) == 0;
}

/// Vector `i` of `row` (vec_ok).
FERRY_HD inline vec16 vec_at(const std::byte* row, std::uint64_t i) noexcept
{
  return reinterpret_cast<const vec16*>(row)[i];
}

/// The bits of element `e` (< per_vec(in)) of `v`.
FERRY_HD inline std::uint32_t vec_bits(const vec16& v, std::uint32_t e, ferry::d2h::reduce_input in) noexcept
{
  if (in == ferry::d2h::reduce_input::f32) { return v.w[e]; }
  return (v.w[e >> 1] >> (16U * (e & 1U))) & 0xffffU;
}

}  // namespace ferry::kernels::d2h
