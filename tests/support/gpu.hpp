// SPDX-License-Identifier: Apache-2.0
// GPU test gating: a GPU test skips when no device is present, and fails instead when
// FERRY_REQUIRE_GPU=1 (so a lent-GPU run cannot pass by skipping).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

namespace ferry::test {

[[nodiscard]] inline bool gpu_required()
{
  const char* v = std::getenv("FERRY_REQUIRE_GPU");
  return v != nullptr && std::string_view{v} == "1";
}

}  // namespace ferry::test

/// Use at the top of a GPU test (or SetUp) with the number of devices found.
#define FERRY_REQUIRE_DEVICE(device_count)                                                           \
  do {                                                                                               \
    if ((device_count) <= 0) {                                                                       \
      if (::ferry::test::gpu_required()) {                                                           \
        FAIL() << "FERRY_REQUIRE_GPU=1 but no GPU device is available";                              \
      } else {                                                                                       \
        GTEST_SKIP() << "no GPU device (set FERRY_REQUIRE_GPU=1 to make this a failure)";            \
      }                                                                                              \
    }                                                                                                \
  } while (0)
