// SPDX-License-Identifier: Apache-2.0
// The D2H entry checker shared by the channel suites (tests/d2h, host and GPU) and the reliability stress
// and sweep (tests/reliability): each delivered entry is compared with what the test expects of its
// sequence number (hook, size, whether its GPU-resolved size overflows), and its payload with the
// sequence-derived pattern, so torn, stale, lost, duplicated or reordered entries are all counted.
// (The GPU stress tool, tests/reliability/gpu_stress, classifies failures further and has its own.)
#pragma once

#include <ferry/d2h.hpp>
#include <ferry/testing/pattern.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace ferry::test {

/// The delivery order a checker requires: `increasing` (sequence numbers only grow; a suite may leave out
/// entries it does not check), `consecutive` (each entry is the previous one + 1, starting at 0).
enum class seq_order { increasing, consecutive };

struct d2h_checker {
  struct expect_t {
    std::uint32_t hook;
    std::uint64_t size;
    bool overflow;
  };

  explicit d2h_checker(seq_order o = seq_order::increasing) : order{o} {}

  seq_order order;
  std::uint64_t pattern_base{0};  ///< entry seq s carries pattern(pattern_base + s): channels sharing a device differ
  std::mutex m;
  std::map<std::uint64_t, expect_t> expected;  ///< entries not delivered yet
  std::uint64_t got{0};           ///< entries delivered
  std::uint64_t bytes{0};         ///< payload bytes compared
  std::uint64_t overflows{0};     ///< expected size overflows, reported as such
  std::uint64_t bad_entries{0};   ///< payload differs from the entry's pattern (torn or stale)
  std::uint64_t bad_meta{0};      ///< unexpected or duplicated seq, wrong hook/size/status
  std::uint64_t out_of_order{0};  ///< seq against `order`
  std::int64_t last_seq{-1};
  std::string first_bad;          ///< what the first failure was

  void expect(std::uint64_t seq, std::uint32_t hook, std::uint64_t size, bool overflow = false)
  {
    std::lock_guard lock{m};
    expected[seq] = {hook, size, overflow};
  }

  [[nodiscard]] std::uint64_t bad() const noexcept { return bad_entries + bad_meta + out_of_order; }

  void check(const ferry::d2h::entry_view& v)
  {
    namespace fd = ferry::d2h;
    std::lock_guard lock{m};
    ++got;
    const auto seq = v.seq().value;
    const auto s = static_cast<std::int64_t>(seq);
    if (order == seq_order::consecutive ? s != last_seq + 1 : s <= last_seq) {
      fail(out_of_order, "seq " + std::to_string(seq) + " after " + std::to_string(last_seq));
    }
    last_seq = s;
    const auto it = expected.find(seq);
    if (it == expected.end()) {
      fail(bad_meta, "unexpected or duplicated seq " + std::to_string(seq));
      return;
    }
    const expect_t e = it->second;
    expected.erase(it);
    if (e.hook != v.hook().value || e.size != v.size()) {
      fail(bad_meta, "seq " + std::to_string(seq) + ": hook/size mismatch");
      return;
    }
    if (e.overflow) {  // reported on the entry, and its bytes refuse with the typed error
      bool threw = false;
      try {
        (void)v.bytes();
      } catch (const fd::size_overflow_error& err) {
        threw = err.seq().value == seq && err.actual() == v.size();
      }
      if (v.status() != fd::entry_status::size_overflow || !threw) {
        fail(bad_meta, "seq " + std::to_string(seq) + ": overflow not reported");
        return;
      }
      ++overflows;
      return;
    }
    if (!v.ok()) {
      fail(bad_meta, "seq " + std::to_string(seq) + ": status not ok");
      return;
    }
    const auto b = v.bytes();
    bytes += b.size();
    const std::size_t at = ferry::testing::first_pattern_mismatch(b.data(), b.size(), pattern_base + seq);
    if (at != b.size()) { fail(bad_entries, "seq " + std::to_string(seq) + ": payload byte " + std::to_string(at)); }
  }

  auto callback()
  {
    return [this](ferry::d2h::entry_view&& v) { check(v); };
  }
  std::uint64_t received()
  {
    std::lock_guard lock{m};
    return got;
  }

 private:
  void fail(std::uint64_t& counter, std::string what)
  {
    ++counter;
    if (first_bad.empty()) { first_bad = std::move(what); }
  }
};

}  // namespace ferry::test
