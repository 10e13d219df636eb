// SPDX-License-Identifier: Apache-2.0
// Argument blocks of ferry's D2H kernels (trivially copyable, passed by value). Device-safe.
#pragma once

#include <ferry/d2h/ring_ref.hpp>

#include <cstdint>

namespace ferry::d2h::detail {

/// Copy `bytes` from `src` into the entry described by `dst` (dynamic entries: min(*actual_size, reserved)).
/// When `head_n` > 0 (one-block kernel only) the same kernel then publishes: produced += head_n and a
/// system-scope release of published_head.
struct copy_args {
  ring_ref dst;
  const std::byte* src{nullptr};
  std::uint64_t bytes{0};
  const std::uint64_t* actual_size{nullptr};  ///< device memory; dynamic entries only
  std::uint64_t head_n{0};
  std::uint64_t* head{nullptr};  ///< device address of published_head
  std::uint32_t vecs_per_thread{1};  ///< 16-byte vectors per thread per pass (1, 2, 4, 8): loads before stores
  std::uint32_t test_skip_wait{0};  ///< test hook (detail::debug_fault::programmatic_without_wait): omit the join
};

/// One thread: produced += n; store_release_system(head, produced). When `normalize` is set (forward
/// boundary after an odd number of entries) it first copies cursor slot 1 into slot 0.
struct head_args {
  device_state* state{nullptr};
  std::uint64_t* head{nullptr};
  std::uint64_t n{0};
  std::uint32_t normalize{0};
};

/// The commit check after a user-written entry (one thread): `entry` is the ticket's view. When its writer
/// did not commit (slot[parity ^ 1] is not one commit ahead of slot[parity]) it commits in the writer's
/// place (a dynamic entry with size ~0: delivered as size_overflow) and, first time only, stores `tag`
/// (hook << 32 | index in the forward + 1) into the host-visible `flag`.
struct commit_check_args {
  ring_ref entry;
  std::uint64_t* flag{nullptr};
  std::uint64_t tag{0};
};

}  // namespace ferry::d2h::detail
