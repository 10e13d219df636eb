// SPDX-License-Identifier: Apache-2.0
// Test-only hooks of a channel: fault switches that each remove one ordering step (so the test guarding
// that step can be seen to fail) and a delay that widens drain races. Not part of the public config: tests
// reach them through ferry::testing::d2h_access (tests/support, not installed). Never set outside tests.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ferry::d2h::detail {

/// Each fault removes one ordering step; the step, its file and its test are listed in docs/design/d2h.md.
enum class debug_fault {
  none,
  drain_without_acquire,         ///< enqueue D2H for every FIFO entry, ignoring published_head (drainer.hpp)
  reclaim_before_copy_complete,  ///< reclaim ring space when the D2H is enqueued, not when it completed (drainer.hpp)
  programmatic_without_wait,     ///< copy kernels skip griddepcontrol.wait under programmatic launch (GPU, sm_90+)
  branch_publish_without_fork,   ///< the branch's publish kernel does not wait for the fork event (release_chain.hpp)
  new_stream_without_join,       ///< a forward on a new stream does not join the last one's (producer.inl)
  boundary_gather_without_normalize,  ///< end_forward's gather releases without normalizing the cursor
                                      ///< (producer_deferred.inl)
  capture_without_claim,  ///< a captured forward has no claim kernel: a launch without plan() writes (producer.inl)
};

/// Read on the producer and drain paths with relaxed loads (a plain load on x86 and ARM); written by tests.
struct test_hooks {
  std::atomic<debug_fault> fault{debug_fault::none};
  std::atomic<std::int64_t> copy_delay_us{0};  ///< extra delay before every D2H (host backend only)

  [[nodiscard]] bool is(debug_fault f) const noexcept { return fault.load(std::memory_order_relaxed) == f; }
  [[nodiscard]] std::chrono::microseconds copy_delay() const noexcept
  {
    return std::chrono::microseconds{copy_delay_us.load(std::memory_order_relaxed)};
  }
};

}  // namespace ferry::d2h::detail
