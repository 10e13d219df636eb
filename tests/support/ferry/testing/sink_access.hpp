// SPDX-License-Identifier: Apache-2.0
// Test access to a safetensors sink's test hook (not installed): holding its writer thread, so a test decides
// when the writer queue fills (policies block and drop) and when it drains. Needs the project root on the include
// path (ferry_add_gtest gives it).
#pragma once

#include "src/sink/safetensors_impl.hpp"  // the sink's state (src/sink: ferry::core's, not installed)

#include <ferry/sink/safetensors.hpp>

#include <atomic>

namespace ferry::testing {

struct sink_access {
  /// While `hold`, the sink's writer takes nothing from its queue (release it before close()).
  static void hold_writer(ferry::sink::safetensors& s, bool hold) noexcept
  {
    s.impl_->test_hold_writer.store(hold, std::memory_order_relaxed);
  }
  /// While `hold`, the sink's finisher publishes no shard: sealed shards wait, the writer goes on (release it
  /// before flush() or close()).
  static void hold_finisher(ferry::sink::safetensors& s, bool hold) noexcept
  {
    s.impl_->test_hold_finisher.store(hold, std::memory_order_relaxed);
  }
};

}  // namespace ferry::testing
