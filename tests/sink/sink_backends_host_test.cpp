// SPDX-License-Identifier: Apache-2.0
#include "sink/sink_backends.hpp"

namespace ferry::test {
INSTANTIATE_TYPED_TEST_SUITE_P(Host, SinkBackends, ::testing::Types<fb::host_backend>);
}  // namespace ferry::test
