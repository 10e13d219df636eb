// SPDX-License-Identifier: Apache-2.0
// Shared setup of the D2H typed suites (ordering.hpp, capacity.hpp, graph.hpp, lifecycle.hpp, failure.hpp,
// multi_channel.hpp): sequence-derived sources, a slow producer, a stream gate, the fixture.
// Every payload byte is sequence-derived (pattern_byte(seq, i)), so a stale, torn or misplaced byte fails.
#pragma once

#include "support/d2h_checker.hpp"
#include "support/gpu.hpp"
#include "support/sanitizer.hpp"

#include <ferry/backend.hpp>
#include <ferry/testing/probe.hpp>
#include <ferry/d2h.hpp>
#include <ferry/testing/d2h_access.hpp>
#include <ferry/testing/pattern.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

namespace ferry::test {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
using namespace std::chrono_literals;
using ferry::testing::d2h_access;
using ferry::testing::d2h_fault;

template <class B>
constexpr bool is_host_v = std::is_base_of_v<fb::host_backend, B>;

template <class B>
void set_jitter(std::chrono::microseconds us)
{
  if constexpr (is_host_v<B>) { fb::host_backend::set_jitter(us); }
}

/// Checks every delivered entry against what the test expects for its sequence number.
using checker = d2h_checker;  // tests/support/d2h_checker.hpp (increasing seq order)

/// Device memory holding sequence-derived payloads: slot k (stride bytes) holds pattern(first_seq + k).
template <class B>
struct sources {
  fb::device_buffer<B> dev;
  std::uint64_t stride;
  sources(B b, fb::stream_view<B> s, std::uint64_t first_seq, std::uint64_t count, std::uint64_t stride_bytes)
    : dev{count * stride_bytes, b}, stride{stride_bytes}
  {
    fb::pinned_buffer<B> host{count * stride_bytes, b};
    auto* h = static_cast<std::uint8_t*>(host.data());
    for (std::uint64_t k = 0; k < count; ++k) {
      for (std::uint64_t i = 0; i < stride; ++i) { h[k * stride + i] = ferry::testing::pattern_byte(first_seq + k, i); }
    }
    b.memcpy_async(dev.data(), host.data(), count * stride, fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
  }
  [[nodiscard]] const void* at(std::uint64_t k) const { return static_cast<const std::byte*>(dev.data()) + k * stride; }
};

/// The sources of a captured forward of `n` entries of `size` bytes: device slots the graph reads, and a
/// pinned table of `forwards` x n payloads (entry e of the table holds pattern(e); payload() rewrites one).
/// load(f, s) copies forward f's payloads into the slots on `s`: the next launch on `s` reads them.
template <class B>
struct replay_sources {
  B b;
  std::uint64_t n, size;
  fb::device_buffer<B> dev;
  fb::pinned_buffer<B> table;
  replay_sources(B be, std::uint64_t entries, std::uint64_t bytes, std::uint64_t forwards)
    : b{be}, n{entries}, size{bytes}, dev{entries * bytes, be}, table{forwards * entries * bytes, be}
  {
    for (std::uint64_t e = 0; e < forwards * n; ++e) { payload(e, e); }
  }
  /// Table entry e (forward e / n, slot e % n) holds pattern(seq).
  void payload(std::uint64_t e, std::uint64_t seq)
  {
    auto* h = static_cast<std::uint8_t*>(table.data()) + e * size;
    for (std::uint64_t i = 0; i < size; ++i) { h[i] = ferry::testing::pattern_byte(seq, i); }
  }
  [[nodiscard]] const void* at(std::uint64_t j) const { return static_cast<const std::byte*>(dev.data()) + j * size; }
  void load(std::uint64_t f, fb::stream_view<B> s)
  {
    b.memcpy_async(dev.data(), static_cast<const std::byte*>(table.data()) + f * n * size, n * size,
                   fb::memcpy_kind::host_to_device, s.handle());
  }
  /// Captures one forward on `s` that captures slot j as an entry of hook j (`deferred`: capture_deferred);
  /// `plan` receives its plan.
  fb::graph_exec<B> capture_forward(fd::channel<B>& ch, fb::stream_view<B> s, fd::forward_plan& plan,
                                    bool deferred = false) const
  {
    return fb::graph_exec<B>::capture(s, [&](fb::stream_view<B> cs) {
      ch.begin_forward(cs);
      for (std::uint64_t j = 0; j < n; ++j) {
        if (deferred) {
          ch.capture_deferred(fd::hook_id{static_cast<std::uint32_t>(j)}, at(j), size, cs);
        } else {
          ch.capture(fd::hook_id{static_cast<std::uint32_t>(j)}, at(j), size, cs);
        }
      }
      plan = ch.end_forward(cs);
    });
  }
};

/// Zeroed device slots whose payloads a slow producer writes just before each capture: slot j is filled with
/// pattern(j) by the probe late_fill kernel ~20 us after it starts (it lets a programmatic dependent start
/// at once), so a copy or a release that does not wait for that kernel sees stale bytes.
template <class B>
struct late_sources {
  B b;
  fb::device_buffer<B> dev;
  std::uint64_t stride;
  late_sources(B be, fb::stream_view<B> s, std::uint64_t count, std::uint64_t stride_bytes)
    : b{be}, dev{count * stride_bytes, be}, stride{stride_bytes}
  {
    b.memset_async(dev.data(), 0, count * stride, s.handle());
    (void)b.preload(ferry::testing::probe::late_fill_kernel(typename B::tag{}));
    s.synchronize();
  }
  /// Enqueues the slow fill of slot j on `s`, then captures it as entry j of `hook` (expected by `chk`),
  /// immediately or (`deferred`) by capture_deferred.
  template <class Checker>
  void fill_and_capture(fd::channel<B>& ch, Checker& chk, fb::stream_view<B> s, std::uint64_t j, std::uint32_t hook,
                        bool deferred = false)
  {
    auto* src = static_cast<std::uint64_t*>(dev.data()) + j * stride / 8;
    b.launch(ferry::testing::probe::late_fill_kernel(typename B::tag{}), fb::launch_config{{1}, {128}, 0}, s.handle(), src,
             std::uint64_t{stride / 8}, std::uint64_t{j}, std::uint64_t{20'000});
    chk.expect(j, hook, stride);
    if (deferred) {
      ch.capture_deferred(fd::hook_id{hook}, src, stride, s);
    } else {
      ch.capture(fd::hook_id{hook}, src, stride, s);
    }
  }
};

/// The verdict of a join test on late_sources: with the join (`fault` none) all `n` entries arrive exact;
/// the mutant that drops it must be caught by the same checks (`missing_join` says what it dropped).
inline void expect_join_verdict(const checker& chk, d2h_fault fault, std::uint64_t n, const char* missing_join)
{
  if (fault == d2h_fault::none) {
    EXPECT_EQ(chk.got, n);
    EXPECT_EQ(chk.bad_entries, 0U);
    EXPECT_EQ(chk.bad_meta, 0U);
  } else {
    EXPECT_GT(chk.bad_entries + chk.bad_meta, 0U) << "the test must detect " << missing_join;
  }
}

/// Blocks a stream until the CPU opens it (the probe consume kernel spins on a system-scope acquire).
template <class B>
struct gate {
  fb::mapped_buffer<B> flag;
  explicit gate(B b) : flag{64, b} { fb::host_store_release(flag.template as<std::uint64_t>(), 0); }
  void close_on(B b, fb::stream_view<B> s)
  {
    const auto* f = static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>());
    b.launch(ferry::testing::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {32}, 0}, s.handle(), f,
             std::uint64_t{1}, f, static_cast<std::uint64_t*>(nullptr), std::uint64_t{0});
  }
  void open() { fb::host_store_release(flag.template as<std::uint64_t>(), 1); }
};

template <class B>
bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds limit = 20s)
{
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) { return false; }
    std::this_thread::sleep_for(200us);
  }
  return true;
}

/// The fixture of every D2H typed suite: device 0 current, host jitter on (30 us per launch).
template <class B>
class d2h_fixture : public ::testing::Test {
 protected:
  void SetUp() override
  {
    FERRY_REQUIRE_DEVICE(B{}.device_count());
    b.set_device(fb::device_id{0});
    set_jitter<B>(30us);
  }
  void TearDown() override { set_jitter<B>(0us); }

 public:
  static fd::config small_config(std::size_t ring, std::uint32_t k)
  {
    fd::config c;
    c.ring_bytes = ring;
    c.publish_every = k;
    c.timeout = 10s;
    c.tuning.size_slots = 64;
    c.tuning.gather_batch = k;  // one gather per K deferred entries, the layout these tests were written for
    return c;
  }

 protected:
  /// The branch-release join check on late_sources: three forwards of 32 slow-filled entries of one hook,
  /// captured immediately or (`deferred`) by capture_deferred, K = `k`, batch releases on the branch. With the
  /// fork event every entry arrives exact and there is one branch release per K plus one per forward; the
  /// mutant whose branch release skips the fork (branch_publish_without_fork) must be caught.
  void expect_branch_release_waits(std::uint32_t k, std::uint32_t hook, bool deferred, const char* missing_join)
  {
    for (auto fault : with_mutant(d2h_fault::branch_publish_without_fork)) {
      fb::stream<B> s{b};
      constexpr std::uint64_t n = 96, stride = 1024;
      late_sources<B> src{b, s, n, stride};
      checker chk;
      auto cfg = small_config(1 << 20, k);
      cfg.tuning.branch_publish = true;
      cfg.tuning.gather_branch_publish = true;
      fd::channel<B> ch{cfg, b, chk.callback()};
      d2h_access::set_fault(ch, fault);
      for (std::uint64_t f = 0; f < 3; ++f) {
        ch.begin_forward(s);
        for (std::uint64_t j = f * n / 3; j < (f + 1) * n / 3; ++j) { src.fill_and_capture(ch, chk, s, j, hook, deferred); }
        (void)ch.end_forward(s);
      }
      (void)ch.close();
      expect_join_verdict(chk, fault, n, missing_join);
      if (fault == d2h_fault::none) {
        EXPECT_EQ(ch.stats().publishes, 3U * (n / 3 / k) + 3U) << "one branch release per K = " << k << ", one per forward";
      }
    }
  }

  B b{};
};

}  // namespace ferry::test
