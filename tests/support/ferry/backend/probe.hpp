// SPDX-License-Identifier: Apache-2.0
// TRANSITIONAL (not installed): the probe kernels left the library for <ferry/testing/probe.hpp>
// (namespace ferry::testing::probe). This keeps suites that still include the old name and call
// ferry::backend::probe::* compiling, with what the old header brought in transitively (fmt, through the
// old ferry/error.hpp). Delete it once no test includes <ferry/backend/probe.hpp>.
#pragma once

#include <ferry/testing/probe.hpp>

#include <fmt/format.h>

namespace ferry::backend {
namespace probe = ::ferry::testing::probe;
}  // namespace ferry::backend
