// SPDX-License-Identifier: Apache-2.0
// Host-backend versions of the D2H kernels: the same bodies as the GPU kernels (kernels/detail/d2h_kernels.cuh),
// each block's threads run one after another, the block join between phases.
#include "../kernels/detail/d2h_kernels.cuh"

#include <ferry/backend/host/backend.hpp>
#include <ferry/d2h/detail/kernels.hpp>

#include <algorithm>
#include <cstring>

namespace ferry::d2h::detail {

namespace {
using ferry::backend::host_detail::launch_ctx;

void copy_entry_publish_body(const launch_ctx& ctx, copy_args a)
{
  // Phase 1: every thread of the (single) block copies its share; thread 0 commits the cursor.
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) { kernels::d2h::copy_phase(a, t, ctx.block_dim.x); }
  kernels::d2h::commit_phase(a);
  // Block join, then phase 2: thread 0 publishes.
  if (a.head_n != 0) { kernels::d2h::publish_phase(a.dst.state, a.head, a.head_n); }
}

void copy_entry_body(const launch_ctx& ctx, copy_args a)
{
  // Same bytes as the GPU's strided threads write, in contiguous segments (the block's threads own
  // chunk indices [block * bd, block * bd + bd) of every stride): cache-friendly on the CPU.
  const std::uint64_t bd = ctx.block_dim.x;
  const std::uint64_t nt = static_cast<std::uint64_t>(ctx.grid_dim.x) * bd;
  std::byte* dst = a.dst.data();
  const std::uint64_t n = kernels::d2h::copy_length(a);
  const bool vec = ((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(a.src)) & 15U) == 0;
  const std::uint64_t unit = vec ? 16 : 1;
  const std::uint64_t units = vec ? n / 16 : n;
  for (std::uint64_t base = ctx.block_idx.x * bd; base < units; base += nt) {
    const std::uint64_t k = std::min(bd, units - base);
    std::memcpy(dst + base * unit, a.src + base * unit, k * unit);
  }
  if (vec && ctx.block_idx.x == 0) {  // the byte tail, as the GPU's first threads copy it
    for (std::uint64_t i = units * 16; i < n; ++i) { dst[i] = a.src[i]; }
  }
  if (ctx.block_idx.x == 0) { kernels::d2h::commit_phase(a); }
}

void publish_head_body(const launch_ctx& ctx, head_args a)
{
  if (ctx.block_idx.x == 0) { kernels::d2h::publish_head_body(a); }
}
}  // namespace

host_kernel<copy_args> copy_entry_publish_kernel(host_tag) { return {&copy_entry_publish_body, "d2h_copy_entry_publish"}; }
host_kernel<copy_args> copy_entry_kernel(host_tag) { return {&copy_entry_body, "d2h_copy_entry"}; }
host_kernel<head_args> publish_head_kernel(host_tag) { return {&publish_head_body, "d2h_publish_head"}; }

}  // namespace ferry::d2h::detail
