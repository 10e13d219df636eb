// SPDX-License-Identifier: Apache-2.0
// Host-backend versions of the benchmark-only kernels (see bench_kernels.hpp).
#include "bench_kernels.hpp"
#include "detail/vector_copy.cuh"

#include <ferry/backend/host/backend.hpp>
#include <ferry/backend/system_atomic.hpp>
#include <ferry/testing/pattern.hpp>

#include <chrono>

namespace ferry::bench {

namespace {
using ferry::backend::host_detail::launch_ctx;

void copy_block(const launch_ctx& ctx, const copy_args& a)
{
  ferry::kernels::copy_block_host(a.dst, a.src, a.bytes, a.vecs_per_thread, ctx.block_idx.x, ctx.grid_dim.x,
                                  ctx.block_dim.x);
}
bool last_block(const launch_ctx& ctx) { return ctx.block_idx.x == ctx.grid_dim.x - 1; }  // blocks run in order

void bench_copy_body(const launch_ctx& ctx, copy_args a) { copy_block(ctx, a); }
void volatile_body(const launch_ctx& ctx, copy_args a)
{
  copy_block(ctx, a);
  if (last_block(ctx)) {
    *reinterpret_cast<volatile std::uint64_t*>(a.flag) = *a.fwd * a.hooks_per_fwd + a.hook + 1;
  }
}
void sysflag_body(const launch_ctx& ctx, copy_args a)
{
  copy_block(ctx, a);
  if (last_block(ctx)) { ferry::backend::store_release_system(a.flag, *a.fwd * a.hooks_per_fwd + a.hook + 1); }
}
void layer_body(const launch_ctx& ctx, layer_args a)
{
  if (ctx.block_idx.x != 0) { return; }
  const auto start = std::chrono::steady_clock::now();
  const std::uint64_t f = *a.fwd;
  for (std::uint64_t k = 0; k < a.n_hooks; ++k) {
    const std::uint64_t h = a.first_hook + k;
    const bool mix = a.hook_off != nullptr;
    const std::uint64_t words = mix ? (a.hook_bytes[h] + 7) / 8 : a.bytes / 8;
    auto* dst = reinterpret_cast<std::uint64_t*>(a.act + (mix ? a.hook_off[h] : h * a.bytes));
    for (std::uint64_t i = 0; i < words; ++i) { dst[i] = ferry::testing::pattern_word(f * a.hooks_per_fwd + h, i); }
  }
  while (std::chrono::steady_clock::now() - start < std::chrono::nanoseconds(a.spin_ns)) {
  }
}
void next_forward_body(const launch_ctx&, std::uint64_t* fwd) { *fwd += 1; }
}  // namespace

host_kernel<copy_args> bench_copy_kernel(ferry::backend::host_tag) { return {&bench_copy_body, "bench_copy"}; }
host_kernel<copy_args> bench_copy_plain_kernel(ferry::backend::host_tag, ferry::d2h::detail::copy_form)
{
  return {&bench_copy_body, "bench_copy_plain"};  // one host body for every form
}
host_kernel<copy_args> baseline_volatile_kernel(ferry::backend::host_tag) { return {&volatile_body, "baseline_volatile_flag"}; }
host_kernel<copy_args> baseline_sysflag_kernel(ferry::backend::host_tag) { return {&sysflag_body, "baseline_sysflag"}; }
host_kernel<layer_args> layer_kernel(ferry::backend::host_tag) { return {&layer_body, "bench_layer"}; }
host_kernel<std::uint64_t*> next_forward_kernel(ferry::backend::host_tag) { return {&next_forward_body, "bench_next_forward"}; }

}  // namespace ferry::bench
