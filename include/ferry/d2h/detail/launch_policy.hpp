// SPDX-License-Identifier: Apache-2.0
// detail::launch_policy<B>: how a channel launches its own kernels (copy, gather, release) on the producer
// stream: programmatically (tuning::programmatic_launch, where the device and the loaded code support it)
// or plainly, and, inside a stream capture, which graph nodes are the channel's own. A performance policy
// only: the join each kernel relies on is the same either way (griddepcontrol.wait or the kernel boundary).
#pragma once

#include <ferry/backend/concepts.hpp>  // backend, launch_config

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
class launch_policy {
 public:
  explicit launch_policy(B b) noexcept : b_{b} {}
  using stream_type = typename B::stream_type;

  /// tuning::programmatic_launch where the device and the loaded kernels support it (channel_impl sets it).
  bool programmatic{false};

  /// Whether ferry's next kernel on `s` is launched programmatically (tuning::programmatic_launch, where
  /// supported). Eager: always. In a stream capture: only when the one node it will depend on is one of this
  /// channel's own kernels (capture_tail), i.e. a kernel that lets its dependents launch at its start
  /// (griddepcontrol.launch_dependents). After any other kernel (a model's, which never triggers early) a
  /// programmatic edge only waits for that kernel's end and then for the flush, which is slower than a plain
  /// launch behind it. A performance choice only: the join is the same either way
  /// (griddepcontrol.wait, or the kernel boundary).
  [[nodiscard]] bool launch_programmatic(stream_type s) const noexcept
  {
    if (!programmatic) { return false; }
    if (!capture_open_) { return true; }
    const std::uintptr_t t = b_.capture_tail(s);
    return t != 0 && std::find(own_nodes_.begin(), own_nodes_.end(), t) != own_nodes_.end();
  }
  /// Launches one of the channel's kernels on the producer stream `s` (`blocks` x `threads`):
  /// programmatically where launch_programmatic(s) says so; inside the open capture its node is then
  /// remembered as one of the channel's own (what launch_programmatic looks for).
  template <class... Args>
  void own(typename B::template kernel_type<Args...> k, std::uint32_t blocks, std::uint32_t threads, stream_type s,
           std::type_identity_t<Args>... args)
  {
    b_.launch(k, ferry::backend::launch_config{{blocks}, {threads}, 0, launch_programmatic(s)}, s, args...);
    if (programmatic && capture_open_) { own_nodes_[own_next_++ % own_nodes_.size()] = b_.capture_tail(s); }
  }
  /// The producer's forward opens (`capturing`: in a stream capture) or closes (false).
  void set_capture_open(bool capturing) noexcept
  {
    capture_open_ = capturing;
    own_nodes_ = {};
    own_next_ = 0;
  }

 private:
  B b_;
  // producer thread only
  bool capture_open_{false};                    ///< the producer's open forward is being captured
  std::array<std::uintptr_t, 4> own_nodes_{};   ///< graph nodes of this channel's last kernels in that capture
  std::uint32_t own_next_{0};
};

}  // namespace ferry::d2h::detail
