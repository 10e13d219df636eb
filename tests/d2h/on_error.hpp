// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hOnError, over backends (host and faulty<host> in CI, cuda on the H200):
// config::on_error = disable. A misuse inside a forward, a full ring or a throwing consumer disables capture:
// no producer call throws, the open forward is closed (what it launched is published and delivered), later
// producer calls are no-ops, graph replays keep running and write nothing, the error is kept (stats,
// capture_error, close's report), and recover() re-enables capture at a forward boundary. The backend-fault
// sweep under on_error = disable is tests/reliability/sweep (every call index, eager and graph).
#pragma once

#include "d2h/fixture.hpp"

#include <string>

namespace ferry::test {

template <class B>
class D2hOnError : public d2h_fixture<B> {
 protected:
  fd::config disable_config()
  {
    auto c = this->small_config(1 << 16, 2);
    c.on_error = fd::error_policy::disable;
    return c;
  }
  /// close() of a channel whose capture was disabled: a shutdown_error whose report carries the errors.
  static void expect_close_reports(fd::channel<B>& ch, std::uint64_t errors, const std::string& first)
  {
    try {
      (void)ch.close(10s);
      ADD_FAILURE() << "close() must report the capture errors";
    } catch (const fd::shutdown_error& e) {
      EXPECT_EQ(e.report().capture_errors, errors);
      EXPECT_NE(e.report().first_capture_error.find(first), std::string::npos) << e.report().first_capture_error;
      EXPECT_NE(std::string{e.what()}.find("capture disabled"), std::string::npos) << e.what();
    }
  }
};
TYPED_TEST_SUITE_P(D2hOnError);

/// raise (the default): the misuse is the call's typed error.
TYPED_TEST_P(D2hOnError, RaiseIsTheDefault)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s.view(), 0, 1, 256};
  fd::channel<B> ch{this->small_config(1 << 16, 2), this->b};
  ch.begin_forward(s);
  EXPECT_THROW(ch.capture(fd::hook_id{1}, src.at(0), 0, s), ferry::logic_error);
  EXPECT_FALSE(ch.capture_disabled());
  (void)ch.end_forward(s);
  EXPECT_NO_THROW((void)ch.close(10s));
}

/// A misuse inside an eager forward: no throw; the entries launched before it are published and delivered
/// exact; the rest of the forward and the next forward are no-ops (nothing reserved); recover() at the
/// boundary re-enables capture, whose entries arrive exact; close() reports the error.
TYPED_TEST_P(D2hOnError, MisuseDisablesCaptureUntilRecover)
{
  using B = TypeParam;
  constexpr std::uint64_t size = 256;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s.view(), 0, 8, size};
  checker chk;
  fd::channel<B> ch{this->disable_config(), this->b, chk.callback()};
  ch.begin_forward(s);
  for (std::uint64_t j = 0; j < 3; ++j) {  // K = 2: entry 2 is launched, not yet published
    chk.expect(j, 1, size);
    ch.capture(fd::hook_id{1}, src.at(j), size, s);
  }
  EXPECT_NO_THROW(ch.capture(fd::hook_id{1}, src.at(3), 0, s)) << "a 0-byte entry is a misuse";
  EXPECT_TRUE(ch.capture_disabled());
  EXPECT_NE(ch.capture_error().find("expected an entry of > 0 bytes"), std::string::npos) << ch.capture_error();
  EXPECT_NO_THROW(ch.capture(fd::hook_id{1}, src.at(4), size, s));  // no-ops for the rest of the forward
  EXPECT_THROW(ch.recover(), ferry::logic_error) << "recover() inside the engine's forward";
  EXPECT_TRUE(ch.end_forward(s).empty());
  ch.begin_forward(s);  // still disabled: a no-op forward
  EXPECT_NO_THROW(ch.capture(fd::hook_id{1}, src.at(5), size, s));
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_TRUE(wait_until<B>([&] { return chk.received() == 3; }, 5s)) << "the entries launched before the error";
  EXPECT_EQ(ch.stats().entries_reserved, 3U) << "nothing reserved while disabled";
  EXPECT_EQ(ch.stats().capture_errors, 1U);
  ch.recover();
  EXPECT_FALSE(ch.capture_disabled());
  ch.begin_forward(s);
  for (std::uint64_t j = 6; j < 8; ++j) {
    chk.expect(3 + (j - 6), 1, size);
    ch.capture(fd::hook_id{1}, src.at(j - 3), size, s);  // seq 3, 4 carry pattern(3), pattern(4)
  }
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_TRUE(wait_until<B>([&] { return chk.received() == 5; }, 5s));
  this->expect_close_reports(ch, 1, "expected an entry of > 0 bytes");
  EXPECT_EQ(chk.got, 5U);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
  EXPECT_FALSE(ch.invalidated()) << ch.invalidation_reason();
}

/// A consumer callback that throws (a failing sink) disables capture; the producer's next calls are no-ops;
/// recover() re-enables it.
TYPED_TEST_P(D2hOnError, ThrowingConsumerDisablesCapture)
{
  using B = TypeParam;
  constexpr std::uint64_t size = 128;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s.view(), 0, 4, size};
  std::atomic<int> seen{0};
  fd::channel<B> ch{this->disable_config(), this->b, [&](fd::entry_view&& v) {
                      seen.fetch_add(1);
                      if (v.seq().value == 0) { throw std::runtime_error("sink full"); }
                    }};
  ch.begin_forward(s);
  ch.capture(fd::hook_id{2}, src.at(0), size, s);
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_TRUE(wait_until<B>([&] { return ch.capture_disabled(); }, 5s));
  EXPECT_NE(ch.capture_error().find("sink full"), std::string::npos) << ch.capture_error();
  ch.begin_forward(s);
  ch.capture(fd::hook_id{2}, src.at(1), size, s);  // a no-op
  (void)ch.end_forward(s);
  EXPECT_EQ(ch.stats().entries_reserved, 1U);
  ch.recover();
  ch.begin_forward(s);
  ch.capture(fd::hook_id{2}, src.at(2), size, s);
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_TRUE(wait_until<B>([&] { return seen.load() == 2; }, 5s));
  try {
    (void)ch.close(10s);
    ADD_FAILURE() << "close() must report the callback exception and the capture error";
  } catch (const fd::shutdown_error& e) {
    EXPECT_EQ(e.report().callback_errors, 1U);
    EXPECT_EQ(e.report().capture_errors, 1U);
  }
}

/// Graph replays keep running while capture is disabled: each holds a quiet token, so its kernels write and
/// publish nothing and nothing is reported as unplanned; after recover() the same graph's replays deliver.
TYPED_TEST_P(D2hOnError, GraphReplaysWhileDisabledWriteNothing)
{
  using B = TypeParam;
  constexpr std::uint64_t n = 3, size = 256;
  fb::stream<B> s{this->b};
  replay_sources<B> src{this->b, n, size, 8};
  checker chk;
  fd::channel<B> ch{this->disable_config(), this->b, chk.callback()};
  fd::forward_plan plan;
  auto g = src.capture_forward(ch, s.view(), plan);
  std::uint64_t seq = 0;
  auto replay = [&](bool expect_delivery) {
    src.load(seq / n, s.view());  // forward seq / n of the table holds pattern(seq .. seq + n - 1)
    if (expect_delivery) {
      for (std::uint64_t j = 0; j < n; ++j) { chk.expect(seq + j, static_cast<std::uint32_t>(j), size); }
    }
    ch.replay(g, plan, s);
    if (expect_delivery) { seq += n; }
  };
  replay(true);
  ch.begin_forward(s);
  ch.capture(fd::hook_id{9}, src.at(0), 0, s);  // the misuse: capture disabled
  (void)ch.end_forward(s);
  ASSERT_TRUE(ch.capture_disabled());
  for (int r = 0; r < 3; ++r) { EXPECT_NO_THROW(replay(false)); }  // the engine keeps serving
  s.synchronize();
  ch.recover();
  replay(true);
  replay(true);
  s.synchronize();
  EXPECT_TRUE(wait_until<B>([&] { return chk.received() == 3 * n; }, 5s));
  EXPECT_FALSE(ch.invalidated()) << "a quiet replay is not an unplanned launch: " << ch.invalidation_reason();
  this->expect_close_reports(ch, 1, "expected an entry of > 0 bytes");
  EXPECT_EQ(chk.got, 3 * n);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

REGISTER_TYPED_TEST_SUITE_P(D2hOnError, RaiseIsTheDefault, MisuseDisablesCaptureUntilRecover,
                            ThrowingConsumerDisablesCapture, GraphReplaysWhileDisabledWriteNothing);

}  // namespace ferry::test
