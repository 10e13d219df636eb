// SPDX-License-Identifier: Apache-2.0
// What cuda/backend.hpp and hip/backend.hpp share ahead of their runtime's header: the includes of
// gpu_backend.inl and the body of their FERRY_CUDA_TRY / FERRY_HIP_TRY.
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string_view>
#include <type_traits>

/// FERRY_CUDA_TRY(call) / FERRY_HIP_TRY(call): `rt` is the runtime prefix (cuda, hip; also the error's
/// runtime name), `error` ferry's error type for it, `text` the call as written (#call at the outer macro,
/// so a FERRY_GPU(...) spelling is kept). Clears the runtime's sticky last error before throwing.
#define FERRY_DETAIL_GPU_TRY(rt, error, call, text)                                                        \
  do {                                                                                                      \
    const rt##Error_t ferry_status_ = (call);                                                               \
    if (ferry_status_ != rt##Success) [[unlikely]] {                                                        \
      (void)rt##GetLastError();                                                                             \
      throw error(#rt, static_cast<int>(ferry_status_), rt##GetErrorName(ferry_status_), text,              \
                  ::ferry::detail::where(__FILE__, __LINE__), rt##GetErrorString(ferry_status_));           \
    }                                                                                                       \
  } while (0)
