// SPDX-License-Identifier: Apache-2.0
// Host-backend versions of the GPU stress kernels (see gpu_stress_kernels.hpp): the same bodies, the block's
// threads run one after another.
#include "gpu_stress_kernels.hpp"

#include <ferry/backend/host/backend.hpp>

#include <atomic>

namespace ferry::gpu_stress {

namespace {
using ferry::backend::host_detail::launch_ctx;

void fill_body(const launch_ctx& ctx, fill_args a)
{
  const std::uint32_t slot =
      static_cast<std::uint32_t>((static_cast<std::uint64_t>(a.first_slot) + ctx.block_idx.x) % a.table);
  const std::uint64_t seq = a.first_seq + ctx.block_idx.x;
  const std::uint64_t cap = a.caps[slot];
  auto* w = reinterpret_cast<std::uint64_t*>(a.src + a.offsets[slot]);
  const std::uint64_t words = (cap + 7) / 8;
  for (std::uint64_t i = 0; i < words; ++i) { w[i] = ferry::testing::pattern_word(seq, i); }
  a.actual[slot] = dyn_actual(seq, cap);
}

void hammer_body(const launch_ctx& ctx, hammer_args a)
{
  const std::uint64_t nt = static_cast<std::uint64_t>(ctx.grid_dim.x) * ctx.block_dim.x;
  for (std::uint32_t th = 0; th < ctx.block_dim.x; ++th) {
    const std::uint64_t t = static_cast<std::uint64_t>(ctx.block_idx.x) * ctx.block_dim.x + th;
    hammer_thread(a, t, nt, [](std::uint64_t* p, std::uint64_t v) {
      std::atomic_ref<std::uint64_t>{*p}.fetch_add(v, std::memory_order_relaxed);
    });
  }
}
}  // namespace

host_kernel<fill_args> fill_kernel(ferry::backend::host_tag) { return {&fill_body, "gpu_stress_fill"}; }
host_kernel<hammer_args> hammer_kernel(ferry::backend::host_tag) { return {&hammer_body, "gpu_stress_hammer"}; }

}  // namespace ferry::gpu_stress
