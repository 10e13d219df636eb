// SPDX-License-Identifier: Apache-2.0
// Kernels of the GPU D2H stress (ferry_gpu_stress), not part of ferry:
//   fill_kernel   : block b fills source slot (first_slot + b) % table with pattern(first_seq + b, .) over the
//                   slot's capacity, and writes the slot's GPU-resolved size actual[slot] = dyn_actual(seq, cap).
//   hammer_kernel : memory stress on its own stream: scattered read-modify-writes and atomics over a buffer
//                   larger than the L2, re-launched in a loop for the whole run.
// CUDA versions: gpu_stress_kernels.cu (only in ferry_gpu_stress); host versions: gpu_stress_kernels_host.cpp.
// Free of fmt / error headers (included by the .cu). Names avoid "publish"/"release".
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/testing/pattern.hpp>

#include <cstddef>
#include <cstdint>

namespace ferry::gpu_stress {

struct fill_args {
  std::byte* src;                  ///< source slots (device memory)
  const std::uint64_t* offsets;    ///< byte offset of each slot (256-aligned)
  const std::uint32_t* caps;       ///< capacity of each slot in bytes (16 .. 64 KiB)
  std::uint64_t* actual;           ///< per slot: GPU-resolved size for dynamic entries
  std::uint32_t table;             ///< number of slots
  std::uint32_t first_slot;        ///< the batch's window starts here (mod table)
  std::uint64_t first_seq;         ///< entry seq of the window's first slot
};

struct hammer_args {
  std::uint64_t* buf;
  std::uint64_t words;  ///< power of two
  std::uint64_t round;
};

/// Size a dynamic entry of `seq` with reservation `cap` resolves to on the device. About 1 in 256 deliberately
/// exceeds the (16-rounded) reservation and must be delivered as entry_status::size_overflow.
FERRY_HD constexpr bool dyn_overflows(std::uint64_t seq) noexcept
{
  return (ferry::testing::splitmix64(seq ^ 0xD1A5EED5ULL) & 255U) == 7U;
}
FERRY_HD constexpr std::uint64_t dyn_actual(std::uint64_t seq, std::uint64_t cap) noexcept
{
  const std::uint64_t h = ferry::testing::splitmix64(seq ^ 0xD1A5EED5ULL);
  if ((h & 255U) == 7U) { return (cap + 15) / 16 * 16 + 1 + ((h >> 20) % 64); }
  return 1 + ((h >> 12) % cap);
}

/// Hammer body for one thread `t` of `nt`: a permuted walk (odd multiplier mod 2^k) with read-modify-writes,
/// plus a scattered atomic every 16th word. `atomic_add` is the backend's.
template <class AtomicAdd>
FERRY_HD inline void hammer_thread(const hammer_args& a, std::uint64_t t, std::uint64_t nt, AtomicAdd&& atomic_add)
{
  const std::uint64_t mask = a.words - 1;
  for (std::uint64_t k = t; k < a.words; k += nt) {
    const std::uint64_t i = (k * 0x9E3779B1ULL + a.round) & mask;
    const std::uint64_t v = a.buf[i];
    a.buf[i] = v * 6364136223846793005ULL + a.round + 1442695040888963407ULL;
    if ((k & 15U) == 0) { atomic_add(&a.buf[(i ^ 0x5A5A5ULL) & mask], 1ULL); }
  }
}

using ferry::backend::cuda_kernel;
using ferry::backend::host_kernel;

host_kernel<fill_args> fill_kernel(ferry::backend::host_tag);
host_kernel<hammer_args> hammer_kernel(ferry::backend::host_tag);
cuda_kernel<fill_args> fill_kernel(ferry::backend::cuda_tag);
cuda_kernel<hammer_args> hammer_kernel(ferry::backend::cuda_tag);

}  // namespace ferry::gpu_stress
