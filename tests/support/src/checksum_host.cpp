// SPDX-License-Identifier: Apache-2.0
// Host-backend version of the test/benchmark checksum kernel: the same body, the block's threads run one
// after another.
#include "../../../kernels/testing/detail/checksum.cuh"

#include <ferry/backend/host/backend.hpp>
#include <ferry/testing/checksum.hpp>

namespace ferry::testing {

namespace {
void checksum_body(const ferry::backend::host_detail::launch_ctx& ctx, checksum_params p)
{
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) { kernels::checksum_share(p, ctx.block_idx.x, t, ctx.block_dim.x); }
}
}  // namespace

ferry::backend::host_kernel<checksum_params> checksum_kernel(ferry::backend::host_tag)
{
  return {&checksum_body, "h2d_checksum"};
}

}  // namespace ferry::testing
