// SPDX-License-Identifier: Apache-2.0
// Consumer check (.hip, hipcc for gfx90a): ferry's public headers compile in a HIP translation unit; both
// sides run on the host backend (no AMD GPU here), and the HIP backend is instantiated and linked.
#include "both_sides.hpp"

#include <ferry/backend/hip/backend.hpp>

#include <cstdio>

int main()
{
  static_assert(ferry::backend::backend<ferry::backend::hip_backend>);
  int failures = consumer::run_both_sides<ferry::backend::host_backend>("hip tu, host backend");
  if (ferry::backend::hip_backend{}.device_count() > 0) {
    failures += consumer::run_both_sides<ferry::backend::hip_backend>("hip tu, hip backend");
  }
  return failures == 0 ? 0 : 1;
}
