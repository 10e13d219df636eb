// SPDX-License-Identifier: Apache-2.0
// The D2H typed suites on the CUDA backend (H200, FERRY_REQUIRE_GPU=1).
#include "d2h/capacity.hpp"
#include "d2h/failure.hpp"
#include "d2h/gather.hpp"
#include "d2h/graph.hpp"
#include "d2h/lifecycle.hpp"
#include "d2h/misuse.hpp"
#include "d2h/multi_channel.hpp"
#include "d2h/ordering.hpp"

#include <ferry/backend/cuda/backend.hpp>

namespace ferry::test {
using CudaBackends = ::testing::Types<fb::cuda_backend>;
// Instantiation prefix = suite name: ctest names the tests <Suite>.<Test><Backend> (one naming scheme).
INSTANTIATE_TYPED_TEST_SUITE_P(D2hOrdering, D2hOrdering, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hCapacity, D2hCapacity, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hGraph, D2hGraph, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hLifecycle, D2hLifecycle, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hFailure, D2hFailure, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hGather, D2hGather, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hMultiChannel, D2hMultiChannel, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hMisuse, D2hMisuse, CudaBackends);
}  // namespace ferry::test
