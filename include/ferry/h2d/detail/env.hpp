// SPDX-License-Identifier: Apache-2.0
// The one place H2D publication reads its environment variables (once, in publisher::initialize()):
//   FERRY_H2D_BACKEND      packed | direct | batch | zerocopy | auto   when config::backend is unset
//   FERRY_H2D_SPECULATION  0 | 1 | 2                                   when config::speculation is -1
//   FERRY_H2D_DEBUG_SOURCES 0 | 1                                      when config::debug_sources is unset
// An empty variable counts as unset; any other value is rejected (ferry::logic_error).
#pragma once

#include <ferry/error.hpp>
#include <ferry/h2d/types.hpp>

#include <cstdlib>
#include <string_view>

namespace ferry::h2d::detail {

/// Fills the fields of `cfg` that its caller left to the environment (see above).
inline void apply_env(config& cfg)
{
  if (cfg.speculation < 0) {
    if (const char* env = std::getenv("FERRY_H2D_SPECULATION"); env != nullptr && *env != '\0') {
      const std::string_view v{env};
      FERRY_EXPECTS(v == "0" || v == "1" || v == "2", logic_error,
                    "h2d publisher: FERRY_H2D_SPECULATION='{}' is not 0, 1 or 2", env);
      cfg.speculation = v[0] - '0';
    }
  }
  if (!cfg.debug_sources) {
    if (const char* env = std::getenv("FERRY_H2D_DEBUG_SOURCES"); env != nullptr && *env != '\0') {
      const std::string_view v{env};
      FERRY_EXPECTS(v == "0" || v == "1", logic_error, "h2d publisher: FERRY_H2D_DEBUG_SOURCES='{}' is not 0 or 1",
                    env);
      cfg.debug_sources = v == "1";
    }
  }
  if (!cfg.backend) {
    if (const char* env = std::getenv("FERRY_H2D_BACKEND"); env != nullptr && *env != '\0') {
      const auto k = parse_upload_backend(env);
      FERRY_EXPECTS(k.has_value(), logic_error,
                    "h2d publisher: FERRY_H2D_BACKEND='{}' is not one of packed, direct, batch, zerocopy, auto", env);
      cfg.backend = *k;
    }
  }
}

}  // namespace ferry::h2d::detail
