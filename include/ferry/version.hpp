// SPDX-License-Identifier: Apache-2.0
// ferry's version (the project's CMake VERSION and src/python/pyproject.toml's; tests/sink checks the first,
// tests/python/test_sink_safetensors.py the second). Sinks record it in what they write.
#pragma once

#include <string_view>

namespace ferry {

inline constexpr std::string_view version = "0.1.0";

}  // namespace ferry
