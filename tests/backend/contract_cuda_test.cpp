// SPDX-License-Identifier: Apache-2.0
#include "backend/contract.hpp"

#include <ferry/backend/cuda/backend.hpp>

namespace ferry::test {
static_assert(fb::backend<fb::cuda_backend>);
using CudaBackends = ::testing::Types<fb::cuda_backend, fb::faulty<fb::cuda_backend>>;
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, BackendContract, CudaBackends);
}  // namespace ferry::test
