// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hOrdering, over backends (host and faulty<host> in CI, cuda on the H200).
// Ordering: each test guards one step of the publication chain (docs/design/d2h.md); the mutant halves
// (ferry::testing::d2h_access) remove that step and must be caught.
#pragma once

#include "d2h/fixture.hpp"

namespace ferry::test {

template <class B>
class D2hOrdering : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hOrdering);

TYPED_TEST_P(D2hOrdering, PublishesOncePerKAndCoalescesCopies)
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

TYPED_TEST_P(D2hOrdering, DrainNeverCopiesBeforeAcquire)
{
  using B = TypeParam;
  for (auto fault : with_mutant(d2h_fault::drain_without_acquire)) {
    fb::stream<B> s{this->b};
    sources<B> src{this->b, s, 0, 8, 4096};
    gate<B> g{this->b};
    checker chk;
    auto cfg = this->small_config(1 << 20, 2);
    {
      fd::channel<B> ch{cfg, this->b, chk.callback()};
      d2h_access::set_fault(ch, fault);
      g.close_on(this->b, s);
      ch.begin_forward(s);
      for (std::uint64_t i = 0; i < 8; ++i) {
        chk.expect(i, 1, 4096);
        ch.capture(fd::hook_id{1}, src.at(i), 4096, s);
      }
      (void)ch.end_forward(s);
      std::this_thread::sleep_for(30ms);
      if (fault == d2h_fault::none) {
        EXPECT_EQ(ch.stats().copies, 0U) << "a D2H was enqueued before published_head covered it";
        EXPECT_EQ(ch.stats().entries_published, 0U);
      }
      g.open();
      EXPECT_TRUE(ch.close().clean());
    }
    if (fault == d2h_fault::none) {
      EXPECT_EQ(chk.got, 8U);
      EXPECT_EQ(chk.bad_entries, 0U);
    } else {
      EXPECT_GT(chk.bad_entries, 0U) << "the guard test must detect a drain that copies before the acquire";
    }
  }
}

TYPED_TEST_P(D2hOrdering, RingSpaceNotReusedBeforeCopyCompletes)
{
  using B = TypeParam;
  std::vector<d2h_fault> faults{d2h_fault::none};
  if constexpr (is_host_v<B>) {
    if (!under_tsan) { faults.push_back(d2h_fault::reclaim_before_copy_complete); }  // support/sanitizer.hpp
  }
  for (auto fault : faults) {
    fb::stream<B> s{this->b};
    constexpr std::uint64_t n = 96;
    sources<B> src{this->b, s, 0, n, 1024};
    checker chk;
    auto cfg = this->small_config(4096, 1);
    {
      fd::channel<B> ch{cfg, this->b, chk.callback()};
      d2h_access::set_hooks(ch, fault, 2ms);
      ch.begin_forward(s);
      for (std::uint64_t i = 0; i < n; ++i) {
        chk.expect(i, 2, 1024);
        ch.capture(fd::hook_id{2}, src.at(i), 1024, s);
      }
      (void)ch.end_forward(s);
      EXPECT_TRUE(ch.close().clean());
      // The host backend delays every drain copy (d2h_access::set_hooks), so the 4 KiB ring must fill; on a GPU the
      // delay hook does not exist and whether the ring fills depends on timing (under compute-sanitizer
      // memcheck the drain keeps up), so only the data checks below are required there.
      if constexpr (is_host_v<B>) {
        if (fault == d2h_fault::none) { EXPECT_GT(ch.stats().stalls, 0U) << "the ring never filled up"; }
      }
    }
    EXPECT_EQ(chk.got, n);
    if (fault == d2h_fault::none) {
      EXPECT_EQ(chk.bad_entries, 0U);
    } else {
      EXPECT_GT(chk.bad_entries, 0U) << "the guard test must detect reuse before the copy completed";
    }
  }
}

TYPED_TEST_P(D2hOrdering, ProgrammaticLaunchJoinsLikeStreamOrder)
{
  using B = TypeParam;
  for (auto fault : with_mutant(d2h_fault::programmatic_without_wait)) {
    fb::stream<B> s{this->b};
    constexpr std::uint64_t n = 256, stride = 1024;
    late_sources<B> src{this->b, s, n, stride};
    checker chk;
    auto cfg = this->small_config(1 << 20, 16);
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    d2h_access::set_fault(ch, fault);
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

TYPED_TEST_P(D2hOrdering, BranchPublishWaitsForTheFork)
{
  this->expect_branch_release_waits(4, 9, false, "a branch release that does not wait for the batch's copies");
}

REGISTER_TYPED_TEST_SUITE_P(D2hOrdering, PublishesOncePerKAndCoalescesCopies, DrainNeverCopiesBeforeAcquire, RingSpaceNotReusedBeforeCopyCompletes, ProgrammaticLaunchJoinsLikeStreamOrder, BranchPublishWaitsForTheFork);

}  // namespace ferry::test
