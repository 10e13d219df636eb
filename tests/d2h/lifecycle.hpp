// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hLifecycle, over backends (host and faulty<host> in CI, cuda on the H200).
// Lifecycle: shutdown drains or reports every entry; channels on several devices.
#pragma once

#include "d2h/fixture.hpp"

#include <string>
#include <thread>

namespace ferry::test {

template <class B>
class D2hLifecycle : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hLifecycle);

TYPED_TEST_P(D2hLifecycle, ShutdownDrainsOrReportsEverything)
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

TYPED_TEST_P(D2hLifecycle, ChannelsOnTwoDevicesDoNotInterfere)
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
        auto cfg = d2h_fixture<B>::small_config(8 << 10, 4 + d);
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

/// Every call on a moved-from channel throws logic_error ("moved-from d2h channel") instead of crashing;
/// the channel it moved into works and delivers everything.
TYPED_TEST_P(D2hLifecycle, MovedFromChannelThrowsLogicError)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 1, 256};
  checker chk;
  auto cfg = this->small_config(1 << 16, 2);
  fd::channel<B> a{cfg, this->b, chk.callback()};
  fd::channel<B> live{std::move(a)};
  try {
    a.begin_forward(s);  // NOLINT(bugprone-use-after-move): the misuse under test
    ADD_FAILURE() << "begin_forward on a moved-from channel was accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("moved-from d2h channel"), std::string::npos) << e.what();
  }
  // every public call, one by one (capture_deferred and flush used to dereference null: SIGSEGV)
  fd::forward_plan plan;
  fb::graph_exec<B> graph;
  std::uint64_t size = 256;
  EXPECT_THROW(a.capture(fd::hook_id{1}, src.at(0), 256, s), ferry::logic_error);
  EXPECT_THROW((void)a.try_capture(fd::hook_id{1}, src.at(0), 256, s), ferry::logic_error);
  EXPECT_THROW(a.capture_dynamic(fd::hook_id{1}, src.at(0), 256, &size, s), ferry::logic_error);
  EXPECT_THROW(a.capture_deferred(fd::hook_id{1}, src.at(0), 256, s), ferry::logic_error);
  EXPECT_THROW(a.flush(s), ferry::logic_error);
  EXPECT_THROW((void)a.deferred_pending(), ferry::logic_error);
  EXPECT_THROW((void)a.open_forward(), ferry::logic_error);
  EXPECT_THROW((void)a.end_forward(s), ferry::logic_error);
  EXPECT_THROW((void)a.abort_forward(s), ferry::logic_error);
  EXPECT_THROW((void)a.begin_write(fd::hook_id{1}, 64, s), ferry::logic_error);
  EXPECT_THROW(a.end_write(fd::write_ticket{}, s), ferry::logic_error);
  EXPECT_THROW(a.plan(plan), ferry::logic_error);
  EXPECT_THROW((void)a.try_plan(plan), ferry::logic_error);
  EXPECT_THROW(a.replay(graph, plan, s), ferry::logic_error);
  EXPECT_THROW((void)a.poll(), ferry::logic_error);
  EXPECT_THROW((void)a.try_pop(), ferry::logic_error);
  EXPECT_THROW((void)a.stats(), ferry::logic_error);
  EXPECT_THROW((void)a.cfg(), ferry::logic_error);
  EXPECT_THROW((void)a.programmatic_launch(), ferry::logic_error);
  EXPECT_THROW((void)a.device(), ferry::logic_error);
  EXPECT_THROW((void)a.ring_bytes(), ferry::logic_error);
  EXPECT_THROW((void)a.invalidated(), ferry::logic_error);
  EXPECT_THROW((void)a.invalidation_reason(), ferry::logic_error);
  EXPECT_THROW((void)a.close(), ferry::logic_error);
  EXPECT_THROW((void)a.close(std::chrono::milliseconds(10)), ferry::logic_error);
  live.begin_forward(s);
  chk.expect(0, 1, 256);
  live.capture(fd::hook_id{1}, src.at(0), 256, s);
  (void)live.end_forward(s);
  fd::channel<B> assigned{cfg, this->b};
  assigned = std::move(live);
  EXPECT_THROW(live.begin_forward(s), ferry::logic_error);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(assigned.close().clean());
  EXPECT_EQ(chk.got, 1U);
  EXPECT_EQ(chk.bad_entries, 0U);
}

// One producer thread at a time: another thread's call is refused until the producer thread released its role
// between forwards (release_producer_thread); releasing with a forward open is refused.
TYPED_TEST_P(D2hLifecycle, ProducerThreadIsHandedOverBetweenForwards)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 3, 256};
  checker chk;
  fd::channel<B> ch{this->small_config(1 << 16, 2), this->b, chk.callback()};
  auto forward = [&](std::uint64_t seq) {
    this->b.set_device(fb::device_id{0});
    ch.begin_forward(s);
    chk.expect(seq, 1, 256);
    ch.capture(fd::hook_id{1}, src.at(seq), 256, s);  // source k holds entry k's pattern
    (void)ch.end_forward(s);
  };
  forward(0);
  std::string refused;
  std::thread{[&] {
    try {
      forward(1);
    } catch (const ferry::logic_error& e) {
      refused = e.what();
    }
  }}.join();
  EXPECT_NE(refused.find("expected the producer thread"), std::string::npos) << refused;
  ch.begin_forward(s);
  EXPECT_THROW(ch.release_producer_thread(), ferry::logic_error) << "a forward is open";
  (void)ch.abort_forward(s);
  ch.release_producer_thread();
  std::thread{[&] { forward(1); }}.join();  // the new producer thread
  EXPECT_THROW(forward(2), ferry::logic_error) << "the role went to the other thread";
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 2U);
  EXPECT_EQ(chk.bad_entries, 0U);
}

REGISTER_TYPED_TEST_SUITE_P(D2hLifecycle, ShutdownDrainsOrReportsEverything, ChannelsOnTwoDevicesDoNotInterfere,
                            MovedFromChannelThrowsLogicError, ProducerThreadIsHandedOverBetweenForwards);

}  // namespace ferry::test
