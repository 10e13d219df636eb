// SPDX-License-Identifier: Apache-2.0
// write_ticket: handed out by channel::begin_write() for a user kernel that writes one entry itself.
#pragma once

#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/types.hpp>

#include <cstdint>

namespace ferry::d2h {

namespace detail {
struct access;
}

/// One open user-written entry: launch the writer kernel with ref() (see ring_ref), then pass the ticket
/// back to channel::end_write() on the same stream.
class write_ticket {
 public:
  /// The view the writer kernel writes the entry through (trivially copyable: pass it by value).
  [[nodiscard]] const ring_ref& ref() const noexcept { return ref_; }

 private:
  friend struct detail::access;
  ring_ref ref_{};
  hook_id hook_{};
  std::uint64_t bytes_{0};
  placement where_{};
  bool live_{false};
};

}  // namespace ferry::d2h
