// SPDX-License-Identifier: Apache-2.0
// The forward log: how a forward's forward_meta (forward_info.hpp) travels from the producer to the drainer, once
// per forward. Each FIFO record carries its forward's index (entry_meta::forward); a forward with metadata also
// gets one record here, pushed by the producer BEFORE the first FIFO record of that forward (begin_forward for an
// eager forward, plan() for a replay), so the drainer, which pops that FIFO record after the FIFO's acquire, finds
// it here (both under the log's mutex). The drainer delivers entries in forward order and drops the records of
// forwards before the one it delivers. Forwards without metadata push nothing.
#pragma once

#include <ferry/d2h/forward_info.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

namespace ferry::d2h::detail {

class forward_log {
 public:
  /// Producer: forward `index` has metadata `m` (non-empty). Indices pushed are increasing.
  void push(std::uint64_t index, std::shared_ptr<const forward_meta> m)
  {
    std::lock_guard lock{mu_};
    log_.emplace_back(index, std::move(m));
  }
  /// Drainer: the metadata of forward `index` (null: none), dropping every record of an earlier forward.
  /// Called with non-decreasing indices (entries are delivered in order).
  [[nodiscard]] std::shared_ptr<const forward_meta> find(std::uint64_t index)
  {
    if (index == cached_index_ && cached_) { return cached_; }
    std::lock_guard lock{mu_};
    while (!log_.empty() && log_.front().first < index) { log_.pop_front(); }
    if (log_.empty() || log_.front().first != index) { return nullptr; }
    cached_index_ = index;
    cached_ = log_.front().second;
    return cached_;
  }

 private:
  std::mutex mu_;
  std::deque<std::pair<std::uint64_t, std::shared_ptr<const forward_meta>>> log_;
  std::uint64_t cached_index_{~std::uint64_t{0}};  ///< drainer only
  std::shared_ptr<const forward_meta> cached_;      ///< drainer only
};

}  // namespace ferry::d2h::detail
