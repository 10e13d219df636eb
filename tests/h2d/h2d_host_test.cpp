// SPDX-License-Identifier: Apache-2.0
// The H2D typed suites on the host backend (label host): host_backend and faulty<host_backend>.
#include "h2d/capacity.hpp"
#include "h2d/failure.hpp"
#include "h2d/graph.hpp"
#include "h2d/lifecycle.hpp"
#include "h2d/ordering.hpp"

namespace ferry::test::h2d {
using HostBackends = ::testing::Types<fb::host_backend, fb::faulty<fb::host_backend>>;
INSTANTIATE_TYPED_TEST_SUITE_P(host, H2dOrdering, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(host, H2dCapacity, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(host, H2dGraph, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(host, H2dLifecycle, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(host, H2dFailure, HostBackends);
}  // namespace ferry::test::h2d
