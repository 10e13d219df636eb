// SPDX-License-Identifier: Apache-2.0
// The H2D typed suites on the host backend (label host): host_backend and faulty<host_backend>.
#include "h2d/capacity.hpp"
#include "h2d/failure.hpp"
#include "h2d/graph.hpp"
#include "h2d/lifecycle.hpp"
#include "h2d/misuse.hpp"
#include "h2d/ordering.hpp"
#include "h2d/sources.hpp"

namespace ferry::test::h2d {
using HostBackends = ::testing::Types<fb::host_backend, fb::faulty<fb::host_backend>>;
// Instantiation prefix = suite name: ctest names the tests <Suite>.<Test><Backend> (one naming scheme).
INSTANTIATE_TYPED_TEST_SUITE_P(H2dOrdering, H2dOrdering, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dCapacity, H2dCapacity, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dGraph, H2dGraph, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dLifecycle, H2dLifecycle, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dFailure, H2dFailure, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dMisuse, H2dMisuse, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(H2dSources, H2dSources, HostBackends);
}  // namespace ferry::test::h2d
