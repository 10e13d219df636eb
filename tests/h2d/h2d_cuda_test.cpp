// SPDX-License-Identifier: Apache-2.0
// The same H2D typed suites on the CUDA backend (label gpu; FERRY_REQUIRE_GPU=1 turns skips into failures).
#include "h2d/capacity.hpp"
#include "h2d/failure.hpp"
#include "h2d/graph.hpp"
#include "h2d/lifecycle.hpp"
#include "h2d/misuse.hpp"
#include "h2d/ordering.hpp"
#include "h2d/sources.hpp"

#include <ferry/backend/cuda/backend.hpp>

namespace ferry::test::h2d {
static_assert(fb::backend<fb::cuda_backend>);
using CudaBackends = ::testing::Types<fb::cuda_backend, fb::faulty<fb::cuda_backend>>;
// Instantiation prefix = suite name: ctest names the tests <Suite>.<Test><Backend> (one naming scheme).
INSTANTIATE_TYPED_TEST_SUITE_P(H2dOrdering, H2dOrdering, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dCapacity, H2dCapacity, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dGraph, H2dGraph, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dLifecycle, H2dLifecycle, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dFailure, H2dFailure, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dMisuse, H2dMisuse, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dSources, H2dSources, CudaBackends);
}  // namespace ferry::test::h2d
