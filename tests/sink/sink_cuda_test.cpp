// SPDX-License-Identifier: Apache-2.0
#include "sink/sink_backends.hpp"

#include <ferry/backend/cuda/backend.hpp>

namespace ferry::test {
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, SinkBackends, ::testing::Types<fb::cuda_backend>);
}  // namespace ferry::test
