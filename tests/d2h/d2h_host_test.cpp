// SPDX-License-Identifier: Apache-2.0
// The D2H suite on the host backend (CI) and the fault-injecting decorator, plus host-only tests.
#include "d2h/suite.hpp"

namespace ferry::test {
using HostBackends = ::testing::Types<fb::host_backend, fb::faulty<fb::host_backend>>;
INSTANTIATE_TYPED_TEST_SUITE_P(d2h_host, D2hChannel, HostBackends);
}  // namespace ferry::test

#include "d2h/host_only.hpp"
