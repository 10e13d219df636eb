// SPDX-License-Identifier: Apache-2.0
// The D2H suite on the CUDA backend (H200, FERRY_REQUIRE_GPU=1).
#include "d2h/suite.hpp"

#include <ferry/backend/cuda/backend.hpp>

namespace ferry::test {
using CudaBackends = ::testing::Types<fb::cuda_backend>;
INSTANTIATE_TYPED_TEST_SUITE_P(d2h_cuda, D2hChannel, CudaBackends);
}  // namespace ferry::test
