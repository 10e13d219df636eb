// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hGather, over backends (host and faulty<host> in CI, cuda on the H200).
// Deferred capture and the gather kernel: capture_deferred records on the CPU, one gather launch per
// flushed batch places, copies and (every K) publishes. Every payload byte is sequence-derived.
#pragma once

#include "d2h/fixture.hpp"

#include <ferry/backend/faulty.hpp>
#include <ferry/d2h/detail/gather.hpp>

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferry::test {

template <class B>
class D2hGather : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hGather);

namespace gather_test {
template <class B>
struct as_faulty {
  using type = fb::faulty<B>;
};
template <class X>
struct as_faulty<fb::faulty<X>> {
  using type = fb::faulty<X>;
};
/// A user writer on the host backend (begin_write / ring_ref): pattern(seq) into the entry, then commit.
inline void user_write(const fb::host_detail::launch_ctx&, fd::ring_ref ref, std::uint64_t seq, std::uint64_t bytes)
{
  auto* dst = reinterpret_cast<std::uint8_t*>(ref.data());
  for (std::uint64_t i = 0; i < bytes; ++i) { dst[i] = ferry::testing::pattern_byte(seq, i); }
  ref.commit();
}
/// One forward on `cs`: entry j (hook `hook0 + j`, `sizes[j]` bytes from `src(j)`) captured deferred where
/// `deferred(j)`, else immediately. Returns end_forward's plan.
template <class B, class Src, class Deferred>
fd::forward_plan capture_forward(fd::channel<B>& ch, fb::stream_view<B> cs, const std::vector<std::uint64_t>& sizes,
                                 std::uint32_t hook0, Src&& src, Deferred&& deferred)
{
  ch.begin_forward(cs);
  for (std::uint64_t j = 0; j < sizes.size(); ++j) {
    const fd::hook_id hook{static_cast<std::uint32_t>(hook0 + j)};
    if (deferred(j)) {
      ch.capture_deferred(hook, src(j), sizes[j], cs);
    } else {
      ch.capture(hook, src(j), sizes[j], cs);
    }
  }
  return ch.end_forward(cs);
}
/// Replays `g` (each after its plan) `replays` times on `s`, calling `prepare(r)` first (replay r's expected
/// entries and sources), then closes the channel: clean, every entry of every replay delivered, none bad.
template <class B, class Prepare>
void replay_checked(fd::channel<B>& ch, const fb::graph_exec<B>& g, const fd::forward_plan& plan, fb::stream<B>& s,
                    const checker& chk, std::uint64_t replays, Prepare&& prepare)
{
  for (std::uint64_t r = 0; r < replays; ++r) {
    prepare(r);
    ch.replay(g, plan, s);
  }
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, replays * plan.size());
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}
/// Expects `f()` to throw out_of_memory naming capture_deferred.
template <class F>
void expect_refused_oom(F&& f)
{
  try {
    f();
    ADD_FAILURE() << "capture_deferred on a full ring (fail_fast): expected out_of_memory";
  } catch (const ferry::out_of_memory& e) {
    EXPECT_NE(std::string{e.what()}.find("capture_deferred"), std::string::npos) << e.what();
  }
}
/// Expects `f()` to throw logic_error whose message contains every one of `what`.
template <class F>
void expect_refused(F&& f, std::initializer_list<const char*> what, const char* call)
{
  try {
    f();
    ADD_FAILURE() << call << ": expected logic_error";
  } catch (const ferry::logic_error& e) {
    for (const char* w : what) { EXPECT_NE(std::string{e.what()}.find(w), std::string::npos) << call << ": " << e.what(); }
  }
}
}  // namespace gather_test

/// Deferred entries interleaved with immediate captures and explicit flushes keep their entry order: the
/// gather of the recorded batch is enqueued before the immediate copy (its flush point), and the cursor
/// parity the CPU mirrors matches the device's. Fails without the flush in capture(): the immediate entry
/// lands where the CPU did not place it and the drain copies other bytes.
TYPED_TEST_P(D2hGather, MixedImmediateAndDeferredKeepEntryOrder)
{
  using B = TypeParam;
  for (auto [k, branch] : {std::pair{1U, false}, std::pair{3U, true}, std::pair{16U, true}, std::pair{16U, false}}) {
    SCOPED_TRACE("K " + std::to_string(k) + " branch " + std::to_string(branch));
    fb::stream<B> s{this->b};
    constexpr std::uint64_t forwards = 6, per_forward = 24, stride = 2048;
    sources<B> src{this->b, s, 0, forwards * per_forward, stride};
    checker chk{seq_order::consecutive};
    auto cfg = this->small_config(20 << 10, k);
    cfg.tuning.branch_publish = branch;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    std::mt19937 rng{k * 7 + (branch ? 1 : 0)};
    std::uint64_t seq = 0;
    for (std::uint64_t f = 0; f < forwards; ++f) {
      ch.begin_forward(s);
      for (std::uint64_t j = 0; j < per_forward; ++j, ++seq) {
        const std::uint64_t size = 16 + rng() % (stride - 16);
        const auto hook = static_cast<std::uint32_t>(1 + j % 5);
        chk.expect(seq, hook, size);
        const auto mode = rng() % 4;
        if (mode == 0) {
          ch.capture(fd::hook_id{hook}, src.at(seq), size, s);
        } else {
          ch.capture_deferred(fd::hook_id{hook}, src.at(seq), size, s);
          if (mode == 1 && rng() % 3 == 0) { ch.flush(s); }
        }
      }
      (void)ch.end_forward(s);
    }
    EXPECT_TRUE(ch.close().clean());
    EXPECT_EQ(chk.got, forwards * per_forward);
    EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
  }
}

/// end_forward with a recorded deferred batch launches ONE gather that also does the forward boundary's
/// release: every entry since the last release (here, the whole forward: K is large) and the cursor
/// normalization (slot[0] = slot[1]) when the gather wrote slot[1], i.e. after an even number of writers
/// (`m` immediate captures first: both parities). One release per forward, every byte right over forwards
/// that each start from the normalized cursor. Without the normalization (mutant
/// boundary_gather_without_normalize) the next forward places its entries from a stale cursor slot.
TYPED_TEST_P(D2hGather, BoundaryGatherDoesTheForwardRelease)
{
  using B = TypeParam;
  for (const std::uint64_t m : {0U, 1U, 2U}) {
    for (const auto fault : with_mutant(d2h_fault::boundary_gather_without_normalize)) {
      SCOPED_TRACE("immediate entries first: " + std::to_string(m));
      fb::stream<B> s{this->b};
      constexpr std::uint64_t forwards = 4, deferred = 3;
      const std::uint64_t per = m + deferred, n = forwards * per;
      sources<B> src{this->b, s, 0, n, 512};
      checker chk{seq_order::consecutive};
      fd::channel<B> ch{this->small_config(1 << 16, 64), this->b, chk.callback()};
      d2h_access::set_fault(ch, fault);
      for (std::uint64_t f = 0, seq = 0; f < forwards; ++f) {
        ch.begin_forward(s);
        for (std::uint64_t j = 0; j < per; ++j, ++seq) {
          chk.expect(seq, 4, 512);
          if (j < m) {
            ch.capture(fd::hook_id{4}, src.at(seq), 512, s);
          } else {
            ch.capture_deferred(fd::hook_id{4}, src.at(seq), 512, s);
          }
        }
        (void)ch.end_forward(s);
        if (fault == d2h_fault::none) { EXPECT_EQ(ch.stats().publishes, f + 1) << "one release per forward"; }
      }
      s.synchronize();
      ASSERT_TRUE(wait_until<B>([&] { return ch.stats().entries_drained == n; }));
      const bool clean = ch.close().clean();
      if (fault == d2h_fault::none) { EXPECT_TRUE(clean); }
      if (fault == d2h_fault::none || m % 2 == 1) {  // odd m: the gather wrote slot[0], nothing to normalize
        EXPECT_EQ(chk.got, n);
        EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
      } else {
        EXPECT_GT(chk.bad(), 0U) << "the test must detect the boundary gather's missing cursor normalization";
      }
    }
  }
}

/// begin_write is a flush point: the recorded deferred entries are copied (gather enqueued) before the
/// user writer reads the cursor, so its entry lands after them. Host backend (the writer is a host kernel).
TYPED_TEST_P(D2hGather, BeginWriteIsAFlushPoint)
{
  using B = TypeParam;
  if constexpr (!is_host_v<B>) {
    GTEST_SKIP() << "the user writer here is a host-backend kernel";
  } else {
    fb::stream<B> s{this->b};
    constexpr std::uint64_t forwards = 5, per_forward = 9, stride = 640;
    sources<B> src{this->b, s, 0, forwards * per_forward, stride};
    checker chk{seq_order::consecutive};
    fd::channel<B> ch{this->small_config(7 << 10, 4), this->b, chk.callback()};
    const fb::host_kernel<fd::ring_ref, std::uint64_t, std::uint64_t> writer{&gather_test::user_write, "user_write"};
    std::uint64_t seq = 0;
    for (std::uint64_t f = 0; f < forwards; ++f) {
      ch.begin_forward(s);
      for (std::uint64_t j = 0; j < per_forward; ++j, ++seq) {
        const std::uint64_t size = 100 + (seq * 37) % (stride - 100);
        chk.expect(seq, 6, size);
        if (j % 3 == 2) {
          auto t = ch.begin_write(fd::hook_id{6}, size, s);
          this->b.launch(writer, fb::launch_config{{1}, {32}, 0}, s.handle(), t.ref(), seq, size);
          ch.end_write(std::move(t), s);
        } else {
          ch.capture_deferred(fd::hook_id{6}, src.at(seq), size, s);
        }
      }
      (void)ch.end_forward(s);
    }
    EXPECT_TRUE(ch.close().clean());
    EXPECT_EQ(chk.got, forwards * per_forward);
    EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
  }
}

/// Deferred-only forwards on a ring that is not a multiple of the forward: batches are placed across the
/// wrap (the place_phys chain inside one gather starts an entry at 0 where it would straddle), K from 1 to
/// beyond the 32-entry gather limit.
TYPED_TEST_P(D2hGather, BatchesSplitAtRingWrap)
{
  using B = TypeParam;
  for (std::uint32_t k : {1U, 5U, 16U, 64U}) {
    SCOPED_TRACE("K " + std::to_string(k));
    fb::stream<B> s{this->b};
    constexpr std::uint64_t forwards = 8, per_forward = 40, stride = 1024;
    sources<B> src{this->b, s, 0, forwards * per_forward, stride};
    checker chk{seq_order::consecutive};
    fd::channel<B> ch{this->small_config(13 << 10, k), this->b, chk.callback()};
    std::mt19937 rng{k};
    std::uint64_t seq = 0;
    for (std::uint64_t f = 0; f < forwards; ++f) {
      ch.begin_forward(s);
      for (std::uint64_t j = 0; j < per_forward; ++j, ++seq) {
        const std::uint64_t size = 1 + rng() % stride;
        chk.expect(seq, 9, size);
        ch.capture_deferred(fd::hook_id{9}, src.at(seq), size, s);
      }
      (void)ch.end_forward(s);
    }
    EXPECT_TRUE(ch.close().clean());
    EXPECT_EQ(chk.got, forwards * per_forward);
    EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
    EXPECT_GE(ch.stats().high_watermark, 0U);
  }
}

/// One batch of one large entry (256 KiB + 8 bytes) and many small ones: the large entry gets many blocks,
/// each small one a block, all in one launch; every byte lands.
TYPED_TEST_P(D2hGather, OneLargeAndManySmallInOneBatch)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  constexpr std::uint64_t large = (256 << 10) + 8, small = 100;
  sources<B> big{this->b, s, 0, 1, large};
  sources<B> few{this->b, s, 1, 15, 128};
  checker chk{seq_order::consecutive};
  fd::channel<B> ch{this->small_config(1 << 20, 16), this->b, chk.callback()};
  for (std::uint64_t rep = 0; rep < 2; ++rep) {  // twice: the join counter is reset for the next gather
    const std::uint64_t base = rep * 16;
    chk.pattern_base = 0 - base;  // entry base + j carries pattern(j) (unsigned wrap)
    ch.begin_forward(s);
    chk.expect(base, 1, large);
    ch.capture_deferred(fd::hook_id{1}, big.at(0), large, s);
    for (std::uint64_t j = 0; j < 15; ++j) {
      chk.expect(base + 1 + j, 2, small);
      ch.capture_deferred(fd::hook_id{2}, few.at(j), small, s);
    }
    (void)ch.end_forward(s);
    ASSERT_TRUE(wait_until<B>([&] { return ch.stats().entries_drained == base + 16; }));
  }
  EXPECT_EQ(ch.stats().publishes, 4U) << "per forward: the gather's release (16 entries, K = 16) and the boundary's";
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 32U);
  EXPECT_EQ(chk.bad_meta, 0U) << chk.first_bad;
  // The apportioning itself: the large entry gets every block but one per small entry.
  fd::detail::gather_args a{};
  a.n = 16;
  a.e[0].bytes = large;
  for (std::uint32_t j = 1; j < 16; ++j) { a.e[j].bytes = small; }
  const auto sh = fd::detail::apportion_gather(this->small_config(1 << 20, 16), a, 132);
  EXPECT_EQ(sh.blocks, a.first_block[16]);
  EXPECT_GE(a.first_block[1], 32U) << "the large entry is copied by many blocks";
  for (std::uint32_t j = 1; j < 16; ++j) { EXPECT_EQ(a.first_block[j + 1] - a.first_block[j], 1U); }
}

/// A partial batch (< K deferred entries) is copied and published at end_forward, and an explicit flush()
/// copies without publishing (the K rule); flush() with nothing recorded enqueues nothing.
TYPED_TEST_P(D2hGather, PartialBatchAtEndForwardAndExplicitFlush)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 12, 512};
  checker chk{seq_order::consecutive};
  auto cfg = this->small_config(1 << 16, 16);
  cfg.tuning.branch_publish = false;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  EXPECT_THROW(ch.capture_deferred(fd::hook_id{1}, src.at(0), 64, s), ferry::logic_error) << "outside a forward";
  ch.begin_forward(s);
  EXPECT_THROW(ch.capture_deferred(fd::hook_id{1}, nullptr, 64, s), ferry::logic_error) << "null source";
  EXPECT_THROW(ch.capture_deferred(fd::hook_id{1}, src.at(0), 0, s), ferry::logic_error) << "zero-size entry";
  for (std::uint64_t j = 0; j < 5; ++j) {
    chk.expect(j, 3, 512);
    ch.capture_deferred(fd::hook_id{3}, src.at(j), 512, s);
  }
  EXPECT_EQ(ch.stats().entries_reserved, 0U) << "deferred entries are only recorded until their flush";
  ch.flush(s);
  EXPECT_EQ(ch.stats().entries_reserved, 5U);
  EXPECT_EQ(ch.stats().publishes, 0U) << "5 < K: the flush copies, the forward boundary publishes";
  ch.flush(s);  // nothing recorded: no-op
  for (std::uint64_t j = 5; j < 12; ++j) {
    chk.expect(j, 3, 512);
    ch.capture_deferred(fd::hook_id{3}, src.at(j), 512, s);
  }
  (void)ch.end_forward(s);
  EXPECT_EQ(ch.stats().entries_reserved, 12U);
  EXPECT_EQ(ch.stats().publishes, 1U) << "one release at the forward boundary";
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 12U);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

/// The contract's other side: once the flush is enqueued, work enqueued after it on the same stream may
/// overwrite the sources; the captured bytes are the ones before (stream order: the gather completed).
TYPED_TEST_P(D2hGather, SourcesOverwrittenAfterTheFlushKeepCapturedBytes)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  constexpr std::uint64_t n = 10, stride = 768;
  sources<B> src{this->b, s, 0, n, stride};
  checker chk{seq_order::consecutive};
  fd::channel<B> ch{this->small_config(1 << 16, 4), this->b, chk.callback()};
  ch.begin_forward(s);
  for (std::uint64_t j = 0; j < n; ++j) {
    chk.expect(j, 4, stride);
    ch.capture_deferred(fd::hook_id{4}, src.at(j), stride, s);
    if (j == 6) { ch.flush(s); }
  }
  (void)ch.end_forward(s);  // the last flush point: entries 7..9
  this->b.memset_async(src.dev.data(), 0xEE, n * stride, s.handle());  // overwrite every source
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, n);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

/// Captured forwards mixing deferred and immediate entries, replayed many times across the wrap: the
/// gather's descriptor table is in the graph's kernel parameters, its placement comes from the device
/// cursor, and plan() mirrors it with place() per entry.
TYPED_TEST_P(D2hGather, GraphReplaysManyTimesWithPlan)
{
  using B = TypeParam;
  for (auto [k, branch] : {std::pair{2U, false}, std::pair{4U, true}, std::pair{16U, true}}) {
    SCOPED_TRACE("K " + std::to_string(k) + " branch " + std::to_string(branch));
    fb::stream<B> s{this->b};
    const std::vector<std::uint64_t> sizes{1000, 48, 4096, 333, 2048, 16, 700};
    const std::vector<bool> deferred{true, true, false, true, true, true, false};
    constexpr std::uint64_t stride = 4096, replays = 40;
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
    checker chk{seq_order::consecutive};
    auto cfg = this->small_config(13 << 10, k);
    cfg.tuning.branch_publish = branch;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    fd::forward_plan plan;
    auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      plan = gather_test::capture_forward(
        ch, cs, sizes, 100, [&](std::uint64_t j) { return static_cast<const std::byte*>(dsrc.data()) + j * stride; },
        [&](std::uint64_t j) { return deferred[j]; });
    });
    ASSERT_EQ(plan.size(), n);
    gather_test::replay_checked(ch, g, plan, s, chk, replays, [&](std::uint64_t r) {
      for (std::uint64_t j = 0; j < n; ++j) { chk.expect(r * n + j, static_cast<std::uint32_t>(100 + j), sizes[j]); }
      this->b.memcpy_async(dsrc.data(), h + r * n * stride, n * stride, fb::memcpy_kind::host_to_device, s.handle());
    });
  }
}

/// DMI's vllm-full capture of one Qwen3-0.6B decode step at B=1 (341 hooks: 8-byte token ids, 2-6 KiB per
/// layer hook, 297 KiB of logits), in a graph replayed across ring wraps: every hook deferred (K = 16 and 32),
/// and every hook immediate with one 16-byte vector per thread (the lean copy form on up to 149 blocks).
TYPED_TEST_P(D2hGather, VllmFullSizesInAGraphAcrossRingWraps)
{
  using B = TypeParam;
  std::vector<std::uint64_t> sizes{8, 2048};
  for (int layer = 0; layer < 28; ++layer) {
    for (std::uint64_t v : {2048, 2048, 4096, 2048, 2048, 4096, 2048, 2048, 2048, 2048, 6144, 2048}) { sizes.push_back(v); }
  }
  for (std::uint64_t v : {2048, 2048, 303872}) { sizes.push_back(v); }
  const std::uint64_t n = sizes.size();
  std::vector<std::uint64_t> at(n + 1, 0);  // each source 16-byte aligned in one device buffer
  for (std::uint64_t j = 0; j < n; ++j) { at[j + 1] = at[j] + fd::align_up(sizes[j], 16); }
  struct variant {
    std::uint32_t k;
    bool deferred;
    std::uint32_t vecs;
  };
  // K 4096: one release per forward (end_forward's), batches of gather_max_entries (128) across the wraps
  for (const variant v : {variant{16, true, 2}, variant{32, true, 2}, variant{4096, true, 2}, variant{16, false, 1}}) {
    SCOPED_TRACE("K " + std::to_string(v.k) + (v.deferred ? " deferred" : " immediate") + " V " + std::to_string(v.vecs));
    fb::stream<B> s{this->b};
    constexpr std::uint64_t replays = 6;
    fb::device_buffer<B> dsrc{at[n], this->b};
    fb::pinned_buffer<B> host{at[n], this->b};
    auto* h = static_cast<std::uint8_t*>(host.data());
    checker chk{seq_order::consecutive};
    auto cfg = this->small_config(std::size_t{3} << 20, v.k);  // ~1.2 MiB per forward: a wrap every ~2.6 replays
    cfg.fifo_capacity = 4096;
    cfg.tuning.copy_vecs_per_thread = v.vecs;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    fd::forward_plan plan;
    auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      plan = gather_test::capture_forward(
        ch, cs, sizes, 0, [&](std::uint64_t j) { return static_cast<const std::byte*>(dsrc.data()) + at[j]; },
        [&](std::uint64_t) { return v.deferred; });
    });
    ASSERT_EQ(plan.size(), n);
    gather_test::replay_checked(ch, g, plan, s, chk, replays, [&](std::uint64_t r) {
      s.synchronize();  // the previous replay read the sources
      for (std::uint64_t j = 0; j < n; ++j) {
        chk.expect(r * n + j, static_cast<std::uint32_t>(j), sizes[j]);
        for (std::uint64_t i = 0; i < sizes[j]; ++i) { h[at[j] + i] = ferry::testing::pattern_byte(r * n + j, i); }
      }
      this->b.memcpy_async(dsrc.data(), host.data(), at[n], fb::memcpy_kind::host_to_device, s.handle());
    });
  }
}

/// Bounce capture (tuning::bounce_capture_max_bytes): capture() of a small static entry copies its
/// source at the call into the channel's staging slot and joins the deferred batch. Immediate semantics: every
/// immediate entry comes from ONE source buffer rewritten (stream order) right before each capture, so an entry
/// whose bytes were read later than its capture (as a deferred one's are) would carry a later entry's pattern.
/// Mixed with entries above the limit (the copy kernel) and deferred ones (buffers of their own), K = 4, eager
/// forwards then a replayed graph: entry order and every byte right. Then abort_forward: the bounced entries
/// (launched) are delivered, the deferred ones dropped.
TYPED_TEST_P(D2hGather, BounceCaptureCopiesAtTheCallAndKeepsOrder)
{
  using B = TypeParam;
  constexpr std::uint64_t per = 14, stride = 6144, limit = 4096;
  const auto size_of = [](std::uint64_t j) -> std::uint64_t {
    return j % 4 == 0 ? 6000 : 16 + (j * 977) % (limit - 16);  // j % 4 == 0: above the limit (copy kernel)
  };
  const auto is_deferred = [](std::uint64_t j) { return j % 4 == 1; };
  fb::stream<B> s{this->b};
  fb::pinned_buffer<B> pat{per * stride, this->b};  // entry j's bytes of the next forward, at j * stride
  fb::device_buffer<B> one{stride, this->b};        // the immediate entries' one source
  fb::device_buffer<B> own{per * stride, this->b};  // the deferred entries' sources
  auto* h = static_cast<std::uint8_t*>(pat.data());
  const auto fill = [&](std::uint64_t first_seq) {  // the patterns of seqs first_seq .. + per, and the deferred copies
    s.synchronize();
    for (std::uint64_t j = 0; j < per; ++j) {
      for (std::uint64_t i = 0; i < stride; ++i) { h[j * stride + i] = ferry::testing::pattern_byte(first_seq + j, i); }
    }
    this->b.memcpy_async(own.data(), pat.data(), per * stride, fb::memcpy_kind::host_to_device, s.handle());
  };
  checker chk{seq_order::consecutive};
  auto cfg = this->small_config(1 << 16, 4);
  cfg.tuning.bounce_capture_max_bytes = limit;
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  const auto forward = [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    for (std::uint64_t j = 0; j < per; ++j) {
      const fd::hook_id hook{static_cast<std::uint32_t>(10 + j)};
      if (is_deferred(j)) {
        ch.capture_deferred(hook, static_cast<const std::byte*>(own.data()) + j * stride, size_of(j), cs);
      } else {
        this->b.memcpy_async(one.data(), h + j * stride, size_of(j), fb::memcpy_kind::host_to_device, cs.handle());
        ch.capture(hook, one.data(), size_of(j), cs);
      }
    }
    return ch.end_forward(cs);
  };
  std::uint64_t seq = 0;
  const auto expect_forward = [&] {
    for (std::uint64_t j = 0; j < per; ++j) { chk.expect(seq + j, static_cast<std::uint32_t>(10 + j), size_of(j)); }
  };
  for (int f = 0; f < 3; ++f, seq += per) {  // eager
    fill(seq);
    expect_forward();
    (void)forward(s.view());
  }
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) { plan = forward(cs); });
  ASSERT_EQ(plan.size(), per);
  for (int r = 0; r < 4; ++r, seq += per) {  // replays: the captured H2D copies read the refilled patterns
    fill(seq);
    expect_forward();
    ch.replay(g, plan, s);
  }
  s.synchronize();
  ASSERT_TRUE(wait_until<B>([&] { return chk.received() == seq; })) << chk.received() << " of " << seq;
  // abort_forward: the two bounced entries (launched) are delivered, the deferred one between them is dropped
  fill(seq);
  ch.begin_forward(s);
  chk.expect(seq, 50, 100);
  this->b.memcpy_async(one.data(), h, 100, fb::memcpy_kind::host_to_device, s.handle());
  ch.capture(fd::hook_id{50}, one.data(), 100, s);
  ch.capture_deferred(fd::hook_id{51}, own.data(), 64, s);
  chk.expect(seq + 1, 52, 200);
  this->b.memcpy_async(one.data(), h + stride, 200, fb::memcpy_kind::host_to_device, s.handle());
  ch.capture(fd::hook_id{52}, one.data(), 200, s);
  EXPECT_TRUE(ch.abort_forward(s));
  seq += 2;
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, seq);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

/// A backend failure at the gather launch (fault injected at exactly that call) surfaces as the backend's
/// error naming it, invalidates the channel, and loses nothing published before it.
TYPED_TEST_P(D2hGather, FaultAtTheGatherLaunchInvalidates)
{
  using FB = typename gather_test::as_faulty<TypeParam>::type;
  fb::fault_plan fp;
  FB fbk{&fp};
  fb::stream<FB> s{fbk};
  sources<FB> src{fbk, s, 0, 8, 256};
  auto cfg = this->small_config(1 << 16, 4);
  cfg.drain = fd::drain_mode::poll;  // no drain thread: the producer's backend calls are counted alone
  // Run 1 finds the index of the gather launch among the flush's backend calls; run 2 fails exactly it.
  std::uint64_t launch_at = fb::fault_plan::never;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    checker chk{seq_order::consecutive};
    fd::channel<FB> ch{cfg, fbk, chk.callback()};
    ch.begin_forward(s);
    for (std::uint64_t j = 0; j < 4; ++j) {  // a full batch: gather + release, delivered
      chk.expect(j, 5, 256);
      ch.capture_deferred(fd::hook_id{5}, src.at(j), 256, s);
    }
    ASSERT_TRUE(wait_until<FB>([&] {
      (void)ch.poll();
      return ch.stats().entries_drained == 4;
    }));
    for (std::uint64_t j = 4; j < 7; ++j) { ch.capture_deferred(fd::hook_id{5}, src.at(j), 256, s); }
    fp.reset_count();
    if (run == 0) {
      ch.flush(s);
      const auto log = fp.log();
      for (std::size_t i = 0; i < log.size(); ++i) {
        if (log[i].rfind("launch:", 0) == 0) {
          launch_at = i;
          break;
        }
      }
      ASSERT_NE(launch_at, fb::fault_plan::never) << "the flush launches the gather";
      (void)ch.end_forward(s);
      while (ch.poll() > 0 || ch.stats().entries_drained < 7) {}
      EXPECT_TRUE(ch.close().clean());
      continue;
    }
    fp.fail_at(launch_at);
    bool threw = false;
    try {
      ch.flush(s);
    } catch (const ferry::backend_error& e) {
      threw = true;
      EXPECT_NE(std::string{e.what()}.find("launch"), std::string::npos) << e.what();
    }
    fp.disarm();
    EXPECT_TRUE(threw) << "the injected gather launch failure surfaces";
    EXPECT_TRUE(ch.invalidated());
    EXPECT_THROW(ch.capture_deferred(fd::hook_id{5}, src.at(7), 256, s), ferry::invalidated_error);
    EXPECT_THROW((void)ch.close(), ferry::invalidated_error);
    EXPECT_EQ(chk.got, 4U) << "the batch published before the failure was delivered";
    EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
  }
}

/// abort_forward drops the deferred entries not yet flushed (recorded on the CPU, never launched, no seq
/// given): they never arrive, while every entry flushed before the abort (explicit flush, the K-th entry,
/// an immediate capture's flush point) arrives exact, and the next forward (eager, deferred, replayed)
/// starts clean. Eager, a capture body that throws (graph_exec::capture's on_failure aborts), and a
/// capture that ended without end_forward. Fails without the clear in abort_forward: the dropped entries
/// (hook 99) are gathered by the next flush and arrive as unexpected seqs / hooks.
TYPED_TEST_P(D2hGather, AbortForwardDropsUnflushedDeferredEntries)
{
  using B = TypeParam;
  for (auto kb : {std::pair{4U, false}, std::pair{4U, true}, std::pair{16U, true}}) {
    const unsigned k = kb.first;  // plain locals: clang 14 cannot capture structured bindings in lambdas
    const bool branch = kb.second;
    SCOPED_TRACE("K " + std::to_string(k) + " branch " + std::to_string(branch));
    fb::stream<B> s{this->b};
    constexpr std::uint64_t stride = 512;
    sources<B> src{this->b, s, 0, 64, stride};
    checker chk{seq_order::consecutive};
    auto cfg = this->small_config(1 << 16, k);
    cfg.tuning.branch_publish = branch;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    std::uint64_t seq = 0;
    const auto deferred = [&](std::uint64_t size) {
      chk.expect(seq, 7, size);
      ch.capture_deferred(fd::hook_id{7}, src.at(seq), size, s);
      ++seq;
    };
    const auto dropped = [&](fb::stream_view<B> cs, std::uint64_t count) {  // never flushed: no seq, never delivered
      for (std::uint64_t j = 0; j < count; ++j) { ch.capture_deferred(fd::hook_id{99}, src.at(63 - j), 40 + j, cs); }
    };
    const auto good_forward = [&] {  // mixed deferred and immediate, ended: all arrive
      ch.begin_forward(s);
      for (std::uint64_t j = 0; j < 5; ++j) {
        if (j == 2) {
          chk.expect(seq, 8, 300);
          ch.capture(fd::hook_id{8}, src.at(seq), 300, s);
          ++seq;
        } else {
          deferred(100 + 50 * j);
        }
      }
      (void)ch.end_forward(s);
    };

    // Eager: flushed by flush(), by the K-th entry (K = 4) and by an immediate capture, then 3 unflushed.
    ch.begin_forward(s);
    deferred(256);
    deferred(64);
    ch.flush(s);
    for (std::uint64_t j = 0; j < 4; ++j) { deferred(128 + j); }
    deferred(200);
    chk.expect(seq, 8, stride);
    ch.capture(fd::hook_id{8}, src.at(seq), stride, s);  // flush point of the entry before it
    ++seq;
    dropped(s.view(), 3);
    const std::uint64_t reserved_before = ch.stats().entries_reserved;
    EXPECT_TRUE(ch.abort_forward(s));
    EXPECT_EQ(ch.stats().entries_reserved, reserved_before) << "abort_forward reserves none of the dropped entries";
    EXPECT_FALSE(ch.abort_forward(s)) << "nothing left to abort";
    good_forward();

    // Captured: a body that throws with deferred entries recorded (one batch flushed into the discarded
    // graph when K = 4); on_failure aborts the forward.
    const auto throwing_body = [&](fb::stream_view<B> cs) {
      ch.begin_forward(cs);
      dropped(cs, k == 4 ? 6 : 3);
      throw std::runtime_error{"capture body failed"};
    };
    EXPECT_THROW((void)fb::graph_exec<B>::capture(s.view(), throwing_body,
                                                  [&](fb::stream_view<B> cs) { (void)ch.abort_forward(cs); }),
                 std::runtime_error);
    good_forward();

    // Captured: the capture ends without end_forward (deferred entries recorded, none flushed); every call
    // is refused until abort_forward drops the forward.
    try {
      auto bad = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
        ch.begin_forward(cs);
        dropped(cs, 2);
      });
    } catch (const ferry::backend_error&) {
    }
    gather_test::expect_refused([&] { ch.flush(s); }, {"flush", "no longer capturing"}, "flush");
    EXPECT_TRUE(ch.abort_forward(s));
    good_forward();

    // A replayed forward with deferred entries after all that lands exact too.
    fd::forward_plan plan;
    const std::uint64_t first = seq;
    auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      ch.begin_forward(cs);
      for (std::uint64_t j = 0; j < 3; ++j) { ch.capture_deferred(fd::hook_id{9}, src.at(first + j), 96, cs); }
      plan = ch.end_forward(cs);
    });
    for (std::uint64_t j = 0; j < 3; ++j) { chk.expect(seq++, 9, 96); }
    ch.replay(g, plan, s);

    EXPECT_FALSE(ch.invalidated()) << ch.invalidation_reason();
    EXPECT_TRUE(ch.close().clean());
    EXPECT_EQ(chk.got, seq) << "every flushed entry, none of the dropped ones";
    EXPECT_EQ(ch.stats().entries_reserved, seq);
    EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
    EXPECT_TRUE(chk.expected.empty()) << chk.expected.size() << " expected entries never arrived";
  }
}

/// One compute stream per forward holds for deferred entries too (check_producer): capture_deferred and
/// flush on a second stream inside a forward are refused naming both streams, record nothing, and the
/// forward's own entries (recorded before and after) arrive exact on its stream. Fails without the stream
/// check: the second stream's entry is recorded (and its gather would run unordered with the forward's
/// stream), so no logic_error is thrown and an unexpected hook-98 entry arrives.
TYPED_TEST_P(D2hGather, CaptureDeferredOnASecondStreamIsRefused)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  fb::stream<B> s2{this->b};
  sources<B> src{this->b, s, 0, 8, 256};
  checker chk{seq_order::consecutive};
  fd::channel<B> ch{this->small_config(1 << 16, 16), this->b, chk.callback()};
  ch.begin_forward(s);
  chk.expect(0, 5, 256);
  ch.capture_deferred(fd::hook_id{5}, src.at(0), 256, s);
  gather_test::expect_refused([&] { ch.capture_deferred(fd::hook_id{98}, src.at(1), 256, s2); },
                              {"capture_deferred", "one compute stream per forward"}, "capture_deferred on s2");
  gather_test::expect_refused([&] { ch.flush(s2); }, {"flush", "one compute stream per forward"}, "flush on s2");
  EXPECT_EQ(ch.stats().entries_reserved, 0U) << "the refused flush launched nothing";
  chk.expect(1, 5, 200);
  ch.capture_deferred(fd::hook_id{5}, src.at(1), 200, s);
  (void)ch.end_forward(s);
  // Between forwards another stream is fine (begin_forward joins the last forward's stream into it).
  ch.begin_forward(s2);
  chk.expect(2, 6, 128);
  ch.capture_deferred(fd::hook_id{6}, src.at(2), 128, s2);
  gather_test::expect_refused([&] { ch.capture_deferred(fd::hook_id{98}, src.at(3), 64, s); },
                              {"capture_deferred", "one compute stream per forward"}, "capture_deferred on s");
  (void)ch.end_forward(s2);
  EXPECT_FALSE(ch.invalidated()) << ch.invalidation_reason();
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 3U);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

/// gather_branch_publish: the batch's release runs on the branch behind a fork event recorded after the
/// gather, so it waits for the gather's copies (and the slow fills before them). The mutant whose branch
/// release skips the fork (branch_publish_without_fork) publishes entries whose bytes are not there yet.
TYPED_TEST_P(D2hGather, BranchReleaseWaitsForTheGather)
{
  this->expect_branch_release_waits(8, 9, true, "a branch release of a gather that does not wait for the gather");
}

/// A deferred entry reserves its ring space at capture_deferred: under fail_fast a full ring refuses that
/// entry (out_of_memory) and keeps the batch recorded before it, which end_forward then copies; nothing is
/// lost and the channel stays usable. Fails when the reservation waits for the flush: the 9th entry is then
/// accepted and end_forward's flush finds the ring full (the batch lost, the channel invalidated).
TYPED_TEST_P(D2hGather, FailFastRefusesTheDeferredEntryThatDoesNotFit)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  constexpr std::uint64_t n = 9, stride = 512;
  sources<B> src{this->b, s, 0, n, stride};
  checker chk{seq_order::consecutive};
  auto cfg = this->small_config(4096, 16);  // 8 entries of 512 fill the ring; the 8th flushes a batch of 7
  cfg.on_full = fd::full_policy::fail_fast;
  cfg.drain = fd::drain_mode::poll;  // nothing drains until poll(): the ring stays full
  fd::channel<B> ch{cfg, this->b, chk.callback()};
  ch.begin_forward(s);
  for (std::uint64_t j = 0; j < 8; ++j) {
    chk.expect(j, 5, stride);
    ch.capture_deferred(fd::hook_id{5}, src.at(j), stride, s);
  }
  gather_test::expect_refused_oom([&] { ch.capture_deferred(fd::hook_id{6}, src.at(8), stride, s); });
  (void)ch.end_forward(s);  // copies the recorded entry 7 (its space was reserved)
  ASSERT_TRUE(wait_until<B>([&] {
    (void)ch.poll();
    return chk.got == 8U;
  }));
  EXPECT_FALSE(ch.invalidated());
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(chk.got, 8U);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

/// The gather batch is apart from K (tuning::gather_batch; docs/design/d2h.md, "Gather publication"): a gather
/// of more than K entries releases once for all of them (mid-forward: the drain delivers them before
/// end_forward), a partial one releases nothing (the boundary's release covers it), and the default batch
/// (128) does not flush at K. Every entry exact, with the batch releases fused or on the branch.
TYPED_TEST_P(D2hGather, GatherBatchApartFromK)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  sources<B> src{this->b, s, 0, 20, 384};
  for (const bool branch : {false, true}) {
    checker chk{seq_order::consecutive};
    auto cfg = this->small_config(1 << 16, 4);
    cfg.tuning.gather_batch = 10;
    cfg.tuning.branch_publish = branch;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    ch.begin_forward(s);
    for (std::uint64_t j = 0; j < 20; ++j) {
      chk.expect(j, 5, 384);
      ch.capture_deferred(fd::hook_id{5}, src.at(j), 384, s);
      if (j == 8) { EXPECT_EQ(ch.stats().entries_reserved, 0U) << "9 entries: past K = 4, below the batch of 10"; }
      if (j == 9) {
        EXPECT_EQ(ch.deferred_pending(), 0U) << "the 10th entry flushes the batch";
        EXPECT_EQ(ch.stats().publishes, 1U) << "one release for two and a half batches of K";
        ASSERT_TRUE(wait_until<B>([&] { return ch.stats().entries_drained == 10; })) << "released mid-forward";
      }
      if (j == 12) {
        ch.flush(s);  // a partial batch of 3 (< K since the last release): copied, not released
        EXPECT_EQ(ch.stats().entries_reserved, 13U);
        EXPECT_EQ(ch.stats().publishes, 1U);
      }
    }
    EXPECT_EQ(ch.deferred_pending(), 7U);
    (void)ch.end_forward(s);  // the boundary's gather releases the 10 since the last release
    EXPECT_EQ(ch.stats().publishes, 2U);
    EXPECT_TRUE(ch.close().clean());
    EXPECT_EQ(chk.got, 20U);
    EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
  }
  // the default batch: K = 16 does not size the gather
  auto cfg = this->small_config(1 << 16, 16);
  cfg.tuning.gather_batch = fd::tuning{}.gather_batch;
  ASSERT_EQ(cfg.tuning.gather_batch, 128U);
  fd::channel<B> ch{cfg, this->b};
  ch.begin_forward(s);
  for (std::uint64_t j = 0; j < 20; ++j) { ch.capture_deferred(fd::hook_id{5}, src.at(j), 384, s); }
  EXPECT_EQ(ch.deferred_pending(), 20U) << "20 entries, K = 16: one batch";
  (void)ch.end_forward(s);
  EXPECT_EQ(ch.stats().publishes, 1U) << "the one gather does the forward boundary's release";
  EXPECT_TRUE(ch.close().clean());
}

REGISTER_TYPED_TEST_SUITE_P(D2hGather, BoundaryGatherDoesTheForwardRelease, FailFastRefusesTheDeferredEntryThatDoesNotFit, BranchReleaseWaitsForTheGather, MixedImmediateAndDeferredKeepEntryOrder, BeginWriteIsAFlushPoint,
                            BatchesSplitAtRingWrap,
                            OneLargeAndManySmallInOneBatch, PartialBatchAtEndForwardAndExplicitFlush,
                            SourcesOverwrittenAfterTheFlushKeepCapturedBytes, GraphReplaysManyTimesWithPlan,
                            VllmFullSizesInAGraphAcrossRingWraps, BounceCaptureCopiesAtTheCallAndKeepsOrder,
                            FaultAtTheGatherLaunchInvalidates, AbortForwardDropsUnflushedDeferredEntries,
                            CaptureDeferredOnASecondStreamIsRefused, GatherBatchApartFromK);

}  // namespace ferry::test
