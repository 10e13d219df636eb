// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hFailure, over backends (host and faulty<host> in CI, cuda on the H200).
// Failure: misuse is a typed error and loses nothing already published.
#pragma once

#include "d2h/fixture.hpp"

#include <ferry/testing/ring_writer.hpp>

#include <optional>
#include <string>

namespace ferry::test {

template <class B>
class D2hFailure : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hFailure);

TYPED_TEST_P(D2hFailure, MisuseIsATypedErrorAndLosesNothing)
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
  cfg.tuning.size_slots = 0;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  {
    fd::channel<B> second{cfg, this->b};  // any number of channels per device: no refusal, no interference
    EXPECT_TRUE(second.close().clean());
  }
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

/// A producer call on a stream other than the forward's (begin_forward's) is refused with a logic_error
/// naming both streams; the forward stays usable on its own stream and every entry arrives.
TYPED_TEST_P(D2hFailure, SecondStreamInsideAForwardIsRefused)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  fb::stream<B> other{this->b};
  sources<B> src{this->b, s, 0, 2, 256};
  checker chk;
  auto cfg = this->small_config(1 << 16, 2);
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  ch.begin_forward(s);
  chk.expect(0, 1, 256);
  ch.capture(fd::hook_id{1}, src.at(0), 256, s);
  try {
    ch.capture(fd::hook_id{1}, src.at(1), 256, other);
    ADD_FAILURE() << "capture on a second stream was accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("expected the forward's stream"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)ch.begin_write(fd::hook_id{1}, 64, other), ferry::logic_error) << "begin_write, second stream";
  EXPECT_THROW((void)ch.end_forward(other), ferry::logic_error) << "end_forward on a second stream";
  chk.expect(1, 1, 256);
  ch.capture(fd::hook_id{1}, src.at(1), 256, s);
  (void)ch.end_forward(s);
  // Between forwards any stream may open the next one.
  ch.begin_forward(other);
  (void)ch.end_forward(other);
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 2U);
  EXPECT_EQ(chk.bad_entries, 0U);
  EXPECT_EQ(chk.bad_meta, 0U);
}


/// A forward (eager, or a replay) on a stream other than the last executed forward's joins that stream
/// first: the last forward's publish and cursor normalization are ordered before the new forward's writers.
/// The first stream is held by a gate, so without the join (mutant new_stream_without_join) the next
/// forward runs first, places its entries from the stale cursor and publishes them as the first forward's.
TYPED_TEST_P(D2hFailure, ForwardOnANewStreamJoinsTheLastOne)
{
  using B = TypeParam;
  for (const auto fault : with_mutant(d2h_fault::new_stream_without_join)) {
    fb::stream<B> s1{this->b};
    fb::stream<B> s2{this->b};
    fb::stream<B> s3{this->b};
    constexpr std::uint64_t per = 3, n = 4 * per;  // odd forwards: every boundary normalizes the cursor
    sources<B> src{this->b, s1, 0, n, 256};
    checker chk;
    auto cfg = this->small_config(1 << 16, 16);  // only the forward boundaries release
    cfg.timeout = 2s;
    std::optional<fd::channel<B>> ch{std::in_place, cfg, this->b, chk.callback()};
    d2h_access::set_fault(*ch, fault);
    const auto forward = [&](fb::stream_view<B> s, std::uint64_t first) {
      ch->begin_forward(s);
      for (std::uint64_t j = first; j < first + per; ++j) { ch->capture(fd::hook_id{1}, src.at(j), 256, s); }
      return ch->end_forward(s);
    };
    fd::forward_plan plan;
    auto g = fb::graph_exec<B>::capture(s3.view(), [&](fb::stream_view<B> cs) { plan = forward(cs, per); });
    for (std::uint64_t j = 0; j < n; ++j) { chk.expect(j, 1, 256); }
    gate<B> hold{this->b};
    hold.close_on(this->b, s1.view());
    (void)forward(s1.view(), 0);       // held by the gate
    ch->replay(g, plan, s2.view());    // a replay on a new stream
    (void)forward(s3.view(), 2 * per);  // an eager forward on a third stream
    (void)forward(s1.view(), 3 * per);  // and back to the first
    std::this_thread::sleep_for(20ms);  // an unjoined stream runs ahead meanwhile
    hold.open();
    try {
      (void)ch->close();
    } catch (const std::exception& e) {
      if (fault == d2h_fault::none) { ADD_FAILURE() << e.what(); }
    }
    ch.reset();
    expect_join_verdict(chk, fault, n, "the join of a forward on a new stream");
    s1.synchronize();
    s2.synchronize();
    s3.synchronize();
  }
}

/// A user kernel that never calls ring_ref::commit(): the commit check after its writer (end_write) commits
/// in its place, so the next entries are placed right instead of overwriting it, and reports it: the
/// channel is invalidated naming the hook, and close() says so too. Every other entry arrives exact; a
/// dynamic entry without commit is delivered as size_overflow. The writer is ferry::testing's ring_writer
/// kernel (host, CUDA); skipped where the check is compiled out (a GPU TU with NDEBUG and without
/// FERRY_D2H_CHECK_COMMIT=1: tests/d2h/CMakeLists.txt defines it for d2h_cuda).
TYPED_TEST_P(D2hFailure, MissingCommitIsDetectedAndRepaired)
{
  using B = TypeParam;
  if constexpr (!d2h_access::commit_check_enabled<B>) {
    GTEST_SKIP() << "the commit check is compiled out (NDEBUG without FERRY_D2H_CHECK_COMMIT=1)";
  } else {
    fb::stream<B> s{this->b};
    sources<B> src{this->b, s, 0, 8, 256};
    checker chk;
    auto cfg = this->small_config(1 << 16, 2);
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    const fb::launch_config one{{1}, {32}, 0};
    const auto writer = ferry::testing::ring_writer_kernel(typename B::tag{});
    ch.begin_forward(s);
    chk.expect(0, 1, 256);
    ch.capture(fd::hook_id{1}, src.at(0), 256, s);
    chk.expect(1, 7, 256);
    auto t = ch.begin_write(fd::hook_id{7}, 256, s);
    this->b.launch(writer, one, s.handle(), t.ref(), std::uint64_t{1}, std::uint64_t{256},
                   std::uint64_t{0});
    ch.end_write(std::move(t), s);
    // The check kernel reports through a pinned flag the CPU reads at every producer call: any call after
    // the writer's end_write may see it (under a serializing tool such as compute-sanitizer, the very next
    // one does), at the latest the begin_forward after the synchronize. Entries captured before the
    // detection are delivered; nothing is delivered wrong.
    std::string what;
    try {
      chk.expect(2, 1, 256);
      ch.capture(fd::hook_id{1}, src.at(2), 256, s);
      (void)ch.end_forward(s);
      ch.begin_forward(s);
      chk.expect(3, 8, ~std::uint64_t{0}, /*overflow=*/true);
      auto d = ch.begin_write(fd::hook_id{8}, 256, s, /*dynamic=*/true);
      this->b.launch(writer, one, s.handle(), d.ref(), std::uint64_t{3}, std::uint64_t{200},
                     std::uint64_t{0});
      ch.end_write(std::move(d), s);
      chk.expect(4, 1, 256);
      ch.capture(fd::hook_id{1}, src.at(4), 256, s);
      (void)ch.end_forward(s);
      s.synchronize();
      ch.begin_forward(s);
      ADD_FAILURE() << "a missing commit was not reported";
    } catch (const ferry::invalidated_error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("hook 7 (entry 1 of its forward"), std::string::npos) << what;
    EXPECT_NE(what.find("ring_ref::commit()"), std::string::npos) << what;
    EXPECT_TRUE(ch.invalidated());
    const std::uint64_t reserved = ch.stats().entries_reserved;
    EXPECT_GE(reserved, 2U) << "the entries up to the writer's were accepted before the check could report";
    EXPECT_THROW((void)ch.close(), ferry::invalidated_error);
    EXPECT_EQ(chk.got, reserved) << "every accepted entry is delivered";
    EXPECT_EQ(chk.bad_entries, 0U) << "no entry overwrote another";
    EXPECT_EQ(chk.bad_meta, 0U);
    EXPECT_EQ(chk.overflows, reserved >= 4 ? 1U : 0U) << "the dynamic entry without a commit is an overflow";
  }
}

/// The commit check's report seen by a later call than the capture after the faulty writer (the stream was
/// held, so the check kernel ran only after that capture was accepted): that call is refused and changes
/// nothing, and close() publishes the open forward's launched entries (placed right), so every accepted entry
/// is delivered. (The race the test above meets by chance, made certain by a gate.)
TYPED_TEST_P(D2hFailure, MissingCommitSeenDelayedStillDeliversAcceptedEntries)
{
  using B = TypeParam;
  if constexpr (!d2h_access::commit_check_enabled<B>) {
    GTEST_SKIP() << "the commit check is compiled out (NDEBUG without FERRY_D2H_CHECK_COMMIT=1)";
  } else {
    fb::stream<B> s{this->b};
    sources<B> src{this->b, s, 0, 8, 256};
    s.synchronize();
    checker chk;
    auto cfg = this->small_config(1 << 16, 16);  // only the forward boundary releases
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    const fb::launch_config one{{1}, {32}, 0};
    const auto writer = ferry::testing::ring_writer_kernel(typename B::tag{});
    // Load the writer's module before the gate holds the stream: under lazy module loading its first launch
    // would wait for the spinning gate kernel, which waits for this thread (a deadlock; ferry preloads its own
    // kernels, the commit check included, when the channel is constructed: producer's constructor).
    (void)this->b.preload(writer);
    gate<B> hold{this->b};
    hold.close_on(this->b, s.view());
    ch.begin_forward(s);
    chk.expect(0, 1, 256);
    ch.capture(fd::hook_id{1}, src.at(0), 256, s);
    chk.expect(1, 7, 256);
    auto t = ch.begin_write(fd::hook_id{7}, 256, s);
    this->b.launch(writer, one, s.handle(), t.ref(), std::uint64_t{1}, std::uint64_t{256}, std::uint64_t{0});
    ch.end_write(std::move(t), s);
    chk.expect(2, 1, 256);
    ch.capture(fd::hook_id{1}, src.at(2), 256, s);  // accepted: the stream is held, the check has not run
    hold.open();
    s.synchronize();  // the check kernel has run and reported
    std::string what;
    try {
      (void)ch.end_forward(s);
      ADD_FAILURE() << "a missing commit was not reported";
    } catch (const ferry::invalidated_error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("hook 7 (entry 1 of its forward"), std::string::npos) << what;
    EXPECT_THROW((void)ch.close(), ferry::invalidated_error);
    EXPECT_EQ(ch.stats().entries_reserved, 3U);
    EXPECT_EQ(chk.got, 3U) << "every accepted entry is delivered";
    EXPECT_EQ(chk.bad_entries, 0U);
    EXPECT_EQ(chk.bad_meta, 0U);
  }
}

/// The commit check stays quiet for writers that commit, and close() alone reports a missing commit.
TYPED_TEST_P(D2hFailure, MissingCommitIsReportedByClose)
{
  using B = TypeParam;
  if constexpr (!d2h_access::commit_check_enabled<B>) {
    GTEST_SKIP() << "the commit check is compiled out (NDEBUG without FERRY_D2H_CHECK_COMMIT=1)";
  } else {
    fb::stream<B> s{this->b};
    checker chk;
    auto cfg = this->small_config(1 << 16, 16);
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    const fb::launch_config one{{1}, {32}, 0};
    const auto writer = ferry::testing::ring_writer_kernel(typename B::tag{});
    for (std::uint64_t seq = 0; seq < 3; ++seq) {
      ch.begin_forward(s);
      chk.expect(seq, 5, 128);
      auto t = ch.begin_write(fd::hook_id{5}, 128, s);
      this->b.launch(writer, one, s.handle(), t.ref(), seq, std::uint64_t{128},
                     std::uint64_t{seq != 2 ? 1U : 0U});
      ch.end_write(std::move(t), s);
      (void)ch.end_forward(s);
    }
    try {
      (void)ch.close();
      ADD_FAILURE() << "close() did not report the missing commit";
    } catch (const ferry::invalidated_error& e) {
      EXPECT_NE(std::string{e.what()}.find("hook 5 (entry 0 of its forward"), std::string::npos) << e.what();
    }
    EXPECT_EQ(chk.got, 3U);
    EXPECT_EQ(chk.bad_entries, 0U);
    EXPECT_EQ(chk.bad_meta, 0U);
  }
}

REGISTER_TYPED_TEST_SUITE_P(D2hFailure, MisuseIsATypedErrorAndLosesNothing, SecondStreamInsideAForwardIsRefused,
                            ForwardOnANewStreamJoinsTheLastOne, MissingCommitIsDetectedAndRepaired,
                            MissingCommitSeenDelayedStillDeliversAcceptedEntries, MissingCommitIsReportedByClose);

}  // namespace ferry::test
