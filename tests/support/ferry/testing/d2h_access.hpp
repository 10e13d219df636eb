// SPDX-License-Identifier: Apache-2.0
// Test access to a D2H channel's test hooks (not installed): the fault switches that remove one ordering
// step each (mutant tests) and the drain copy delay. The public channel befriends d2h_access; the hooks
// themselves are detail::test_hooks of the channel's shared state.
#pragma once

#include <ferry/d2h/channel.hpp>
#include <ferry/d2h/detail/producer.hpp>
#include <ferry/d2h/detail/test_hooks.hpp>

#include <chrono>

namespace ferry::testing {

/// The D2H fault switches (see ferry/d2h/detail/test_hooks.hpp and docs/design/d2h.md).
using d2h_fault = ferry::d2h::detail::debug_fault;

struct d2h_access {
  /// Whether end_write enqueues the commit check for backend B in this translation unit: always on the host
  /// backend; on a GPU backend only with FERRY_D2H_CHECK_COMMIT=1 (the default in builds without NDEBUG).
  template <class B>
  static constexpr bool commit_check_enabled = ferry::d2h::detail::producer<B>::check_commits;

  /// Removes one ordering step of `ch` from now on (d2h_fault::none restores it). Set it right after
  /// construction, before the first producer call.
  template <class B>
  static void set_fault(ferry::d2h::channel<B>& ch, d2h_fault f) noexcept
  {
    ch.impl_->st.hooks.fault.store(f, std::memory_order_relaxed);
  }
  /// Delays every later D2H of `ch` on its drain stream by `d` (host backend only: widens drain races).
  template <class B>
  static void set_copy_delay(ferry::d2h::channel<B>& ch, std::chrono::microseconds d) noexcept
  {
    ch.impl_->st.hooks.copy_delay_us.store(d.count(), std::memory_order_relaxed);
  }
  /// Both at once (a channel in std::optional or a loop: one call after construction).
  template <class B>
  static void set_hooks(ferry::d2h::channel<B>& ch, d2h_fault f, std::chrono::microseconds d) noexcept
  {
    set_fault(ch, f);
    set_copy_delay(ch, d);
  }
};

}  // namespace ferry::testing
