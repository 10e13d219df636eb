// SPDX-License-Identifier: Apache-2.0
// Fuzz-byte reader and the "no backend operation enqueued" count shared by the two fuzzers.
#pragma once

#include <ferry/backend.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ferry::rel::fuzz {

struct bytes {
  const std::uint8_t* p;
  std::size_t n, i{0};
  [[nodiscard]] bool more() const { return i < n; }
  std::uint8_t u8() { return i < n ? p[i++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return u16() | (static_cast<std::uint32_t>(u16()) << 16); }
};

/// Calls that put work on a stream (copies, memsets, launches, event records, graph launches).
inline std::size_t enqueued(const ferry::backend::fault_plan& plan)
{
  std::size_t n = 0;
  for (const auto& c : plan.log()) {
    if (c.rfind("copy:", 0) == 0 || c.rfind("launch:", 0) == 0 || c.rfind("event_record:", 0) == 0 ||
        c.rfind("graph:graph_launch", 0) == 0) {
      ++n;
    }
  }
  return n;
}

[[noreturn]] inline void violation(const std::string& what)
{
  std::fprintf(stderr, "FUZZ VIOLATION: %s\n", what.c_str());
  std::abort();
}

}  // namespace ferry::rel::fuzz
