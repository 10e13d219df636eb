// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hGatherRows, over backends (host and faulty<host> in CI, cuda on the H200):
// channel::capture_rows_deferred, a batch of row entries sharing one selection copied by ONE gather_rows_publish
// launch (kernels/d2h/select). Every delivered entry is compared byte for byte with the rows its selection names.
#pragma once

#include "d2h/select_rows.hpp"

#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

namespace ferry::test {

template <class B>
class D2hGatherRows : public D2hSelectRows<B> {
 protected:
  using base = D2hSelectRows<B>;
  /// A [n_rows, row_bytes] source whose row r, byte k is row_byte(r, k) + salt (so two sources differ).
  fb::device_buffer<B> salted(std::uint64_t row_bytes, std::uint8_t salt, fb::stream_view<B> s)
  {
    std::vector<std::uint8_t> h(base::n_rows * row_bytes);
    for (std::uint64_t r = 0; r < base::n_rows; ++r) {
      for (std::uint64_t k = 0; k < row_bytes; ++k) { h[r * row_bytes + k] = static_cast<std::uint8_t>(base::row_byte(r, k) + salt); }
    }
    return this->upload(h, s);
  }
  static std::vector<std::uint8_t> expect(const std::vector<std::int64_t>& rows, std::uint64_t row_bytes, std::uint8_t salt)
  {
    auto e = base::expected(rows, row_bytes);
    for (auto& x : e) { x = static_cast<std::uint8_t>(x + salt); }
    return e;
  }
};
TYPED_TEST_SUITE_P(D2hGatherRows);

/// 40 hooks of mixed row sizes (16-byte multiples and odd; two wider than the gather's 16 KiB chunk) share one
/// selection per forward: batches of K = 16 (three gathers), every form, CPU-known and device counts; each entry holds its source's selected rows; with a
/// CPU-known count the entries fill their bytes and coalesce (fewer D2H copies than entries).
TYPED_TEST_P(D2hGatherRows, BatchesSharingASelectionHoldTheirRows)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  const std::vector<std::uint64_t> sizes{64, 48, 36, 128, 16, 40000, 33808};
  std::vector<fb::device_buffer<B>> src;
  for (std::size_t h = 0; h < 40; ++h) { src.push_back(this->salted(sizes[h % sizes.size()], static_cast<std::uint8_t>(h), s.view())); }
  std::vector<std::int32_t> qsl{0, 10, 10, 25, 40, 64};
  auto dqsl = this->upload(qsl, s.view());
  const std::vector<std::int32_t> idx{63, 0, 7, 7, 31};
  auto didx = this->upload(idx, s.view());
  const std::vector<std::int32_t> req{4, 0, 2};
  auto dreq = this->upload(req, s.view());
  auto dcount = this->upload(std::vector<std::int32_t>{2}, s.view());
  const auto* q = static_cast<const std::int32_t*>(dqsl.data());
  struct form {
    fd::row_selection sel;
    std::vector<std::int64_t> rows;
  };
  const std::vector<form> forms{
    {fd::row_selection::rows(static_cast<const std::int32_t*>(didx.data()), idx.size()), {63, 0, 7, 7, 31}},
    {fd::row_selection::last_token(q, 5, static_cast<const std::int32_t*>(dreq.data()), req.size()), {63, 9, 24}},
    {fd::row_selection::window(q, 5, static_cast<const std::int32_t*>(dreq.data()), req.size(), 1, 4),
     {41, 42, 43, 1, 2, 3, 11, 12, 13}},
    {fd::row_selection::rows(static_cast<const std::int32_t*>(didx.data()), 0)
       .counted_on_device(static_cast<const std::int32_t*>(dcount.data()), 5), {63, 0}}};
  for (std::size_t f = 0; f < forms.size(); ++f) {
    SCOPED_TRACE(::testing::Message() << "form " << f);
    typename TestFixture::collected got;
    fd::channel<B> ch{this->rows_config(16 << 20), this->b, got.callback()};
    ch.begin_forward(s);
    for (std::size_t h = 0; h < 40; ++h) {
      ch.capture_rows_deferred(fd::hook_id{static_cast<std::uint32_t>(h)}, src[h].data(), TestFixture::n_rows,
                               sizes[h % sizes.size()], forms[f].sel, s);
    }
    (void)ch.end_forward(s);
    s.synchronize();
    EXPECT_NO_THROW((void)ch.close(10s));
    ASSERT_EQ(got.size(), 40U);
    for (std::size_t h = 0; h < 40; ++h) {
      EXPECT_EQ(got.status[h], fd::entry_status::ok) << "hook " << h;
      EXPECT_EQ(got.bytes[h], TestFixture::expect(forms[f].rows, sizes[h % sizes.size()], static_cast<std::uint8_t>(h)))
        << "hook " << h;
    }
    if (forms[f].sel.device_count == nullptr) {
      EXPECT_LT(ch.stats().copies, 40U) << "entries that filled their bytes coalesce";
    }
  }
}

/// Row entries interleaved with whole deferred entries, immediate captures and a second selection: each change
/// flushes the batch first, entry order is kept, and every entry holds its bytes.
TYPED_TEST_P(D2hGatherRows, KindsAndSelectionsSplitBatchesInOrder)
{
  using B = TypeParam;
  constexpr std::uint64_t rb = 32;
  fb::stream<B> s{this->b};
  auto src = this->salted(rb, 3, s.view());
  auto a = this->upload(std::vector<std::int32_t>{1, 2}, s.view());
  auto c = this->upload(std::vector<std::int32_t>{60, 50, 40}, s.view());
  const auto sa = fd::row_selection::rows(static_cast<const std::int32_t*>(a.data()), 2);
  const auto sc = fd::row_selection::rows(static_cast<const std::int32_t*>(c.data()), 3);
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(), this->b, got.callback()};
  std::vector<std::vector<std::uint8_t>> want;
  ch.begin_forward(s);
  ch.capture_rows_deferred(fd::hook_id{0}, src.data(), TestFixture::n_rows, rb, sa, s);
  want.push_back(TestFixture::expect({1, 2}, rb, 3));
  ch.capture_rows_deferred(fd::hook_id{1}, src.data(), TestFixture::n_rows, rb, sc, s);  // another selection
  want.push_back(TestFixture::expect({60, 50, 40}, rb, 3));
  ch.capture_deferred(fd::hook_id{2}, src.data(), 2 * rb, s);  // a whole entry: rows 0 and 1
  want.push_back(TestFixture::expect({0, 1}, rb, 3));
  ch.capture_rows_deferred(fd::hook_id{3}, src.data(), TestFixture::n_rows, rb, sa, s);
  want.push_back(TestFixture::expect({1, 2}, rb, 3));
  ch.capture_rows(fd::hook_id{4}, src.data(), TestFixture::n_rows, rb, sc, s);  // immediate: flushes first
  want.push_back(TestFixture::expect({60, 50, 40}, rb, 3));
  ch.capture_rows_deferred(fd::hook_id{5}, src.data(), TestFixture::n_rows, rb, sa, s);
  want.push_back(TestFixture::expect({1, 2}, rb, 3));
  ch.capture_rows_deferred(fd::hook_id{6}, src.data(), TestFixture::n_rows / 2, rb, sa, s);  // another n_rows
  want.push_back(TestFixture::expect({1, 2}, rb, 3));
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got.status[i], fd::entry_status::ok) << "entry " << i;
    EXPECT_EQ(got.bytes[i], want[i]) << "entry " << i;
  }
}

/// In a graph: 24 hooks sharing a selection at a fixed address (rows and a device count, bound 16), rewritten
/// before every replay (empty and full included); a small ring wraps. Every replay's entries hold its rows.
TYPED_TEST_P(D2hGatherRows, GraphReplaysGatherTheSelectionOfTheirStep)
{
  using B = TypeParam;
  constexpr std::uint64_t rb = 48, hooks = 24, replays = 16, bound = 16;
  std::mt19937_64 rng{5};
  fb::stream<B> s{this->b};
  std::vector<fb::device_buffer<B>> src;
  for (std::size_t h = 0; h < hooks; ++h) { src.push_back(this->salted(rb, static_cast<std::uint8_t>(h * 3), s.view())); }
  fb::device_buffer<B> idx{bound * 4, this->b};
  fb::device_buffer<B> count{4, this->b};
  typename TestFixture::collected got;
  auto cfg = this->rows_config(48 << 10);  // about two forwards: the ring wraps
  cfg.publish_every = 8;
  fd::channel<B> ch{cfg, this->b, got.callback()};
  const auto sel = fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), 0)
                     .counted_on_device(static_cast<const std::int32_t*>(count.data()), bound);
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    for (std::size_t h = 0; h < hooks; ++h) {
      ch.capture_rows_deferred(fd::hook_id{static_cast<std::uint32_t>(h)}, src[h].data(), TestFixture::n_rows, rb, sel, cs);
    }
    plan = ch.end_forward(cs);
  });
  std::vector<std::vector<std::int64_t>> rows(replays);
  for (std::uint64_t r = 0; r < replays; ++r) {
    const std::uint64_t n = r == 0 ? 0 : r == 1 ? bound : rng() % (bound + 1);
    std::vector<std::int32_t> v(n);
    for (std::uint64_t k = 0; k < n; ++k) { rows[r].push_back(v[k] = static_cast<std::int32_t>(rng() % TestFixture::n_rows)); }
    this->write(idx, v, s.view());
    this->write(count, std::vector<std::int32_t>{static_cast<std::int32_t>(n)}, s.view());
    ch.replay(g, plan, s);
    s.synchronize();  // the next step rewrites the selection
  }
  EXPECT_TRUE(wait_until<B>([&] { return got.size() == hooks * replays; }, 10s));
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.size(), hooks * replays);
  for (std::uint64_t i = 0; i < hooks * replays; ++i) {
    const std::uint64_t r = i / hooks, h = i % hooks;
    EXPECT_EQ(got.status[i], fd::entry_status::ok) << "replay " << r << " hook " << h;
    EXPECT_EQ(got.bytes[i], TestFixture::expect(rows[r], rb, static_cast<std::uint8_t>(h * 3))) << "replay " << r << " hook " << h;
  }
}

/// A batch whose selection names a row past n_rows, or whose device count passes its bound: every entry of the
/// batch is delivered as selection_error (they share the selection) and counted; the batches around it are whole.
TYPED_TEST_P(D2hGatherRows, AnInvalidSelectionFailsItsBatchOnly)
{
  using B = TypeParam;
  constexpr std::uint64_t rb = 16;
  fb::stream<B> s{this->b};
  auto src = this->salted(rb, 0, s.view());
  auto good = this->upload(std::vector<std::int32_t>{5, 6}, s.view());
  auto bad = this->upload(std::vector<std::int32_t>{5, 64}, s.view());
  auto over = this->upload(std::vector<std::int32_t>{3}, s.view());
  const auto sg = fd::row_selection::rows(static_cast<const std::int32_t*>(good.data()), 2);
  const auto sb = fd::row_selection::rows(static_cast<const std::int32_t*>(bad.data()), 2);
  const auto so = sg.counted_on_device(static_cast<const std::int32_t*>(over.data()), 2);
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(), this->b, got.callback()};
  ch.begin_forward(s);
  for (const auto* sel : {&sg, &sb, &so, &sg}) {
    for (std::uint32_t h = 0; h < 3; ++h) { ch.capture_rows_deferred(fd::hook_id{h}, src.data(), TestFixture::n_rows, rb, *sel, s); }
  }
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.size(), 12U);
  for (std::size_t i = 0; i < 12; ++i) {
    const bool failed = i >= 3 && i < 9;
    EXPECT_EQ(got.status[i], failed ? fd::entry_status::selection_error : fd::entry_status::ok) << "entry " << i;
    if (!failed) { EXPECT_EQ(got.bytes[i], TestFixture::expect({5, 6}, rb, 0)) << "entry " << i; }
  }
  EXPECT_EQ(ch.stats().selection_errors, 6U);
}

/// plan()'s forward_meta::selected (the CPU knows this replay's count): each row entry's expected size is exact,
/// so the drain copies a batch with one D2H instead of one per entry; a device count below the plan is still
/// delivered right (one copy per entry), one above it is a size_overflow (no copy); a count above the reservation
/// is refused before anything is enqueued. (D2hPlannedRows: the exact reservation itself.)
TYPED_TEST_P(D2hGatherRows, APlannedCountCoalescesAReplaysRowEntries)
{
  using B = TypeParam;
  constexpr std::uint64_t rb = 32, hooks = 12, bound = 8;
  fb::stream<B> s{this->b};
  std::vector<fb::device_buffer<B>> src;
  for (std::size_t h = 0; h < hooks; ++h) { src.push_back(this->salted(rb, static_cast<std::uint8_t>(h), s.view())); }
  fb::device_buffer<B> idx{bound * 4, this->b};
  fb::device_buffer<B> count{4, this->b};
  typename TestFixture::collected got;
  auto cfg = this->rows_config(1 << 20);
  cfg.publish_every = 64;
  fd::channel<B> ch{cfg, this->b, got.callback()};
  const auto sel = fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), 0)
                     .counted_on_device(static_cast<const std::int32_t*>(count.data()), bound);
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    for (std::size_t h = 0; h < hooks; ++h) {
      ch.capture_rows_deferred(fd::hook_id{static_cast<std::uint32_t>(h)}, src[h].data(), TestFixture::n_rows, rb, sel, cs);
    }
    plan = ch.end_forward(cs);
  });
  const std::vector<std::int32_t> rows{9, 1, 40, 3, 3};
  this->write(idx, rows, s.view());
  this->write(count, std::vector<std::int32_t>{5}, s.view());
  auto replay = [&](std::optional<std::uint64_t> hint) {
    fd::forward_meta m;
    m.selected = hint;
    const std::uint64_t before = ch.stats().copies;
    const std::size_t n = got.size();
    ch.replay(g, plan, s, std::move(m));
    s.synchronize();
    EXPECT_TRUE(wait_until<B>([&] { return got.size() == n + hooks; }, 10s));
    return ch.stats().copies - before;
  };
  EXPECT_EQ(replay(std::nullopt), hooks) << "a device count alone: one copy per entry";
  EXPECT_EQ(replay(5), 1U) << "the planned count: one copy for the batch";
  EXPECT_EQ(replay(6), hooks) << "a plan above the device count: delivered, one copy per entry";
  EXPECT_EQ(replay(4), 0U) << "a plan below the device count: size_overflow, nothing copied";
  fd::forward_meta over;
  over.selected = bound + 1;
  try {
    ch.plan(plan, s, over);
    ADD_FAILURE() << "expected a logic_error for a hint above the reservation";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("at most the 8 items"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.size(), 4 * hooks);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool over = i >= 3 * hooks;
    EXPECT_EQ(got.status[i], over ? fd::entry_status::size_overflow : fd::entry_status::ok) << i;
    if (!over) { EXPECT_EQ(got.bytes[i], TestFixture::expect({9, 1, 40, 3, 3}, rb, static_cast<std::uint8_t>(i % hooks))) << i; }
  }
  EXPECT_EQ(ch.stats().size_overflows, hooks);
}

REGISTER_TYPED_TEST_SUITE_P(D2hGatherRows, BatchesSharingASelectionHoldTheirRows, KindsAndSelectionsSplitBatchesInOrder,
                            GraphReplaysGatherTheSelectionOfTheirStep, AnInvalidSelectionFailsItsBatchOnly,
                            APlannedCountCoalescesAReplaysRowEntries);

}  // namespace ferry::test
