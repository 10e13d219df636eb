// SPDX-License-Identifier: Apache-2.0
// The D2H channel suite, typed over backends: host and faulty<host> in CI, cuda on the H200.
// Every payload byte is sequence-derived (pattern_byte(seq, i)), so a stale, torn or misplaced byte fails.
#pragma once

#include "support/d2h_checker.hpp"
#include "support/gpu.hpp"
#include "support/sanitizer.hpp"

#include <ferry/backend.hpp>
#include <ferry/backend/probe.hpp>
#include <ferry/d2h.hpp>
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
    (void)b.preload(fb::probe::late_fill_kernel(typename B::tag{}));
    s.synchronize();
  }
  /// Enqueues the slow fill of slot j on `s`, then captures it as entry j of `hook` (expected by `chk`).
  template <class Checker>
  void fill_and_capture(fd::channel<B>& ch, Checker& chk, fb::stream_view<B> s, std::uint64_t j, std::uint32_t hook)
  {
    auto* src = static_cast<std::uint64_t*>(dev.data()) + j * stride / 8;
    b.launch(fb::probe::late_fill_kernel(typename B::tag{}), fb::launch_config{{1}, {128}, 0}, s.handle(), src,
             std::uint64_t{stride / 8}, std::uint64_t{j}, std::uint64_t{20'000});
    chk.expect(j, hook, stride);
    ch.capture(fd::hook_id{hook}, src, stride, s);
  }
};

/// The verdict of a join test on late_sources: with the join (`fault` none) all `n` entries arrive exact;
/// the mutant that drops it must be caught by the same checks (`missing_join` says what it dropped).
inline void expect_join_verdict(const checker& chk, fd::debug_fault fault, std::uint64_t n, const char* missing_join)
{
  if (fault == fd::debug_fault::none) {
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
    b.launch(fb::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {32}, 0}, s.handle(), f,
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

template <class B>
class D2hChannel : public ::testing::Test {
 protected:
  void SetUp() override
  {
    FERRY_REQUIRE_DEVICE(B{}.device_count());
    b.set_device(fb::device_id{0});
    set_jitter<B>(30us);
  }
  void TearDown() override { set_jitter<B>(0us); }

  static fd::config small_config(std::size_t ring, std::uint32_t k)
  {
    fd::config c;
    c.ring_bytes = ring;
    c.publish_every = k;
    c.timeout = 10s;
    c.size_slots = 64;
    return c;
  }
  B b{};
};

TYPED_TEST_SUITE_P(D2hChannel);

// Random sizes and K, both head placements, releases inline or on the branch (config::branch_publish), a
// small ring (many wraps: the producer's flush releases join the branch back), eager mode, drain thread.
TYPED_TEST_P(D2hChannel, EagerRandomSizesAndKAcrossWrap)
{
  using B = TypeParam;
  std::mt19937_64 rng{12345};
  for (auto [placement, branch] : {std::pair{fd::head_placement::managed, false}, std::pair{fd::head_placement::managed, true},
                                   std::pair{fd::head_placement::pinned_mapped, false}, std::pair{fd::head_placement::pinned_mapped, true}}) {
    for (std::uint32_t k : {1U, 3U, 16U}) {
      fb::stream<B> s{this->b};
      constexpr std::uint64_t n = 160, stride = 3000;
      sources<B> src{this->b, s, 0, n, stride};
      checker chk;
      auto cfg = this->small_config(24 << 10, k);
      cfg.placement = placement;
      cfg.branch_publish = branch;
      {
        fd::channel<B> ch{cfg, this->b, chk.callback()};
        std::uint64_t seq = 0;
        while (seq < n) {
          ch.begin_forward(s);
          const std::uint64_t in_fwd = 1 + rng() % 11;
          for (std::uint64_t j = 0; j < in_fwd && seq < n; ++j, ++seq) {
            const std::uint64_t size = 1 + rng() % stride;
            chk.expect(seq, static_cast<std::uint32_t>(j), size);
            ch.capture(fd::hook_id{static_cast<std::uint32_t>(j)}, src.at(seq), size, s);
          }
          (void)ch.end_forward(s);
        }
        const auto rep = ch.close();
        EXPECT_TRUE(rep.clean());
        EXPECT_EQ(rep.delivered, n);
        const auto st = ch.stats();
        EXPECT_EQ(st.entries_drained, n);
        EXPECT_EQ(st.entries_published, n);
        EXPECT_LE(st.high_watermark, cfg.ring_bytes);
      }
      EXPECT_EQ(chk.got, n) << "K " << k << " branch " << branch;
      EXPECT_EQ(chk.bad_entries, 0U) << "K " << k << " branch " << branch;
      EXPECT_EQ(chk.bad_meta, 0U) << "K " << k << " branch " << branch;
      EXPECT_EQ(chk.out_of_order, 0U) << "K " << k << " branch " << branch;
    }
  }
}

// One release per K hooks plus one per forward; the drain coalesces contiguous published entries.
TYPED_TEST_P(D2hChannel, PublishesOncePerKAndCoalescesCopies)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 40, 256};
  checker chk;
  auto cfg = this->small_config(1 << 20, 4);
  cfg.drain = fd::drain_mode::poll;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  ch.begin_forward(s);
  for (std::uint64_t i = 0; i < 10; ++i) {
    chk.expect(i, 7, 256);
    ch.capture(fd::hook_id{7}, src.at(i), 256, s);
  }
  (void)ch.end_forward(s);
  EXPECT_EQ(ch.stats().publishes, 3U) << "10 hooks, K = 4: two batch releases and one at the forward end";
  s.synchronize();
  while (ch.poll() > 0 || ch.stats().entries_drained < 10) {
  }
  EXPECT_EQ(chk.got, 10U);
  EXPECT_EQ(chk.bad_entries, 0U);
  EXPECT_LE(ch.stats().copies, 3U) << "one D2H per contiguous published range, not one per entry";
  (void)ch.close();
}

// The drain never enqueues a D2H before it acquired a published_head covering the entry. The compute
// stream is held by a gate, so the payload is not written yet: a drain that copies early reads garbage.
TYPED_TEST_P(D2hChannel, DrainNeverCopiesBeforeAcquire)
{
  using B = TypeParam;
  for (auto fault : with_mutant(fd::debug_fault::drain_without_acquire)) {
    fb::stream<B> s{this->b};
    sources<B> src{this->b, s, 0, 8, 4096};
    gate<B> g{this->b};
    checker chk;
    auto cfg = this->small_config(1 << 20, 2);
    cfg.debug = fault;
    {
      fd::channel<B> ch{cfg, this->b, chk.callback()};
      g.close_on(this->b, s);
      ch.begin_forward(s);
      for (std::uint64_t i = 0; i < 8; ++i) {
        chk.expect(i, 1, 4096);
        ch.capture(fd::hook_id{1}, src.at(i), 4096, s);
      }
      (void)ch.end_forward(s);
      std::this_thread::sleep_for(30ms);
      if (fault == fd::debug_fault::none) {
        EXPECT_EQ(ch.stats().copies, 0U) << "a D2H was enqueued before published_head covered it";
        EXPECT_EQ(ch.stats().entries_published, 0U);
      }
      g.open();
      EXPECT_TRUE(ch.close().clean());
    }
    if (fault == fd::debug_fault::none) {
      EXPECT_EQ(chk.got, 8U);
      EXPECT_EQ(chk.bad_entries, 0U);
    } else {
      EXPECT_GT(chk.bad_entries, 0U) << "the guard test must detect a drain that copies before the acquire";
    }
  }
}

// Ring space is reused only after the D2H that reads it completed (slow copies, tiny ring, jitter).
TYPED_TEST_P(D2hChannel, RingSpaceNotReusedBeforeCopyCompletes)
{
  using B = TypeParam;
  std::vector<fd::debug_fault> faults{fd::debug_fault::none};
  if constexpr (is_host_v<B>) {
    if (!under_tsan) { faults.push_back(fd::debug_fault::reclaim_before_copy_complete); }  // support/sanitizer.hpp
  }
  for (auto fault : faults) {
    fb::stream<B> s{this->b};
    constexpr std::uint64_t n = 96;
    sources<B> src{this->b, s, 0, n, 1024};
    checker chk;
    auto cfg = this->small_config(4096, 1);
    cfg.debug = fault;
    cfg.debug_copy_delay = 2ms;
    {
      fd::channel<B> ch{cfg, this->b, chk.callback()};
      ch.begin_forward(s);
      for (std::uint64_t i = 0; i < n; ++i) {
        chk.expect(i, 2, 1024);
        ch.capture(fd::hook_id{2}, src.at(i), 1024, s);
      }
      (void)ch.end_forward(s);
      EXPECT_TRUE(ch.close().clean());
      // The host backend delays every drain copy (debug_copy_delay), so the 4 KiB ring must fill; on a GPU the
      // delay hook does not exist and whether the ring fills depends on timing (under compute-sanitizer
      // memcheck the drain keeps up), so only the data checks below are required there.
      if constexpr (is_host_v<B>) {
        if (fault == fd::debug_fault::none) { EXPECT_GT(ch.stats().stalls, 0U) << "the ring never filled up"; }
      }
    }
    EXPECT_EQ(chk.got, n);
    if (fault == fd::debug_fault::none) {
      EXPECT_EQ(chk.bad_entries, 0U);
    } else {
      EXPECT_GT(chk.bad_entries, 0U) << "the guard test must detect reuse before the copy completed";
    }
  }
}

// Graph mode: capture one forward (odd entry count: exercises the cursor parity normalization), plan
// and replay it many times; replays land in the right ring place across wraps. With branch_publish the
// batch releases are a forked branch of the graph, joined back before the forward-end release.
TYPED_TEST_P(D2hChannel, GraphReplaysLandInTheRightPlaceAcrossWrap)
{
  using B = TypeParam;
  for (auto [k, branch] : {std::pair{2U, false}, std::pair{16U, false}, std::pair{2U, true}}) {
    fb::stream<B> s{this->b};
    const std::vector<std::uint64_t> sizes{1000, 48, 4096, 333, 2048};
    constexpr std::uint64_t stride = 4096, replays = 24;
    const std::uint64_t n = sizes.size();
    fb::device_buffer<B> dsrc{n * stride, this->b};
    fb::pinned_buffer<B> all{replays * n * stride, this->b};
    auto* h = static_cast<std::uint8_t*>(all.data());
    for (std::uint64_t r = 0; r < replays; ++r) {
      for (std::uint64_t j = 0; j < n; ++j) {
        for (std::uint64_t i = 0; i < stride; ++i) {
          h[(r * n + j) * stride + i] = ferry::testing::pattern_byte(r * n + j, i);
        }
      }
    }
    checker chk;
    auto cfg = this->small_config(13 << 10, k);  // not a multiple of the forward: wraps move around
    cfg.branch_publish = branch;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    fd::forward_plan plan;
    auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      ch.begin_forward(cs);
      for (std::uint64_t j = 0; j < n; ++j) {
        ch.capture(fd::hook_id{static_cast<std::uint32_t>(100 + j)},
                   static_cast<const std::byte*>(dsrc.data()) + j * stride, sizes[j], cs);
      }
      plan = ch.end_forward(cs);
    });
    ASSERT_EQ(plan.size(), n);
    for (std::uint64_t r = 0; r < replays; ++r) {
      for (std::uint64_t j = 0; j < n; ++j) { chk.expect(r * n + j, static_cast<std::uint32_t>(100 + j), sizes[j]); }
      // New payloads for this replay, in stream order after the previous replay's copies.
      this->b.memcpy_async(dsrc.data(), h + r * n * stride, n * stride, fb::memcpy_kind::host_to_device, s.handle());
      ch.replay(g, plan, s);
    }
    EXPECT_TRUE(ch.close().clean());
    EXPECT_EQ(chk.got, replays * n) << "K " << k;
    EXPECT_EQ(chk.bad_entries, 0U) << "K " << k;
    EXPECT_EQ(chk.bad_meta, 0U) << "K " << k;
  }
}

// Under programmatic dependent launch (sm_90+) a copy kernel may be scheduled while the kernel ahead of it on
// the stream still runs; its griddepcontrol.wait is what keeps it from reading the source (and the cursor)
// before that kernel completed. Each entry's source is written by a PDL-aware producer (probe late_fill:
// it lets its dependents be scheduled at once, then writes after ~20 us): with the wait every entry is
// exact; the mutant that skips it (debug_fault::programmatic_without_wait) must be caught by the same checks.
TYPED_TEST_P(D2hChannel, ProgrammaticLaunchJoinsLikeStreamOrder)
{
  using B = TypeParam;
  for (auto fault : with_mutant(fd::debug_fault::programmatic_without_wait)) {
    fb::stream<B> s{this->b};
    constexpr std::uint64_t n = 256, stride = 1024;
    late_sources<B> src{this->b, s, n, stride};
    checker chk;
    auto cfg = this->small_config(1 << 20, 16);
    cfg.debug = fault;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    if (!ch.programmatic_launch()) {
      GTEST_SKIP() << "no programmatic dependent launch on " << B::name() << " (needs CUDA on sm_90+)";
    }
    ch.begin_forward(s);
    for (std::uint64_t j = 0; j < n; ++j) { src.fill_and_capture(ch, chk, s, j, 7); }
    (void)ch.end_forward(s);
    (void)ch.close();
    expect_join_verdict(chk, fault, n, "copy kernels that skip the programmatic-launch join");
  }
}

// config::branch_publish: each batch release runs on the channel's branch stream, forked by an event
// recorded after the batch's last copy. Each entry's source is written by a slow producer kernel (probe
// late_fill, ~20 us, plain launch) right before its copy, so a release that does not wait for the fork
// (debug_fault::branch_publish_without_fork) publishes entries whose copies have not run: the drain reads
// stale ring bytes and the checker must see them. With the fork every entry is exact, and the end_forward
// release (producer stream, after joining the branch back) keeps published_head monotonic.
TYPED_TEST_P(D2hChannel, BranchPublishWaitsForTheFork)
{
  using B = TypeParam;
  for (auto fault : with_mutant(fd::debug_fault::branch_publish_without_fork)) {
    fb::stream<B> s{this->b};
    constexpr std::uint64_t n = 96, stride = 1024;
    late_sources<B> src{this->b, s, n, stride};
    checker chk;
    auto cfg = this->small_config(1 << 20, 4);
    cfg.branch_publish = true;
    cfg.debug = fault;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    for (std::uint64_t f = 0; f < 3; ++f) {
      ch.begin_forward(s);
      for (std::uint64_t j = f * n / 3; j < (f + 1) * n / 3; ++j) { src.fill_and_capture(ch, chk, s, j, 9); }
      (void)ch.end_forward(s);
    }
    (void)ch.close();
    expect_join_verdict(chk, fault, n, "a branch release that does not wait for the batch's copies");
    if (fault == fd::debug_fault::none) {
      EXPECT_EQ(ch.stats().publishes, 3U * (n / 3 / 4) + 3U) << "one branch release per K = 4, one per forward";
    }
  }
}

// Full ring, fail fast: try_capture refuses, capture throws out_of_memory; nothing already published is
// lost, and after draining there is room again.
TYPED_TEST_P(D2hChannel, FullRingFailFast)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 64, 1024};
  checker chk;
  auto cfg = this->small_config(8192, 1);
  cfg.drain = fd::drain_mode::poll;
  cfg.on_full = fd::full_policy::fail_fast;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  ch.begin_forward(s);
  std::uint64_t seq = 0;
  while (true) {
    chk.expect(seq, 3, 1024);
    if (!ch.try_capture(fd::hook_id{3}, src.at(seq), 1024, s)) { break; }
    ++seq;
  }
  EXPECT_EQ(seq, 8U) << "8 KiB ring, 1 KiB entries";
  EXPECT_THROW(ch.capture(fd::hook_id{3}, src.at(seq), 1024, s), ferry::out_of_memory);
  EXPECT_GT(ch.stats().stalls, 0U);
  s.synchronize();
  while (chk.received() < seq) { (void)ch.poll(); }
  ch.capture(fd::hook_id{3}, src.at(seq), 1024, s);  // room again
  ++seq;
  (void)ch.end_forward(s);
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, seq);
  EXPECT_EQ(chk.bad_entries, 0U);
}

// Full ring, blocking: the consumer holds every view (staging full), the producer times out with a typed
// error; then the consumer pops and everything captured before is there.
TYPED_TEST_P(D2hChannel, FullRingBlocksThenTimesOut)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 64, 1024};
  auto cfg = this->small_config(4096, 2);
  cfg.timeout = 150ms;
  fd::channel<B> ch{cfg, this->b};  // no callback: try_pop
  ch.begin_forward(s);
  std::uint64_t seq = 0;
  bool timed_out = false;
  for (; seq < 64; ++seq) {
    try {
      ch.capture(fd::hook_id{4}, src.at(seq), 1024, s);
    } catch (const ferry::timeout_error&) {
      timed_out = true;
      break;
    }
  }
  EXPECT_TRUE(timed_out);
  EXPECT_EQ(seq, 8U) << "4 KiB ring + 4 KiB staging, 1 KiB entries";
  (void)ch.end_forward(s);
  checker chk;
  for (std::uint64_t i = 0; i < seq; ++i) { chk.expect(i, 4, 1024); }
  std::uint64_t popped = 0;
  ASSERT_TRUE(wait_until<B>([&] {
    while (auto v = ch.try_pop()) {
      chk.check(*v);
      ++popped;
    }
    return popped == seq;
  }));
  EXPECT_EQ(chk.bad_entries, 0U);
  EXPECT_TRUE(ch.close().clean());
}

// Delayed drain (poll mode, nobody polls for a while): nothing is lost, everything arrives on poll().
TYPED_TEST_P(D2hChannel, DelayedDrainLosesNothing)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  constexpr std::uint64_t n = 48;
  sources<B> src{this->b, s, 0, n, 512};
  checker chk;
  auto cfg = this->small_config(64 << 10, 5);
  cfg.drain = fd::drain_mode::poll;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  for (std::uint64_t f = 0; f < 4; ++f) {
    ch.begin_forward(s);
    for (std::uint64_t j = 0; j < n / 4; ++j) {
      const auto seq = f * (n / 4) + j;
      chk.expect(seq, 5, 512);
      ch.capture(fd::hook_id{5}, src.at(seq), 512, s);
    }
    (void)ch.end_forward(s);
  }
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(chk.received(), 0U);
  ASSERT_TRUE(wait_until<B>([&] {
    (void)ch.poll();
    return chk.received() == n;
  }));
  EXPECT_EQ(chk.bad_entries, 0U);
  EXPECT_EQ(chk.out_of_order, 0U);
  EXPECT_TRUE(ch.close().clean());
}

// Dynamic sizes through the size ring, eager and graph: exact sizes are copied, actual > reserved is a
// typed error on that entry plus a counter, and the drain goes on.
TYPED_TEST_P(D2hChannel, SizeRingCarriesGpuSizesAndRejectsOverflow)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  constexpr std::uint64_t n = 12, reserved = 2048;
  sources<B> src{this->b, s, 0, 2 * n, reserved};
  fb::device_buffer<B> dsize{2 * n * 8, this->b};
  fb::pinned_buffer<B> hsize{2 * n * 8, this->b};
  auto* hs = hsize.template as<std::uint64_t>();
  checker chk;
  std::uint64_t overflow_expected = 0;
  for (std::uint64_t i = 0; i < 2 * n; ++i) {
    hs[i] = i % 5 == 4 ? reserved + 16 * i : 1 + (i * 397) % reserved;
    const bool over = hs[i] > reserved;
    overflow_expected += over ? 1 : 0;
    chk.expect(i, 6, hs[i], over);
  }
  this->b.memcpy_async(dsize.data(), hsize.data(), 2 * n * 8, fb::memcpy_kind::host_to_device, s.handle());
  s.synchronize();
  auto cfg = this->small_config(16 << 10, 3);
  cfg.size_slots = 4;  // fewer slots than entries: slots are reused after consumption
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  const auto* sz = dsize.template as<const std::uint64_t>();
  ch.begin_forward(s);  // eager
  for (std::uint64_t i = 0; i < n; ++i) { ch.capture_dynamic(fd::hook_id{6}, src.at(i), reserved, sz + i, s); }
  (void)ch.end_forward(s);
  // graph mode: the sizes are read by the captured kernels at replay time
  fb::device_buffer<B> gsize{4 * 8, this->b};
  fb::device_buffer<B> gsrc{4 * reserved, this->b};
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    for (std::uint64_t j = 0; j < 4; ++j) {
      ch.capture_dynamic(fd::hook_id{6}, static_cast<const std::byte*>(gsrc.data()) + j * reserved, reserved,
                         gsize.template as<const std::uint64_t>() + j, cs);
    }
    plan = ch.end_forward(cs);
  });
  for (std::uint64_t r = 0; r < 3; ++r) {
    const std::uint64_t first = n + r * 4;
    this->b.memcpy_async(gsize.data(), hs + first, 4 * 8, fb::memcpy_kind::host_to_device, s.handle());
    this->b.memcpy_async(gsrc.data(), static_cast<const std::byte*>(src.dev.data()) + first * reserved, 4 * reserved,
                         fb::memcpy_kind::device_to_device, s.handle());
    ch.replay(g, plan, s);
  }
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 2 * n);
  EXPECT_EQ(chk.bad_entries, 0U);
  EXPECT_EQ(chk.bad_meta, 0U);
  EXPECT_EQ(chk.overflows, overflow_expected);
  EXPECT_EQ(ch.stats().size_overflows, overflow_expected);
}

// Shutdown with copies in flight drains every published entry; an entry reserved but never published
// (a planned replay that was never launched) is reported by a typed error, not dropped silently.
TYPED_TEST_P(D2hChannel, ShutdownDrainsOrReportsEverything)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  constexpr std::uint64_t n = 64;
  sources<B> src{this->b, s, 0, n, 2048};
  checker chk;
  auto cfg = this->small_config(1 << 20, 8);
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  ch.begin_forward(s);
  for (std::uint64_t i = 0; i < n; ++i) {
    chk.expect(i, 8, 2048);
    ch.capture(fd::hook_id{8}, src.at(i), 2048, s);
  }
  (void)ch.end_forward(s);
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    ch.capture(fd::hook_id{9}, src.at(0), 64, cs);
    ch.capture(fd::hook_id{9}, src.at(1), 64, cs);
    plan = ch.end_forward(cs);
  });
  ch.plan(plan);  // reserved, never launched
  try {
    (void)ch.close(300ms);
    ADD_FAILURE() << "close() must report the unpublished entries";
  } catch (const fd::shutdown_error& e) {
    ASSERT_EQ(e.report().unpublished.size(), 2U);
    EXPECT_EQ(e.report().unpublished[0].value, n);
    EXPECT_EQ(e.report().unpublished_hooks[1].value, 9U);
  }
  EXPECT_EQ(chk.got, n) << "every published entry is delivered at shutdown";
  EXPECT_EQ(chk.bad_entries, 0U);
  s.synchronize();
}

// Every misuse gets a typed error and loses nothing already published.
TYPED_TEST_P(D2hChannel, MisuseIsATypedErrorAndLosesNothing)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 4, 256};
  auto bad_k = this->small_config(1 << 16, 0);
  EXPECT_THROW((fd::channel<B>{bad_k, this->b}), ferry::logic_error);
  auto bad_ring = this->small_config(1000, 1);
  EXPECT_THROW((fd::channel<B>{bad_ring, this->b}), ferry::logic_error);
  checker chk;
  auto cfg = this->small_config(1 << 16, 2);
  cfg.size_slots = 0;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  EXPECT_THROW((fd::channel<B>{cfg, this->b}), ferry::logic_error) << "one channel per device";
  EXPECT_THROW((void)ch.end_forward(s), ferry::logic_error) << "end_forward without begin_forward";
  EXPECT_THROW(ch.capture(fd::hook_id{1}, src.at(0), 64, s), ferry::logic_error) << "capture outside a forward";
  EXPECT_THROW(ch.poll(), ferry::logic_error) << "poll in drain_mode::thread";
  ch.begin_forward(s);
  chk.expect(0, 1, 256);
  ch.capture(fd::hook_id{1}, src.at(0), 256, s);
  EXPECT_THROW(ch.begin_forward(s), ferry::logic_error) << "begin_forward twice";
  EXPECT_THROW(ch.capture(fd::hook_id{1}, src.at(1), 0, s), ferry::logic_error) << "zero-size entry";
  EXPECT_THROW(ch.capture(fd::hook_id{1}, src.at(1), (1 << 16) + 1, s), ferry::logic_error) << "entry > ring";
  EXPECT_THROW(ch.capture_dynamic(fd::hook_id{1}, src.at(1), 64, nullptr, s), ferry::logic_error)
    << "dynamic entry without a size ring";
  fd::forward_plan empty;
  EXPECT_THROW(ch.plan(empty), ferry::logic_error) << "plan not captured by this channel";
  {
    std::thread other([&] {
      EXPECT_THROW(ch.capture(fd::hook_id{1}, src.at(1), 64, s), ferry::logic_error) << "second producer thread";
    });
    other.join();
  }
  if (this->b.device_count() > 1) {
    this->b.set_device(fb::device_id{1});
    EXPECT_THROW(ch.capture(fd::hook_id{1}, src.at(1), 64, s), ferry::logic_error) << "wrong device";
    this->b.set_device(fb::device_id{0});
  }
  chk.expect(1, 1, 256);
  ch.capture(fd::hook_id{1}, src.at(1), 256, s);
  (void)ch.end_forward(s);
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 2U) << "the entries published around the misuse all arrive";
  EXPECT_EQ(chk.bad_entries, 0U);
  EXPECT_EQ(chk.bad_meta, 0U);
}

// One channel per device, several devices in one process: two producers, two drains, no interference.
TYPED_TEST_P(D2hChannel, ChannelsOnTwoDevicesDoNotInterfere)
{
  using B = TypeParam;
  if (this->b.device_count() < 2) { GTEST_SKIP() << "needs 2 devices"; }
  constexpr std::uint64_t n = 120;
  checker chk[2];
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int d = 0; d < 2; ++d) {
    threads.emplace_back([&, d] {
      try {
        B b{};
        b.set_device(fb::device_id{d});
        fb::stream<B> s{b};
        sources<B> src{b, s, 0, n, 1500};
        auto cfg = D2hChannel<B>::small_config(8 << 10, 4 + d);
        fd::channel<B> ch{cfg, b, chk[d].callback()};
        for (std::uint64_t f = 0; f < n / 10; ++f) {
          ch.begin_forward(s);
          for (std::uint64_t j = 0; j < 10; ++j) {
            const auto seq = f * 10 + j;
            chk[d].expect(seq, static_cast<std::uint32_t>(d), 100 + seq * 11);
            ch.capture(fd::hook_id{static_cast<std::uint32_t>(d)}, src.at(seq), 100 + seq * 11, s);
          }
          (void)ch.end_forward(s);
        }
        if (!ch.close().clean()) { ++failures; }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) { t.join(); }
  EXPECT_EQ(failures.load(), 0);
  for (auto& c : chk) {
    EXPECT_EQ(c.got, n);
    EXPECT_EQ(c.bad_entries, 0U);
    EXPECT_EQ(c.bad_meta, 0U);
  }
}

REGISTER_TYPED_TEST_SUITE_P(D2hChannel, EagerRandomSizesAndKAcrossWrap, PublishesOncePerKAndCoalescesCopies,
                            DrainNeverCopiesBeforeAcquire, RingSpaceNotReusedBeforeCopyCompletes,
                            GraphReplaysLandInTheRightPlaceAcrossWrap, FullRingFailFast, FullRingBlocksThenTimesOut,
                            DelayedDrainLosesNothing, SizeRingCarriesGpuSizesAndRejectsOverflow,
                            ShutdownDrainsOrReportsEverything, MisuseIsATypedErrorAndLosesNothing,
                            ChannelsOnTwoDevicesDoNotInterfere, ProgrammaticLaunchJoinsLikeStreamOrder,
                            BranchPublishWaitsForTheFork);

}  // namespace ferry::test
