// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hGraph, over backends (host and faulty<host> in CI, cuda on the H200).
// Graph mode: captured forwards replayed with plan().
#pragma once

#include "d2h/fixture.hpp"

#include <stdexcept>
#include <string>

namespace ferry::test {

template <class B>
class D2hGraph : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hGraph);

TYPED_TEST_P(D2hGraph, GraphReplaysLandInTheRightPlaceAcrossWrap)
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
    cfg.tuning.branch_publish = branch;
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


/// Expects `f()` to throw logic_error whose message contains `what`.
template <class F>
void expect_logic_error(F&& f, const char* what, const char* call)
{
  try {
    f();
    ADD_FAILURE() << call << ": expected logic_error";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find(what), std::string::npos) << call << ": " << e.what();
  }
}

/// Eager forwards of `per` entries each on `s`: entries first..first+count-1 of `src` (hook 1, 256 bytes).
template <class B>
void eager_entries(fd::channel<B>& ch, checker& chk, const sources<B>& src, const fb::stream<B>& s,
                   std::uint64_t first, std::uint64_t count)
{
  ch.begin_forward(s);
  for (std::uint64_t j = first; j < first + count; ++j) {
    chk.expect(j, 1, 256);
    ch.capture(fd::hook_id{1}, src.at(j), 256, s);
  }
  (void)ch.end_forward(s);
}

/// A capture body that throws after begin_forward leaves a captured forward open: without a restore the
/// next call is refused (naming the stream and abort_forward), abort_forward drops it; with
/// graph_exec::capture's on_failure calling abort_forward the channel is usable at once. An eager forward
/// aborted mid-way publishes what it launched. Every entry launched arrives, and later replays are exact.
TYPED_TEST_P(D2hGraph, FailedCaptureIsAbortedAndTheChannelRecovers)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 16, 256};
  checker chk;
  auto cfg = this->small_config(1 << 16, 16);
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  eager_entries(ch, chk, src, s, 0, 3);
  const auto throwing_body = [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    ch.capture(fd::hook_id{1}, src.at(0), 256, cs);
    throw std::runtime_error{"capture body failed"};
  };
  EXPECT_THROW((void)fb::graph_exec<B>::capture(s.view(), throwing_body), std::runtime_error);
  expect_logic_error([&] { ch.begin_forward(s); }, "call abort_forward", "begin_forward after a failed capture");
  expect_logic_error([&] { (void)ch.end_forward(s); }, "no longer capturing", "end_forward after a failed capture");
  EXPECT_TRUE(ch.abort_forward(s));
  EXPECT_FALSE(ch.abort_forward(s)) << "nothing left to abort";
  eager_entries(ch, chk, src, s, 3, 3);
  // graph_exec::capture's failure path restores the channel through on_failure.
  EXPECT_THROW((void)fb::graph_exec<B>::capture(s.view(), throwing_body,
                                                [&](fb::stream_view<B> cs) { (void)ch.abort_forward(cs); }),
               std::runtime_error);
  eager_entries(ch, chk, src, s, 6, 1);
  // An eager forward aborted mid-way (an odd count: the cursor is normalized) publishes what it launched.
  ch.begin_forward(s);
  for (std::uint64_t j = 7; j < 10; ++j) {
    chk.expect(j, 1, 256);
    ch.capture(fd::hook_id{1}, src.at(j), 256, s);
  }
  auto t = ch.begin_write(fd::hook_id{2}, 64, s);  // an open ticket is dropped with the forward
  (void)t;
  EXPECT_TRUE(ch.abort_forward(s));
  // A good capture replayed lands after them.
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    ch.capture(fd::hook_id{1}, src.at(10), 256, cs);
    plan = ch.end_forward(cs);
  });
  chk.expect(10, 1, 256);
  ch.replay(g, plan, s);
  eager_entries(ch, chk, src, s, 11, 2);
  EXPECT_FALSE(ch.invalidated()) << ch.invalidation_reason();
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 13U);
  EXPECT_EQ(chk.bad_entries, 0U);
  EXPECT_EQ(chk.bad_meta, 0U);
}

/// A capture that ends without end_forward gets one behaviour whether or not a batch release was captured
/// (K = 2: captured releases, on the branch they leave the capture unjoined; K = 16: none): every later
/// producer call and plan() are refused with a logic_error naming the stream, abort_forward recovers, and
/// nothing published before or after is lost.
TYPED_TEST_P(D2hGraph, CaptureEndedWithoutEndForwardIsRefusedUntilAborted)
{
  using B = TypeParam;
  for (auto [k, branch] : {std::pair{2U, false}, std::pair{2U, true}, std::pair{16U, false}}) {
    SCOPED_TRACE(::testing::Message() << "K " << k << " branch " << branch);
    fb::stream<B> s{this->b};
    sources<B> src{this->b, s, 0, 8, 256};
    checker chk;
    auto cfg = this->small_config(1 << 16, k);
    cfg.tuning.branch_publish = branch;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    eager_entries(ch, chk, src, s, 0, 2);
    fd::forward_plan good;
    auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      ch.begin_forward(cs);
      ch.capture(fd::hook_id{1}, src.at(2), 256, cs);
      good = ch.end_forward(cs);
    });
    try {  // 4 hooks, no end_forward: the capture itself may succeed or fail (a branch left unjoined)
      auto bad = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
        ch.begin_forward(cs);
        for (std::uint64_t j = 0; j < 4; ++j) { ch.capture(fd::hook_id{1}, src.at(j), 256, cs); }
      });
    } catch (const ferry::backend_error&) {
    }
    expect_logic_error([&] { ch.begin_forward(s); }, "the capture ended without end_forward", "begin_forward");
    expect_logic_error([&] { ch.capture(fd::hook_id{1}, src.at(0), 256, s); }, "no longer capturing", "capture");
    expect_logic_error([&] { (void)ch.end_forward(s); }, "no longer capturing", "end_forward");
    expect_logic_error([&] { ch.plan(good); }, "call abort_forward", "plan");
    EXPECT_FALSE(ch.invalidated()) << ch.invalidation_reason();
    EXPECT_TRUE(ch.abort_forward(s));
    chk.expect(2, 1, 256);
    ch.replay(g, good, s);
    eager_entries(ch, chk, src, s, 3, 3);
    EXPECT_TRUE(ch.close().clean());
    EXPECT_EQ(chk.got, 6U);
    EXPECT_EQ(chk.bad_entries, 0U);
    EXPECT_EQ(chk.bad_meta, 0U);
  }
}

REGISTER_TYPED_TEST_SUITE_P(D2hGraph, GraphReplaysLandInTheRightPlaceAcrossWrap, FailedCaptureIsAbortedAndTheChannelRecovers,
                            CaptureEndedWithoutEndForwardIsRefusedUntilAborted);

}  // namespace ferry::test
