// SPDX-License-Identifier: Apache-2.0
// The debug check of published sources (config::debug_sources, FERRY_H2D_DEBUG_SOURCES=1): a slot's pinned
// sources are read by its uploads from publish() (or stage(), for a graph replay) until the slot's next
// begin() has waited for them, so a write in that window silently changes what is uploaded. In debug mode
// publish() and stage() keep a copy of every member's published prefix; the publisher's next begin(),
// resume(), producer(), rewrite(), publish() or stage() (of any slot) compares every copy with the source
// and throws ferry::logic_error naming the group, buffer, slot, epoch and first changed byte. A slot's copies
// are dropped when its next begin() has waited (the sources are writable again), a rewrite()'s members'
// when it has acquired them, all of them at recover(). No backend: plain host memory compares.
#pragma once

#include <ferry/error.hpp>
#include <ferry/h2d/detail/plan.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace ferry::h2d::detail {

/// The copies of the published prefixes (empty and free when the debug mode is off).
class source_check {
 public:
  /// Enables the check (or not) for `slots` runner slots; drops every copy.
  void reset(bool enabled, std::size_t slots)
  {
    enabled_ = enabled;
    copies_.assign(enabled ? slots : 0, {});
  }
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  /// The number of copies held (tests).
  [[nodiscard]] std::size_t size() const noexcept
  {
    std::size_t n = 0;
    for (const auto& c : copies_) { n += c.size(); }
    return n;
  }

  /// After `group` published buffer `buf` in `slot`'s `epoch`: copies its `bytes` published bytes at `src`
  /// (a rewrite's second publication replaces the first's copy).
  void record(std::uint32_t group, std::uint32_t buf, std::size_t slot, std::uint64_t epoch, const unsigned char* src,
              std::size_t bytes)
  {
    if (!enabled_) { return; }
    drop(slot, buf);
    copies_[slot].push_back(copy{group, buf, epoch, src, std::vector<unsigned char>(src, src + bytes)});
  }

  /// Compares every copy with its source; the first changed one is dropped (reported once) and thrown as a
  /// logic_error naming `who`, the call that found it.
  void verify(const declarations& d, std::string_view who)
  {
    if (!enabled_) { return; }
    for (std::size_t slot = 0; slot < copies_.size(); ++slot) {
      auto& v = copies_[slot];
      for (std::size_t i = 0; i < v.size(); ++i) {
        const copy& c = v[i];
        if (c.bytes.empty() || std::memcmp(c.bytes.data(), c.src, c.bytes.size()) == 0) { continue; }
        std::size_t at = 0;
        while (c.bytes[at] == c.src[at]) { ++at; }
        const unsigned was = c.bytes[at];
        const unsigned now = c.src[at];
        const std::size_t n = c.bytes.size();
        const std::uint32_t g = c.group;
        const std::uint32_t buf = c.buf;
        const std::uint64_t epoch = c.epoch;
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
        FERRY_FAIL(logic_error,
                   "h2d group '{}': buffer '{}' source of slot {} was written after publish() (epoch {}): byte {} of "
                   "its {} published bytes was {:#04x}, is {:#04x} now (found by {}, FERRY_H2D_DEBUG_SOURCES); the "
                   "upload may have read either. Write a slot's sources only inside the group's producer scope, "
                   "before its publish(); they are writable again after that slot's next begin()",
                   d.groups[g].name, d.buffers[buf].spec.name, slot, epoch, at, n, was, now, who);
      }
    }
  }

  /// `slot`'s next begin() has waited for its uploads: its sources are writable again.
  void release_slot(std::size_t slot) noexcept
  {
    if (enabled_) { copies_[slot].clear(); }
  }
  /// rewrite(): the earlier upload read `buf`'s source in `slot`; the producer may write it again.
  void drop(std::size_t slot, std::uint32_t buf) noexcept
  {
    if (!enabled_) { return; }
    auto& v = copies_[slot];
    for (std::size_t i = v.size(); i-- > 0;) {
      if (v[i].buf == buf) { v.erase(v.begin() + static_cast<std::ptrdiff_t>(i)); }
    }
  }
  /// recover(): every slot was drained.
  void release_all() noexcept
  {
    for (auto& v : copies_) { v.clear(); }
  }

 private:
  struct copy {
    std::uint32_t group;
    std::uint32_t buf;
    std::uint64_t epoch;
    const unsigned char* src;  ///< the slot's pinned source (fixed from initialize() on)
    std::vector<unsigned char> bytes;
  };
  bool enabled_{false};
  std::vector<std::vector<copy>> copies_;  ///< per slot
};

}  // namespace ferry::h2d::detail
