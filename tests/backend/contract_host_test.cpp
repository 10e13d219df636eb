// SPDX-License-Identifier: Apache-2.0
#include "backend/contract.hpp"

namespace ferry::test {
using HostBackends = ::testing::Types<fb::host_backend, fb::faulty<fb::host_backend>>;
INSTANTIATE_TYPED_TEST_SUITE_P(Host, BackendContract, HostBackends);
}  // namespace ferry::test
