// SPDX-License-Identifier: Apache-2.0
#include "h2d/suite.hpp"

namespace ferry::test::h2d {
using HostBackends = ::testing::Types<fb::host_backend, fb::faulty<fb::host_backend>>;
INSTANTIATE_TYPED_TEST_SUITE_P(h2d_host, H2d, HostBackends);
}  // namespace ferry::test::h2d
