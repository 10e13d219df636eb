// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hCapacity, over backends (host and faulty<host> in CI, cuda on the H200).
// Capacity: wraps, full rings (fail fast, blocking), a delayed drain, the size ring.
#pragma once

#include "d2h/fixture.hpp"

namespace ferry::test {

template <class B>
class D2hCapacity : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hCapacity);

TYPED_TEST_P(D2hCapacity, EagerRandomSizesAndKAcrossWrap)
{
  using B = TypeParam;
  std::mt19937_64 rng{12345};
  for (auto [placement, branch] : {std::pair{fd::head_memory::managed, false}, std::pair{fd::head_memory::managed, true},
                                   std::pair{fd::head_memory::pinned_mapped, false}, std::pair{fd::head_memory::pinned_mapped, true}}) {
    for (std::uint32_t k : {1U, 3U, 16U}) {
      fb::stream<B> s{this->b};
      constexpr std::uint64_t n = 160, stride = 3000;
      sources<B> src{this->b, s, 0, n, stride};
      checker chk;
      auto cfg = this->small_config(24 << 10, k);
      cfg.tuning.head_memory = placement;
      cfg.tuning.branch_publish = branch;
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

TYPED_TEST_P(D2hCapacity, FullRingFailFast)
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

TYPED_TEST_P(D2hCapacity, FullRingBlocksThenTimesOut)
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

TYPED_TEST_P(D2hCapacity, DelayedDrainLosesNothing)
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

TYPED_TEST_P(D2hCapacity, SizeRingCarriesGpuSizesAndRejectsOverflow)
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
  cfg.tuning.size_slots = 4;  // fewer slots than entries: slots are reused after consumption
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

REGISTER_TYPED_TEST_SUITE_P(D2hCapacity, EagerRandomSizesAndKAcrossWrap, FullRingFailFast, FullRingBlocksThenTimesOut, DelayedDrainLosesNothing, SizeRingCarriesGpuSizesAndRejectsOverflow);

}  // namespace ferry::test
