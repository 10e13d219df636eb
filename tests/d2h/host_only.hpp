// SPDX-License-Identifier: Apache-2.0
// Host-only D2H tests: a user kernel writing through ring_ref, placement validation with a backend
// that lacks concurrentManagedAccess, poller-thread misuse.
#pragma once

#include "d2h/fixture.hpp"

namespace ferry::test {

namespace {

/// A backend like the host backend, except that it reports concurrentManagedAccess == 0.
struct no_cma_backend : fb::host_backend {
  [[nodiscard]] fb::device_attributes attributes(fb::device_id d) const
  {
    auto a = fb::host_backend::attributes(d);
    a.concurrent_managed_access = false;
    return a;
  }
};
static_assert(fb::backend<no_cma_backend>);

/// A user kernel: writes pattern(seq) through the ring view (every "thread"), then one thread commits.
void user_fill(const fb::host_detail::launch_ctx& ctx, fd::ring_ref ref, std::uint64_t seq, std::uint64_t bytes,
               std::uint64_t actual)
{
  auto* dst = reinterpret_cast<std::uint8_t*>(ref.data());
  const std::uint64_t n = std::min(bytes, ref.capacity());
  for (std::uint32_t t = 0; t < ctx.block_dim.x; ++t) {
    for (std::uint64_t i = t; i < n; i += ctx.block_dim.x) { dst[i] = ferry::testing::pattern_byte(seq, i); }
  }
  if (ref.dynamic != 0) {
    ref.commit(actual);
  } else {
    ref.commit();
  }
}
const fb::host_kernel<fd::ring_ref, std::uint64_t, std::uint64_t, std::uint64_t> user_fill_kernel{&user_fill,
                                                                                                   "user_fill"};

}  // namespace

TEST(D2hHostOnly, ManagedPlacementNeedsConcurrentManagedAccess)
{
  fd::config cfg;
  cfg.ring_bytes = 1 << 16;
  cfg.tuning.head_memory = fd::head_memory::managed;
  try {
    fd::channel<no_cma_backend> ch{cfg};
    ADD_FAILURE() << "expected a logic_error";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("concurrentManagedAccess"), std::string::npos) << e.what();
  }
  cfg.tuning.head_memory = fd::head_memory::pinned_mapped;
  fd::channel<no_cma_backend> ok{cfg};
  EXPECT_TRUE(ok.close().clean());
  // The defaults: the platform picks pinned_mapped here (published_head and the size ring), and the size ring
  // is derived, so a dynamic entry needs no knob.
  cfg.tuning = {};
  no_cma_backend b{};
  fb::stream<no_cma_backend> s{b};
  sources<no_cma_backend> src{b, s, 0, 1, 512};
  fb::device_buffer<no_cma_backend> actual{8, b};
  *actual.template as<std::uint64_t>() = 300;
  checker chk;
  fd::channel<no_cma_backend> chosen{cfg, b, chk.callback()};
  chosen.begin_forward(s);
  chk.expect(0, 4, 300);
  chosen.capture_dynamic(fd::hook_id{4}, src.at(0), 512, actual.template as<const std::uint64_t>(), s);
  (void)chosen.end_forward(s);
  EXPECT_TRUE(chosen.close().clean());
  EXPECT_EQ(chk.got, 1U);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

TEST(D2hHostOnly, UserKernelWritesThroughRingRef)
{
  using B = fb::host_backend;
  B b{};
  fb::host_backend::set_jitter(30us);
  fb::stream<B> s{b};
  checker chk;
  fd::config cfg;
  cfg.ring_bytes = 6 << 10;
  cfg.publish_every = 3;
  cfg.tuning.size_slots = 2;
  {
    fd::channel<B> ch{cfg, b, chk.callback()};
    sources<B> src{b, s, 0, 64, 1000};
    std::uint64_t seq = 0;
    for (int f = 0; f < 8; ++f) {
      ch.begin_forward(s);
      for (int j = 0; j < 6; ++j, ++seq) {
        if (j % 3 == 0) {  // library copy
          chk.expect(seq, 1, 1000);
          ch.capture(fd::hook_id{1}, src.at(seq), 1000, s);
        } else if (j % 3 == 1) {  // user kernel, static size
          chk.expect(seq, 2, 700);
          auto t = ch.begin_write(fd::hook_id{2}, 700, s);
          b.launch(user_fill_kernel, fb::launch_config{{1}, {64}, 0}, s.handle(), t.ref(), seq, std::uint64_t{700},
                   std::uint64_t{0});
          ch.end_write(std::move(t), s);
        } else {  // user kernel, dynamic size resolved "on the GPU"
          const std::uint64_t actual = 100 + 37 * seq % 900;
          chk.expect(seq, 3, actual);
          auto t = ch.begin_write(fd::hook_id{3}, 1024, s, /*dynamic=*/true);
          b.launch(user_fill_kernel, fb::launch_config{{1}, {64}, 0}, s.handle(), t.ref(), seq, actual, actual);
          ch.end_write(std::move(t), s);
        }
      }
      (void)ch.end_forward(s);
    }
    EXPECT_TRUE(ch.close().clean());
  }
  fb::host_backend::set_jitter(0us);
  EXPECT_EQ(chk.got, 48U);
  EXPECT_EQ(chk.bad_entries, 0U);
  EXPECT_EQ(chk.bad_meta, 0U);
}

TEST(D2hHostOnly, PollFromASecondThreadIsMisuse)
{
  using B = fb::host_backend;
  fd::config cfg;
  cfg.ring_bytes = 1 << 16;
  cfg.drain = fd::drain_mode::poll;
  fd::channel<B> ch{cfg};
  (void)ch.poll();
  std::thread other([&] { EXPECT_THROW(ch.poll(), ferry::logic_error); });
  other.join();
  EXPECT_TRUE(ch.close().clean());
}

TEST(D2hHostOnly, PlacementRuleNeverStraddles)
{
  constexpr std::uint64_t R = 1024;
  std::mt19937_64 rng{7};
  std::uint64_t pos = 0;
  for (int i = 0; i < 10000; ++i) {
    const std::uint64_t n = fd::align_up(1 + rng() % R, 16);
    const auto p = fd::place(pos, n, R);
    ASSERT_GE(p.start, pos);
    ASSERT_LE(p.start % R + n, R) << "entry straddles the wrap";
    ASSERT_LT(p.start - pos, n) << "padding larger than the entry";
    pos = p.end;
  }
}

// Regression (found by the D2H fuzzer): with the ring and staging empty at a position P, an entry larger
// than P but no larger than the ring must still be placed at the wrap. The old rule counted the skipped
// padding as used space, so such an entry could never fit (fail-fast rejected it forever; a blocking
// producer timed out).
TEST(D2hHostOnly, EntryLargerThanTheReclaimedPrefixFitsAnEmptyRing)
{
  using B = fb::host_backend;
  fb::stream<B> s;
  fb::device_buffer<B> src{8192};
  fd::config cfg;
  cfg.ring_bytes = 8192;     // staging defaults to the ring size
  cfg.publish_every = 1;
  cfg.on_full = fd::full_policy::fail_fast;
  std::atomic<std::uint64_t> got{0};
  fd::channel<B> ch{cfg, B{}, [&](fd::entry_view&& e) { got += e.size(); }};
  for (std::uint64_t bytes : {3000ULL, 6000ULL, 7000ULL, 8192ULL, 100ULL, 8000ULL}) {
    const std::uint64_t want = got.load() + bytes;  // before the capture: the drain may deliver at once
    ch.begin_forward(s);
    ch.capture(fd::hook_id{1}, src.data(), bytes, s);  // fail_fast: throws if it does not fit
    (void)ch.end_forward(s);
    ASSERT_TRUE(wait_until<B>([&] { return got.load() == want; })) << bytes << " bytes never delivered";
  }
  EXPECT_TRUE(ch.close().clean());
}

// With branch releases (the default) a captured forward forks the capture at its first batch release; a
// capture that ends without end_forward leaves that branch unjoined, and the capture fails with the
// backend's typed error (CUDA: cudaErrorStreamCaptureUnjoined) instead of yielding a graph whose batch
// releases are never joined and whose last entries are never published. The channel reports the open
// forward at close; its release stream has left the failed capture.
TEST(D2hHostOnly, CaptureEndingWithoutEndForwardFails)
{
  using B = fb::host_backend;
  fb::stream<B> s;
  fb::device_buffer<B> src{4096};
  fd::config cfg;
  cfg.ring_bytes = 1 << 20;
  cfg.publish_every = 2;
  ASSERT_TRUE(cfg.tuning.branch_publish);
  fd::channel<B> ch{cfg, B{}, [](fd::entry_view&&) {}};
  auto forget_end = [&] {
    (void)fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      ch.begin_forward(cs);
      for (std::uint32_t h = 0; h < 4; ++h) { ch.capture(fd::hook_id{h}, src.data(), 1024, cs); }
    });
  };
  EXPECT_THROW(forget_end(), ferry::backend_error);
  EXPECT_FALSE(B{}.stream_is_capturing(s.handle()));
  try {
    (void)ch.close();
    ADD_FAILURE() << "close() must report the forward left open";
  } catch (const fd::shutdown_error& e) {
    EXPECT_TRUE(e.report().forward_open);
    EXPECT_TRUE(e.report().unpublished.empty()) << "a captured forward reserves nothing until plan()";
  }
}

}  // namespace ferry::test
