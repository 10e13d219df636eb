// SPDX-License-Identifier: Apache-2.0
// What the drop policy took from each request (sink::request_drop), the one home both sinks use: a forward that a
// sink drops whole or truncates counts once, with the rows it held for each of its requests (forward_meta::
// requests). Dropped samples are not a random subset (a slow reader or disk drops the busiest steps), so an engine
// reports them per request from this (ferry.engine's Capture report). Not thread-safe: each sink calls it under
// its own mutex.
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/sink/policy.hpp>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace ferry::sink::detail {

class drop_ledger {
 public:
  /// `v`'s forward lost entries: its requests are charged once (a forward's entries arrive consecutively, so a
  /// later entry of the same forward adds nothing).
  void add(const d2h::entry_view& v)
  {
    if (any_ && v.forward_index() == last_forward_) { return; }
    any_ = true;
    last_forward_ = v.forward_index();
    const d2h::forward_meta* m = v.meta();
    if (m == nullptr) { return; }
    for (const d2h::request_rows& r : m->requests) {
      request_drop& d = by_request_[r.request];
      d.request = r.request;
      ++d.forwards;
      d.rows += r.rows;
    }
  }
  /// Every request charged so far, by request id.
  [[nodiscard]] std::vector<request_drop> snapshot() const
  {
    std::vector<request_drop> out;
    out.reserve(by_request_.size());
    for (const auto& [id, d] : by_request_) { out.push_back(d); }
    std::sort(out.begin(), out.end(),
              [](const request_drop& a, const request_drop& b) { return a.request < b.request; });
    return out;
  }

 private:
  bool any_{false};
  std::uint64_t last_forward_{0};
  std::unordered_map<std::uint64_t, request_drop> by_request_;
};

}  // namespace ferry::sink::detail
