// SPDX-License-Identifier: Apache-2.0
// A row of the reduce kernels read as 16-byte vectors (one load instruction per 8 bf16 / f16 or 4 f32 elements):
//   vec16      16 bytes, aligned as one vector load wants them;
//   vec_ok     the row can be read so: 16-byte aligned, its width a whole number of vectors;
//   for_each_in_vec    the elements of a vector, as element_bits gives them.
//   for_each_element   every element of a row by a block's thread, its loads batched (by vectors when vec_ok).
// The bodies that use them (fp8_record, topk_block.cuh) keep their scalar loop for the other rows and the host.
#pragma once

#include "float_bits.cuh"
#include "vector_copy.cuh"  // FERRY_UNROLL

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

/// f(e, bits) for each element e < per_vec(in) of `v`, in order (bits: element_bits'). Both loops unroll, so that
/// every index into `v` (and into a caller's per-element registers, by e) is a constant and stays in registers.
template <class F>
FERRY_HD inline void for_each_in_vec(const vec16& v, ferry::d2h::reduce_input in, F f)
{
  if (in == ferry::d2h::reduce_input::f32) {
FERRY_UNROLL
    for (std::uint32_t e = 0; e < 4; ++e) { f(e, v.w[e]); }
  } else {
FERRY_UNROLL
    for (std::uint32_t e = 0; e < 8; ++e) { f(e, (v.w[e >> 1] >> (16U * (e & 1U))) & 0xffffU); }
  }
}

/// f(c, bits, u) for the elements c < width of `row` that thread b.t of block `b` takes (bits: element_bits').
/// On the GPU each thread has VecBatch 16-byte vectors (vec_ok rows) or ScalarBatch elements in flight before it
/// uses them: u < that batch is the load's place in it (the thread's u-th load of a batch reads vector or element
/// i0 + u x nt). The host's one thread: every element in order, u = 0.
template <std::uint32_t VecBatch, std::uint32_t ScalarBatch, class Blk, class F>
FERRY_HD void for_each_element(const Blk& b, const std::byte* row, std::uint64_t width, ferry::d2h::reduce_input in,
                               F f)
{
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  if (vec_ok(row, width, in)) {
    const std::uint32_t pv = per_vec(in);
    const std::uint64_t nv = width / pv;
    for (std::uint64_t i0 = b.t; i0 < nv; i0 += VecBatch * b.nt) {
      vec16 v[VecBatch];
#pragma unroll
      for (std::uint32_t u = 0; u < VecBatch; ++u) {
        if (i0 + u * b.nt < nv) { v[u] = vec_at(row, i0 + u * b.nt); }
      }
#pragma unroll
      for (std::uint32_t u = 0; u < VecBatch; ++u) {
        const std::uint64_t i = i0 + u * b.nt;
        if (i >= nv) { continue; }
        for_each_in_vec(v[u], in, [&](std::uint32_t e, std::uint32_t bits) { f(i * pv + e, bits, u); });
      }
    }
    return;
  }
  for (std::uint64_t c0 = b.t; c0 < width; c0 += ScalarBatch * b.nt) {
    std::uint32_t bits[ScalarBatch];
#pragma unroll
    for (std::uint32_t u = 0; u < ScalarBatch; ++u) {
      const std::uint64_t c = c0 + u * b.nt;
      bits[u] = c < width ? element_bits(row, c, in) : 0U;
    }
#pragma unroll
    for (std::uint32_t u = 0; u < ScalarBatch; ++u) {
      if (c0 + u * b.nt < width) { f(c0 + u * b.nt, bits[u], u); }
    }
  }
#else
  for (std::uint64_t c = b.t; c < width; c += b.nt) { f(c, element_bits(row, c, in), 0U); }
#endif
}

}  // namespace ferry::kernels::d2h
