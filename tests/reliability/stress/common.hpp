// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the reliability harnesses (stress, sweep, fuzz): sequence-derived payload sources in
// device memory, a D2H entry checker, an H2D byte model, and a plain pass/fail tally.
#pragma once

#include "support/d2h_checker.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/testing/pattern.hpp>
#include <ferry/h2d.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ferry::rel {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace fh = ferry::h2d;

/// Failure tally: every failed check prints one line (first 20) and counts.
struct tally {
  std::mutex m;
  std::uint64_t failures{0};
  void fail(const std::string& what)
  {
    std::lock_guard lock{m};
    if (++failures <= 20) { std::fprintf(stderr, "FAIL: %s\n", what.c_str()); }
  }
  void expect(bool ok, const std::string& what)
  {
    if (!ok) { fail(what); }
  }
};

/// Device memory holding entry payloads: slot k holds pattern(first_seq + k) for `stride` bytes, written
/// through a pinned buffer and one H2D on `s` (stream-ordered before any kernel enqueued later on `s`).
template <class B>
struct sources {
  B b;
  fb::device_buffer<B> dev;
  fb::pinned_buffer<B> host;
  std::uint64_t stride, count;
  sources(B be, std::uint64_t n, std::uint64_t stride_bytes)
    : b{be}, dev{n * stride_bytes, be}, host{n * stride_bytes, be}, stride{stride_bytes}, count{n}
  {
  }
  /// Refill for sequences [first, first + count); the caller guarantees the previous H2D and every
  /// kernel that read `dev` completed (it synchronized the stream or an event after them).
  void fill(std::uint64_t first, typename B::stream_type s, std::uint64_t bytes_per_slot = 0)
  {
    const std::uint64_t n = bytes_per_slot == 0 ? stride : bytes_per_slot;
    auto* h = static_cast<std::uint8_t*>(host.data());
    for (std::uint64_t k = 0; k < count; ++k) {
      auto* w = reinterpret_cast<std::uint64_t*>(h + k * stride);
      for (std::uint64_t i = 0; i < (n + 7) / 8; ++i) { w[i] = ferry::testing::pattern_word(first + k, i); }
    }
    b.memcpy_async(dev.data(), host.data(), count * stride, fb::memcpy_kind::host_to_device, s);
  }
  [[nodiscard]] const void* at(std::uint64_t k) const { return static_cast<const std::byte*>(dev.data()) + k * stride; }
};

/// Every entry, in order: the shared checker (tests/support/d2h_checker.hpp) requiring consecutive seqs.
struct d2h_checker : ferry::test::d2h_checker {
  d2h_checker() : ferry::test::d2h_checker{ferry::test::seq_order::consecutive} {}
};

/// Reads `n` device bytes back through an own stream (test-side, after the producer synchronized).
template <class B>
std::vector<std::uint8_t> read_back(B b, const void* dev, std::size_t n)
{
  fb::stream<B> s{b};
  fb::pinned_buffer<B> tmp{std::max<std::size_t>(n, 16), b};
  b.memcpy_async(tmp.data(), dev, n, fb::memcpy_kind::device_to_host, s.handle());
  s.synchronize();
  std::vector<std::uint8_t> v(n);
  std::memcpy(v.data(), tmp.data(), n);
  return v;
}

inline bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace ferry::rel
