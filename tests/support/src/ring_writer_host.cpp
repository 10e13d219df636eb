// SPDX-License-Identifier: Apache-2.0
// Host-backend version of the test writer kernel: the same body as the GPU kernel
// (kernels/testing/detail/ring_writer.cuh), the block's threads run one after another, then the commit.
#include "../../../kernels/testing/detail/ring_writer.cuh"

#include <ferry/backend/host/backend.hpp>
#include <ferry/testing/ring_writer.hpp>

namespace ferry::testing {

namespace {
void ring_writer_body(const ferry::backend::host_detail::launch_ctx& ctx, ferry::d2h::ring_ref ref, std::uint64_t seq,
                      std::uint64_t bytes, std::uint64_t commit)
{
  if (ctx.block_idx.x != 0) { return; }
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) { kernels::ring_writer_fill(ref, seq, bytes, t, ctx.block_dim.x); }
  kernels::ring_writer_commit(ref, bytes, commit);
}
}  // namespace

ferry::backend::host_kernel<ferry::d2h::ring_ref, std::uint64_t, std::uint64_t, std::uint64_t>
ring_writer_kernel(ferry::backend::host_tag)
{
  return {&ring_writer_body, "test_ring_writer"};
}

}  // namespace ferry::testing
