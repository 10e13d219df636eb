// SPDX-License-Identifier: Apache-2.0
// close_quietly: the shutdown a destructor runs (RMM's safe shutdown): the object's close(), never throwing; an
// error is reported on stderr, prefixed by who() (called only then). Channels and sinks use it.
#pragma once

#include <cstdio>
#include <exception>

namespace ferry::detail {

/// Runs `close()`; an exception is written to stderr as "<who()>: <what>" and swallowed.
template <class Close, class Who>
void close_quietly(Close&& close, Who&& who) noexcept
{
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who().c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: a non-std::exception\n", who().c_str());
  }
}

}  // namespace ferry::detail
