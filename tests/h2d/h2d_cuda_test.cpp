// SPDX-License-Identifier: Apache-2.0
// The same H2D contract suite on the CUDA backend (label gpu; FERRY_REQUIRE_GPU=1 turns skips into failures).
#include "h2d/suite.hpp"

#include <ferry/backend/cuda/backend.hpp>

namespace ferry::test::h2d {
static_assert(fb::backend<fb::cuda_backend>);
using CudaBackends = ::testing::Types<fb::cuda_backend, fb::faulty<fb::cuda_backend>>;
INSTANTIATE_TYPED_TEST_SUITE_P(h2d_cuda, H2d, CudaBackends);
}  // namespace ferry::test::h2d
