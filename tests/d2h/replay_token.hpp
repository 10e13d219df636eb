// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hReplayToken, over backends (host and faulty<host> in CI, cuda on the H200): a
// captured forward launched without plan() (graph.launch instead of channel::replay) among planned replays.
// Its claim kernel (kernels/d2h/replay) finds no token, so it writes and publishes nothing; every planned
// replay's bytes arrive, in order; the channel is invalidated naming the launch. docs/design/d2h.md, "the
// replay token".
#pragma once

#include "d2h/fixture.hpp"

#include <string>
#include <vector>

namespace ferry::test {

template <class B>
class D2hReplayToken : public d2h_fixture<B> {
 protected:
  struct outcome {
    std::uint64_t got{0}, bad{0}, drained{0};
    bool invalidated{false}, close_threw_invalidated{false};
    std::string reason, first_bad;
  };

  /// `launches` graph launches of one captured forward of `n` entries (`deferred`: capture_deferred, one
  /// gather), launch `unplanned_at` by graph.launch (no plan), the others by channel::replay. The stream is
  /// held by a gate until every launch is enqueued, so the CPU is ahead of the device by all of them (a token
  /// counted by the CPU would be taken by the wrong launch). Launch k reads its own payload: planned launch p
  /// copies pattern(p * n + j) for entry j, the unplanned one pattern(1000 + j), which must never arrive.
  outcome run(std::uint64_t n, bool deferred, std::size_t launches, std::size_t unplanned_at, d2h_fault fault)
  {
    constexpr std::uint64_t size = 512;
    fb::stream<B> s{this->b};
    replay_sources<B> src{this->b, n, size, launches};
    std::uint64_t planned = 0;
    for (std::size_t k = 0; k < launches; ++k) {
      for (std::uint64_t j = 0; j < n; ++j) { src.payload(k * n + j, k == unplanned_at ? 1000 + j : planned * n + j); }
      if (k != unplanned_at) { ++planned; }
    }
    checker chk;
    fd::channel<B> ch{this->small_config(1 << 16, 2), this->b, chk.callback()};
    d2h_access::set_fault(ch, fault);
    fd::forward_plan plan;
    auto g = src.capture_forward(ch, s.view(), plan, deferred);
    for (std::uint64_t e = 0; e < planned * n; ++e) { chk.expect(e, static_cast<std::uint32_t>(e % n), size); }
    gate<B> held{this->b};
    held.close_on(this->b, s.view());
    for (std::size_t k = 0; k < launches; ++k) {
      src.load(k, s.view());
      if (k == unplanned_at) {
        g.launch(s.view());  // the misuse: no plan()
      } else {
        ch.replay(g, plan, s.view());
      }
    }
    held.open();
    s.synchronize();
    outcome o;
    o.invalidated = wait_until<B>([&] { return ch.invalidated(); }, 5s);
    o.reason = ch.invalidation_reason();
    try {
      (void)ch.close(10s);
    } catch (const ferry::invalidated_error&) {
      o.close_threw_invalidated = true;
    } catch (const std::exception& e) {
      o.reason += std::string{" | close: "} + e.what();
    }
    o.got = chk.got;
    o.bad = chk.bad();
    o.first_bad = chk.first_bad;
    o.drained = ch.stats().entries_drained;
    return o;
  }
};
TYPED_TEST_SUITE_P(D2hReplayToken);

/// The unplanned launch first, in the middle and last; immediate capture with an even and an odd number of
/// entries (the boundary restores the cursor from slot 0 or slot 1) and deferred capture (the gather's
/// boundary release restores it). Every planned entry arrives exact and nothing else; the channel is
/// invalidated naming the launch (1-based over the channel's graph launches); close() throws invalidated_error.
TYPED_TEST_P(D2hReplayToken, UnplannedLaunchWritesNothingAndIsReported)
{
  constexpr std::size_t launches = 5;
  for (const auto& [n, deferred] : {std::pair{2ULL, false}, std::pair{3ULL, false}, std::pair{3ULL, true}}) {
    for (const std::size_t at : {std::size_t{0}, std::size_t{2}, launches - 1}) {
      SCOPED_TRACE(::testing::Message() << "entries " << n << (deferred ? " deferred" : " immediate") << ", unplanned launch "
                                      << at + 1 << " of " << launches);
      const auto o = this->run(n, deferred, launches, at, d2h_fault::none);
      EXPECT_EQ(o.got, (launches - 1) * n) << "every planned entry, nothing of the unplanned launch";
      EXPECT_EQ(o.bad, 0U) << o.first_bad;
      EXPECT_EQ(o.drained, (launches - 1) * n);
      EXPECT_TRUE(o.invalidated) << "the unplanned launch is reported";
      EXPECT_NE(o.reason.find("graph replayed without plan(): launch " + std::to_string(at + 1) + " "), std::string::npos)
        << o.reason;
      EXPECT_TRUE(o.close_threw_invalidated) << o.reason;
    }
  }
}

/// The mutant without the claim kernel (debug_fault::capture_without_claim): an unplanned launch first or in
/// the middle writes into the ring where the next planned forward's entries were placed, so wrong bytes
/// arrive as good ones; the test above must catch it.
TYPED_TEST_P(D2hReplayToken, WithoutTheClaimAnUnplannedLaunchCorruptsPlannedEntries)
{
  for (const std::size_t at : {std::size_t{0}, std::size_t{2}}) {
    SCOPED_TRACE(::testing::Message() << "unplanned launch " << at + 1);
    const auto o = this->run(3, false, 5, at, d2h_fault::capture_without_claim);
    EXPECT_GT(o.bad, 0U) << "without the token the unplanned launch's bytes land in planned entries";
  }
}

/// plan(p, s) arms the replay on the stream it is launched on: after an eager forward on a first stream,
/// plans and launches on a second stream are all planned (no launch skipped), and every entry arrives.
TYPED_TEST_P(D2hReplayToken, PlanOnTheLaunchStreamArmsThatStream)
{
  using B = TypeParam;
  constexpr std::uint64_t n = 2, size = 256, replays = 3;
  fb::stream<B> s1{this->b}, s2{this->b};
  sources<B> eager{this->b, s1.view(), 0, n, size};
  replay_sources<B> src{this->b, n, size, replays + 1};
  checker chk;
  fd::channel<B> ch{this->small_config(1 << 16, 4), this->b, chk.callback()};
  ch.begin_forward(s1);
  for (std::uint64_t j = 0; j < n; ++j) {
    chk.expect(j, static_cast<std::uint32_t>(j), size);
    ch.capture(fd::hook_id{static_cast<std::uint32_t>(j)}, eager.at(j), size, s1);
  }
  (void)ch.end_forward(s1);
  fd::forward_plan plan;
  auto g = src.capture_forward(ch, s2.view(), plan);
  for (std::uint64_t r = 1; r <= replays; ++r) {
    for (std::uint64_t j = 0; j < n; ++j) { chk.expect(r * n + j, static_cast<std::uint32_t>(j), size); }
    src.load(r, s2.view());
    ch.plan(plan, s2.view());
    g.launch(s2.view());
  }
  s2.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  EXPECT_EQ(chk.got, (replays + 1) * n);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
  EXPECT_FALSE(ch.invalidated()) << ch.invalidation_reason();
}

REGISTER_TYPED_TEST_SUITE_P(D2hReplayToken, UnplannedLaunchWritesNothingAndIsReported,
                            WithoutTheClaimAnUnplannedLaunchCorruptsPlannedEntries, PlanOnTheLaunchStreamArmsThatStream);

}  // namespace ferry::test
