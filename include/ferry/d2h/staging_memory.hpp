// SPDX-License-Identifier: Apache-2.0
// Staging a channel is given instead of allocating its own (the channel's constructor): host memory that the
// caller page-locked with the channel's backend (host_register), e.g. a shared-memory segment a consumer
// process maps (sink/shm_stream.hpp). The channel lands its D2H copies there and hands out entry views into
// it exactly as into its own staging; nothing else of the protocol changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ferry::d2h {

struct staging_memory {
  std::byte* base{nullptr};     ///< registered with the channel's backend; aligned to 16 bytes (entry_alignment)
  std::uint64_t bytes{0};       ///< the channel's staging_bytes (config::staging_bytes must be 0 or equal)
  std::shared_ptr<void> owner;  ///< keeps the memory (and its registration) alive while the channel or a view uses it

  [[nodiscard]] bool empty() const noexcept { return base == nullptr && bytes == 0; }
};

}  // namespace ferry::d2h
