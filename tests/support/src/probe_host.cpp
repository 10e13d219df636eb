// SPDX-License-Identifier: Apache-2.0
// Host-backend versions of the probe kernels: the same bodies as the GPU kernels
// (kernels/testing/detail/probe.cuh), with the block's threads run one after another and the block join
// between phases.
#include "../../../kernels/testing/detail/probe.cuh"

#include <ferry/backend/host/backend.hpp>
#include <ferry/testing/probe.hpp>

#include <chrono>
#include <thread>

namespace ferry::testing::probe {

namespace {
void publish_body(const ferry::backend::host_launch_ctx& ctx, std::uint64_t* payload, std::uint64_t words,
                  std::uint64_t* flag, std::uint64_t seq)
{
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) {
    kernels::publish_write(payload, words, seq, t, ctx.block_dim.x);
  }
  kernels::publish_release(flag, seq);
}

void consume_body(const ferry::backend::host_launch_ctx& ctx, const std::uint64_t* flag, std::uint64_t seq,
                  const std::uint64_t* src, std::uint64_t* dst, std::uint64_t words)
{
  kernels::consume_acquire(flag, seq);
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) {
    kernels::consume_copy(src, dst, words, t, ctx.block_dim.x);
  }
}
void late_fill_body(const ferry::backend::host_launch_ctx& ctx, std::uint64_t* dst, std::uint64_t words, std::uint64_t seq,
                    std::uint64_t delay_ns)
{
  // The host backend runs a stream's work in order (nothing to trigger early); the delay still holds the
  // stream, so work on other streams that should have waited for this kernel races it.
  std::this_thread::sleep_for(std::chrono::nanoseconds(delay_ns));
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) { kernels::publish_write(dst, words, seq, t, ctx.block_dim.x); }
}
}  // namespace

host_kernel<std::uint64_t*, std::uint64_t, std::uint64_t, std::uint64_t> late_fill_kernel(host_tag)
{
  return {&late_fill_body, "probe_late_fill"};
}

host_kernel<std::uint64_t*, std::uint64_t, std::uint64_t*, std::uint64_t> publish_kernel(host_tag)
{
  return {&publish_body, "probe_publish"};
}

host_kernel<const std::uint64_t*, std::uint64_t, const std::uint64_t*, std::uint64_t*, std::uint64_t>
consume_kernel(host_tag)
{
  return {&consume_body, "probe_consume"};
}

}  // namespace ferry::testing::probe
