// SPDX-License-Identifier: Apache-2.0
// What the shared-memory stream tests capture (shm_stream_test.cpp, shm_child.cpp): three hooks of different
// sizes per forward, every byte derived from the forward's tag, the hook and its position, so a stale, torn or
// misplaced byte read in the other process fails the check there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::test {

inline constexpr std::uint32_t shm_hooks = 3;

/// Bytes of hook k's entry: 4000, 1000 and 48 (not multiples of 16: the staging holds the padding between them).
[[nodiscard]] inline std::uint64_t shm_hook_bytes(std::uint32_t k)
{
  constexpr std::uint64_t sizes[shm_hooks] = {4000, 1000, 48};
  return sizes[k % shm_hooks];
}
[[nodiscard]] inline std::uint8_t shm_pattern(std::uint64_t tag, std::uint32_t hook, std::uint64_t i)
{
  return static_cast<std::uint8_t>(tag * 37 + hook * 101 + i * 7 + (i >> 8) + 3);
}
[[nodiscard]] inline std::vector<std::uint8_t> shm_entry_bytes(std::uint64_t tag, std::uint32_t hook)
{
  std::vector<std::uint8_t> v(shm_hook_bytes(hook));
  for (std::size_t i = 0; i < v.size(); ++i) { v[i] = shm_pattern(tag, hook, i); }
  return v;
}

}  // namespace ferry::test
