// SPDX-License-Identifier: Apache-2.0
// The consumer of the designs ferry replaces (forward.cpp): a CPU thread that learns which entries are
// ready from the design's own signal (a per-entry flag, or a per-hook event), then copies each ready entry
// with its own D2H and checks every word.
#pragma once

#include "common.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

namespace ferry::bench {

/// Entry e (e = forward * H + hook, counted from the first replay) lives in ring slot e % (3 H) of `bytes`
/// bytes (3 frames of H entries) and carries pattern(e). `ready(next)` returns how many entries are ready
/// (>= next; polled, the thread yields while none is new). Every word of every entry is checked
/// (checks().baseline_checked / baseline_bad); `consumed` is the count of entries copied and checked.
struct baseline_drain {
  B b;
  std::uint64_t H, bytes;
  const std::byte* ring;
  std::function<std::uint64_t(std::uint64_t)> ready;
  fb::stream<B> s;
  // One staging slot per ring slot (3 frames): the replay loop lets the drain fall up to three forwards
  // behind, so a batch [next, f) may hold entries e and e + H; with one frame of staging they would share a
  // slot and the first would be overwritten before it was checked.
  fb::pinned_buffer<B> staging;
  std::atomic<std::uint64_t> consumed{0};
  std::atomic<bool> stop{false};
  std::thread t;

  baseline_drain(B be, std::uint64_t h, std::uint64_t by, const std::byte* r,
                 std::function<std::uint64_t(std::uint64_t)> ready_fn);
  baseline_drain(const baseline_drain&) = delete;
  baseline_drain& operator=(const baseline_drain&) = delete;
  ~baseline_drain();

 private:
  void run();
};

}  // namespace ferry::bench
