// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hMisuse, over backends (host and faulty<host> in CI, cuda on the H200).
// Misuse on the drain side and around stream lifetime: each case is a typed error or a reported, tested
// recovery, never wrong bytes, a hang or a crash, and nothing published before it is lost.
#pragma once

#include "d2h/fixture.hpp"

#include <memory>
#include <stdexcept>
#include <string>

namespace ferry::test {

template <class B>
class D2hMisuse : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hMisuse);

/// A callback that throws: the entry is delivered once (never again), its view is released when the
/// callback unwinds (a small staging must be reused for the later entries to arrive), and close() reports
/// the count and the first exception's message (not clean).
TYPED_TEST_P(D2hMisuse, CallbackExceptionsAreReportedByClose)
{
  using B = TypeParam;
  constexpr std::uint64_t n = 8, size = 256;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, n, size};
  checker chk;
  auto cfg = this->small_config(1 << 16, 1);
  cfg.staging_bytes = 2 * size;  // two entries: later ones arrive only if the thrown-through views were released
  fd::channel<B> ch{cfg, this->b, [&](fd::entry_view&& v) {
                      chk.check(v);
                      const auto seq = v.seq().value;
                      if (seq == 5) { throw 42; }  // not a std::exception
                      if (seq % 2 == 1) { throw std::runtime_error("consumer failed on seq " + std::to_string(seq)); }
                    }};
  ch.begin_forward(s);
  for (std::uint64_t j = 0; j < n; ++j) {
    chk.expect(j, 1, size);
    ch.capture(fd::hook_id{1}, src.at(j), size, s);
  }
  (void)ch.end_forward(s);
  bool threw = false;
  try {
    (void)ch.close();
  } catch (const fd::shutdown_error& e) {
    threw = true;
    const auto& r = e.report();
    EXPECT_FALSE(r.clean());
    EXPECT_EQ(r.callback_errors, 4U);
    EXPECT_EQ(r.first_callback_error, "consumer failed on seq 1");
    EXPECT_TRUE(r.unpublished.empty());
    EXPECT_TRUE(r.undrained.empty());
    EXPECT_EQ(r.delivered, n);
    EXPECT_NE(std::string{e.what()}.find("consumer failed on seq 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string{e.what()}.find("4 exceptions"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(threw) << "close() must report callback exceptions";
  EXPECT_EQ(ch.stats().callback_errors, 4U);
  EXPECT_EQ(chk.got, n) << "every entry delivered exactly once, the throwing ones too";
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

/// close() with a forward open: the message leads with the open forward, not "0 entries never published".
TYPED_TEST_P(D2hMisuse, ShutdownErrorLeadsWithTheOpenForward)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 3, 256};
  checker chk;
  fd::channel<B> ch{this->small_config(1 << 16, 16), this->b, chk.callback()};
  ch.begin_forward(s);
  for (std::uint64_t j = 0; j < 3; ++j) {
    chk.expect(j, 1, 256);
    ch.capture(fd::hook_id{1}, src.at(j), 256, s);
  }
  try {
    (void)ch.close();
    ADD_FAILURE() << "close() with an open forward must throw shutdown_error";
  } catch (const fd::shutdown_error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(e.report().forward_open);
    EXPECT_EQ(what.rfind("ferry: d2h channel close: a forward was still open", 0), 0U) << what;
    EXPECT_EQ(what.find("0 entries never published"), std::string::npos) << what;
  }
  EXPECT_EQ(chk.got, 3U) << "the open forward's eager entries are published by close() and delivered";
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

/// The consumer keeps every view: close() reports the published entries it could not copy, and the number
/// of views holding staging is the number the consumer holds (not only those queued for try_pop).
TYPED_TEST_P(D2hMisuse, UndrainedReportCountsTheViewsTheConsumerHolds)
{
  using B = TypeParam;
  constexpr std::uint64_t held = 10, n = 14, size = 256;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, n, size};
  std::mutex m;
  std::vector<fd::entry_view> kept;
  auto cfg = this->small_config(1 << 16, 1);
  cfg.staging_bytes = held * size;
  cfg.timeout = 300ms;
  fd::channel<B> ch{cfg, this->b, [&](fd::entry_view&& v) {
                      std::lock_guard lock{m};
                      kept.push_back(std::move(v));
                    }};
  ch.begin_forward(s);
  for (std::uint64_t j = 0; j < n; ++j) { ch.capture(fd::hook_id{1}, src.at(j), size, s); }
  (void)ch.end_forward(s);
  try {
    (void)ch.close();
    ADD_FAILURE() << "close() with staging held must throw shutdown_error";
  } catch (const fd::shutdown_error& e) {
    const auto& r = e.report();
    EXPECT_EQ(r.delivered, held);
    EXPECT_EQ(r.undrained.size(), n - held);
    EXPECT_EQ(r.views_held, held);
    EXPECT_NE(std::string{e.what()}.find("staging held by 10 views"), std::string::npos) << e.what();
  }
  std::lock_guard lock{m};
  EXPECT_EQ(kept.size(), held);
}

/// bytes_drained counts payload bytes delivered (no alignment padding); bytes_copied the D2H bytes.
TYPED_TEST_P(D2hMisuse, BytesDrainedCountsPayloadBytes)
{
  using B = TypeParam;
  constexpr std::uint64_t n = 12, size = 100;  // 100-byte entries in 112-byte ring slots
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, n, 128};
  checker chk;
  fd::channel<B> ch{this->small_config(1 << 16, 16), this->b, chk.callback()};
  ch.begin_forward(s);
  for (std::uint64_t j = 0; j < n; ++j) {
    chk.expect(j, 1, size);
    ch.capture(fd::hook_id{1}, src.at(j), size, s);
  }
  (void)ch.end_forward(s);
  EXPECT_TRUE(ch.close().clean());
  const auto st = ch.stats();
  EXPECT_EQ(chk.got, n);
  EXPECT_EQ(st.bytes_drained, n * size) << "payload bytes, not the padded span";
  EXPECT_GE(st.bytes_copied, n * size);
  EXPECT_LE(st.bytes_copied, n * 112);
}

/// A captured forward launched directly (graph.launch, no plan()) after planned replays: its claim kernel
/// finds no token, so it writes nothing; the channel is invalidated ("graph replayed without plan()") and
/// every planned entry is delivered exact, nothing past them (the cases first and in the middle:
/// replay_token.hpp).
TYPED_TEST_P(D2hMisuse, GraphReplayedWithoutPlanInvalidatesTheChannel)
{
  using B = TypeParam;
  constexpr std::uint64_t n = 3, size = 512, replays = 4;
  fb::stream<B> s{this->b};
  replay_sources<B> src{this->b, n, size, replays + 1};
  checker chk;
  fd::channel<B> ch{this->small_config(1 << 16, 16), this->b, chk.callback()};
  fd::forward_plan plan;
  auto g = src.capture_forward(ch, s.view(), plan);
  for (std::uint64_t r = 0; r < replays; ++r) {
    for (std::uint64_t j = 0; j < n; ++j) { chk.expect(r * n + j, static_cast<std::uint32_t>(j), size); }
    src.load(r, s.view());
    ch.replay(g, plan, s);
  }
  src.load(replays, s.view());
  g.launch(s);  // the misuse: no plan()
  s.synchronize();
  EXPECT_TRUE(wait_until<B>([&] { return ch.invalidated(); }, 5s)) << "the drainer must see the unplanned replay";
  EXPECT_NE(ch.invalidation_reason().find("graph replayed without plan()"), std::string::npos)
    << ch.invalidation_reason();
  EXPECT_THROW(ch.replay(g, plan, s), ferry::invalidated_error) << "no later forward on an invalidated channel";
  EXPECT_THROW((void)ch.close(), ferry::invalidated_error);
  EXPECT_EQ(chk.got, replays * n) << "every planned entry delivered, nothing past them";
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
  EXPECT_EQ(ch.stats().entries_drained, replays * n);
}

/// The compute stream destroyed before the channel, with a forward open: close() neither hangs nor touches
/// the destroyed stream; it honours its timeout and reports the open forward (not clean); what the stream
/// ran before it was destroyed (the entries of the completed batches) is delivered.
TYPED_TEST_P(D2hMisuse, ComputeStreamDestroyedBeforeCloseIsReportedNotAHang)
{
  using B = TypeParam;
  if constexpr (!is_host_v<B>) {
    GTEST_SKIP() << "a destroyed CUDA/HIP stream's handle is undefined behaviour to use; the host backend checks it";
  }
  constexpr std::uint64_t size = 256;
  sources<B> src{this->b, fb::stream<B>{this->b}.view(), 0, 6, size};
  checker chk;
  auto cfg = this->small_config(1 << 16, 2);
  cfg.timeout = 500ms;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  {
    fb::stream<B> s{this->b};
    ch.begin_forward(s);
    for (std::uint64_t j = 0; j < 5; ++j) {  // K = 2: entries 0..3 released by their batches, entry 4 not
      if (j < 4) { chk.expect(j, 1, size); }
      ch.capture(fd::hook_id{1}, src.at(j), size, s);
    }
  }  // the misuse: the compute stream is destroyed inside the forward
  const auto t0 = std::chrono::steady_clock::now();
  bool reported = false;
  try {
    (void)ch.close();
  } catch (const ferry::error& e) {
    reported = true;  // shutdown_error (open forward, entry 4 unpublished) or invalidated_error (stream gone)
    EXPECT_NE(std::string{e.what()}.find("forward"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(reported) << "close() must report the open forward on the destroyed stream";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "close() honours config::timeout";
  EXPECT_GE(chk.got, 4U) << "the released batches are delivered";
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

/// An entry size near 2^64 (a caller's arithmetic gone wrong) is refused at the call, naming the size: its
/// 16-byte aligned size wraps to a small one, which the size check alone would accept and the copy kernel
/// would then copy 2^64 bytes. Every form (immediate, deferred, dynamic reservation, begin_write) is checked,
/// nothing is published by the refused calls, and the entries around them arrive.
TYPED_TEST_P(D2hMisuse, EntrySizeThatWrapsIsRefused)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 2, 256};
  checker chk;
  auto cfg = this->small_config(1 << 16, 4);
  cfg.tuning.size_slots = 4;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  std::uint64_t actual = 256;
  ch.begin_forward(s);
  chk.expect(0, 1, 256);
  ch.capture(fd::hook_id{1}, src.at(0), 256, s);
  for (std::uint64_t bytes : {~std::uint64_t{0}, ~std::uint64_t{0} - 7, (std::uint64_t{1} << 63) + 1}) {
    const std::string want = "got " + std::to_string(bytes);
    auto refused = [&](auto&& call) {
      try {
        call();
        ADD_FAILURE() << bytes << " bytes accepted";
      } catch (const ferry::logic_error& e) {
        EXPECT_NE(std::string{e.what()}.find(want), std::string::npos) << e.what();
      }
    };
    refused([&] { ch.capture(fd::hook_id{2}, src.at(0), bytes, s); });
    refused([&] { ch.capture_deferred(fd::hook_id{3}, src.at(0), bytes, s); });
    refused([&] { ch.capture_dynamic(fd::hook_id{4}, src.at(0), bytes, &actual, s); });
    refused([&] { (void)ch.begin_write(fd::hook_id{5}, bytes, s); });
  }
  chk.expect(1, 6, 256);
  ch.capture(fd::hook_id{6}, src.at(1), 256, s);
  (void)ch.end_forward(s);
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 2U);
  EXPECT_EQ(chk.bad_entries, 0U);
}

REGISTER_TYPED_TEST_SUITE_P(D2hMisuse, CallbackExceptionsAreReportedByClose, ShutdownErrorLeadsWithTheOpenForward,
                            UndrainedReportCountsTheViewsTheConsumerHolds, BytesDrainedCountsPayloadBytes,
                            GraphReplayedWithoutPlanInvalidatesTheChannel,
                            ComputeStreamDestroyedBeforeCloseIsReportedNotAHang, EntrySizeThatWrapsIsRefused);

}  // namespace ferry::test
