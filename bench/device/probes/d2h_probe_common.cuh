// SPDX-License-Identifier: Apache-2.0
// Shared by the D2H probes in this folder (not ferry code): the check of the last replay's entries.
#pragma once

#include "probe_common.cuh"

#include <ferry/d2h/ring_ref.hpp>

#include <cstddef>
#include <cstring>
#include <vector>

/// Whether the `hooks` entries of `entry` bytes that end at the cursor slot[0] of `state` (an even number of
/// commits: parity back to 0) hold `host`'s bytes, in order. A cursor at 0 ended exactly at the ring's end.
inline bool last_forward_exact(const ferry::d2h::device_state* state, const std::byte* ring, std::size_t ring_bytes,
                               const std::vector<unsigned char>& host, int hooks, std::size_t entry)
{
  ferry::d2h::device_state st{};
  CK(cudaMemcpy(&st, state, sizeof st, cudaMemcpyDeviceToHost));
  std::vector<unsigned char> got(ring_bytes);
  CK(cudaMemcpy(got.data(), ring, ring_bytes, cudaMemcpyDeviceToHost));
  const std::uint64_t end = st.slot[0].phys == 0 ? ring_bytes : st.slot[0].phys;
  bool ok = end >= entry * hooks;
  for (int j = 0; ok && j < hooks; ++j) {
    ok = std::memcmp(got.data() + end - entry * (hooks - j), host.data() + j * entry, entry) == 0;
  }
  return ok;
}
