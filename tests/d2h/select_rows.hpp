// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hSelectRows, over backends (host and faulty<host> in CI, cuda on the H200):
// channel::capture_rows (row_selection.hpp, kernels/d2h/select). Every delivered entry is compared byte for
// byte with the rows its selection names, in selection order (each source row carries its own bytes).
#pragma once

#include "d2h/fixture.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

namespace ferry::test {

template <class B>
class D2hSelectRows : public d2h_fixture<B> {
 protected:
  static constexpr std::uint64_t n_rows = 64;

  /// Byte k of source row r (never the same for two rows at one k).
  static std::uint8_t row_byte(std::uint64_t r, std::uint64_t k) { return static_cast<std::uint8_t>(r * 131 + k * 7 + 1); }

  /// Delivered entries in order: status and bytes.
  struct collected {
    std::mutex m;
    std::vector<fd::entry_status> status;
    std::vector<std::vector<std::uint8_t>> bytes;
    std::vector<std::uint64_t> row_bytes;  ///< entry_view::row_bytes() (D2hReduceRows: the record's bytes)
    auto callback()
    {
      return [this](fd::entry_view&& v) {
        std::lock_guard lock{m};
        status.push_back(v.status());
        row_bytes.push_back(v.row_bytes());
        std::vector<std::uint8_t> b;
        if (v.ok()) {
          const auto s = v.bytes();
          b.assign(reinterpret_cast<const std::uint8_t*>(s.data()), reinterpret_cast<const std::uint8_t*>(s.data()) + s.size());
        }
        bytes.push_back(std::move(b));
      };
    }
    std::size_t size()
    {
      std::lock_guard lock{m};
      return status.size();
    }
  };

  /// The bytes an entry of `rows` (source row indices, in order) must hold.
  static std::vector<std::uint8_t> expected(const std::vector<std::int64_t>& rows, std::uint64_t row_bytes)
  {
    std::vector<std::uint8_t> e;
    for (const auto r : rows) {
      for (std::uint64_t k = 0; k < row_bytes; ++k) { e.push_back(row_byte(static_cast<std::uint64_t>(r), k)); }
    }
    return e;
  }

  /// A device array with `v`'s contents (synchronized on `s`).
  template <class T>
  fb::device_buffer<B> upload(const std::vector<T>& v, fb::stream_view<B> s)
  {
    fb::device_buffer<B> d{std::max<std::size_t>(v.size(), 1) * sizeof(T), this->b};
    write(d, v, s);
    return d;
  }
  template <class T>
  void write(fb::device_buffer<B>& d, const std::vector<T>& v, fb::stream_view<B> s)
  {
    if (v.empty()) { return; }
    fb::pinned_buffer<B> h{v.size() * sizeof(T), this->b};
    std::memcpy(h.data(), v.data(), v.size() * sizeof(T));
    this->b.memcpy_async(d.data(), h.data(), v.size() * sizeof(T), fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
  }
  fb::device_buffer<B> source(std::uint64_t row_bytes, fb::stream_view<B> s)
  {
    std::vector<std::uint8_t> h(n_rows * row_bytes);
    for (std::uint64_t r = 0; r < n_rows; ++r) {
      for (std::uint64_t k = 0; k < row_bytes; ++k) { h[r * row_bytes + k] = row_byte(r, k); }
    }
    return upload(h, s);
  }
  fd::config rows_config(std::size_t ring = 1 << 16)
  {
    auto c = this->small_config(ring, 3);
    c.tuning.size_slots = 64;
    return c;
  }
};
TYPED_TEST_SUITE_P(D2hSelectRows);

/// Every form, eagerly, with a CPU-known and a GPU-resolved count, 16-byte rows and odd-sized rows, an empty
/// and a full selection: each entry holds exactly the selected rows, in selection order.
TYPED_TEST_P(D2hSelectRows, EveryFormEagerHoldsTheSelectedRows)
{
  using B = TypeParam;
  std::mt19937_64 rng{7};
  fb::stream<B> s{this->b};
  // 8 requests of random lengths over the 64 rows (query_start_loc), some of length 0
  std::vector<std::int32_t> qsl{0};
  for (int r = 0; r < 8; ++r) { qsl.push_back(r == 7 ? 64 : std::min<std::int32_t>(64, qsl.back() + static_cast<std::int32_t>(rng() % 13))); }
  auto dqsl = this->upload(qsl, s.view());
  for (const std::uint64_t row_bytes : {std::uint64_t{64}, std::uint64_t{36}}) {
    SCOPED_TRACE(::testing::Message() << "row_bytes " << row_bytes);
    auto src = this->source(row_bytes, s.view());
    typename TestFixture::collected got;
    fd::channel<B> ch{this->rows_config(), this->b, got.callback()};
    std::vector<std::vector<std::uint8_t>> want;
    // keeps every selection array alive until close (the kernels read them when they run)
    std::vector<fb::device_buffer<B>> keep;
    auto capture = [&](fd::row_selection sel, const std::vector<std::int64_t>& rows, bool on_device) {
      if (on_device) {
        const std::vector<std::int32_t> n{static_cast<std::int32_t>(sel.count)};
        keep.push_back(this->upload(n, s.view()));
        sel = sel.counted_on_device(static_cast<const std::int32_t*>(keep.back().data()), sel.count + 5);
      }
      ch.capture_rows(fd::hook_id{static_cast<std::uint32_t>(want.size())}, src.data(), TestFixture::n_rows, row_bytes,
                      sel, s);
      want.push_back(TestFixture::expected(rows, row_bytes));
    };
    ch.begin_forward(s);
    for (const bool on_device : {false, true}) {
      // explicit rows, int32 (with a repeat) and int64, an empty and a full list
      std::vector<std::int32_t> i32{5, 63, 0, 5, 17};
      keep.push_back(this->upload(i32, s.view()));
      capture(fd::row_selection::rows(static_cast<const std::int32_t*>(keep.back().data()), i32.size()), {5, 63, 0, 5, 17},
              on_device);
      std::vector<std::int64_t> all(TestFixture::n_rows);
      std::iota(all.rbegin(), all.rend(), 0);  // every row, reversed
      keep.push_back(this->upload(all, s.view()));
      capture(fd::row_selection::rows(static_cast<const std::int64_t*>(keep.back().data()), all.size()), all, on_device);
      capture(fd::row_selection::rows(static_cast<const std::int32_t*>(keep.back().data()), 0), {}, on_device);
      // the last token of the requests with tokens, a window [1, 3) of those with at least 3
      std::vector<std::int32_t> req, win;
      std::vector<std::int64_t> last_rows, win_rows;
      for (std::int32_t r = 7; r >= 0; --r) {
        if (qsl[r + 1] > qsl[r]) {
          req.push_back(r);
          last_rows.push_back(qsl[r + 1] - 1);
        }
        if (qsl[r + 1] - qsl[r] >= 3) {
          win.push_back(r);
          win_rows.push_back(qsl[r] + 1);
          win_rows.push_back(qsl[r] + 2);
        }
      }
      const auto* q = static_cast<const std::int32_t*>(dqsl.data());
      keep.push_back(this->upload(req, s.view()));
      capture(fd::row_selection::last_token(q, 8, static_cast<const std::int32_t*>(keep.back().data()), req.size()),
              last_rows, on_device);
      keep.push_back(this->upload(win, s.view()));
      capture(fd::row_selection::window(q, 8, static_cast<const std::int32_t*>(keep.back().data()), win.size(), 1, 3),
              win_rows, on_device);
    }
    (void)ch.end_forward(s);
    s.synchronize();
    EXPECT_NO_THROW((void)ch.close(10s));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got.status[i], fd::entry_status::ok) << "entry " << i;
      EXPECT_EQ(got.bytes[i], want[i]) << "entry " << i << ": " << got.bytes[i].size() << " bytes, expected " << want[i].size();
    }
  }
}

/// In a graph: the selection (rows and a device count) at fixed device addresses, rewritten before every
/// replay with a random selection (empty and full included); a small ring wraps. Every replay's entry holds
/// that replay's rows.
TYPED_TEST_P(D2hSelectRows, GraphReplaysReadTheSelectionOfTheirStep)
{
  using B = TypeParam;
  constexpr std::uint64_t row_bytes = 48, replays = 24;
  std::mt19937_64 rng{11};
  fb::stream<B> s{this->b};
  auto src = this->source(row_bytes, s.view());
  fb::device_buffer<B> idx{TestFixture::n_rows * 4, this->b};
  fb::device_buffer<B> count{4, this->b};
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(8 << 10), this->b, got.callback()};  // 8 KiB: the 3 KiB bound wraps
  const auto sel = fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), 0)
                     .counted_on_device(static_cast<const std::int32_t*>(count.data()), TestFixture::n_rows);
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    ch.capture_rows(fd::hook_id{4}, src.data(), TestFixture::n_rows, row_bytes, sel, cs);
    plan = ch.end_forward(cs);
  });
  std::vector<std::vector<std::uint8_t>> want;
  for (std::uint64_t r = 0; r < replays; ++r) {
    const std::uint64_t n = r == 0 ? 0 : r == 1 ? TestFixture::n_rows : rng() % (TestFixture::n_rows + 1);
    std::vector<std::int32_t> rows(n);
    std::vector<std::int64_t> rows64(n);
    for (std::uint64_t k = 0; k < n; ++k) { rows64[k] = rows[k] = static_cast<std::int32_t>(rng() % TestFixture::n_rows); }
    this->write(idx, rows, s.view());
    this->write(count, std::vector<std::int32_t>{static_cast<std::int32_t>(n)}, s.view());
    want.push_back(TestFixture::expected(rows64, row_bytes));
    ch.replay(g, plan, s);
    s.synchronize();  // the next step rewrites the selection
  }
  EXPECT_TRUE(wait_until<B>([&] { return got.size() == replays; }, 10s));
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got.status[i], fd::entry_status::ok) << "replay " << i;
    EXPECT_EQ(got.bytes[i], want[i]) << "replay " << i;
  }
}

/// What only the GPU sees: a row outside [0, n_rows), a request outside [0, n_requests), a window past its
/// request's tokens, a device count above max_count. Each entry is delivered as selection_error (bytes()
/// throws the typed error), counted, and the entries around it are unaffected. The bad row and the bad request
/// are each their selection's first item: the block that meets it is not the last to arrive on the host
/// backend (its blocks run in order), so its error reaches the commit only through the join counter.
TYPED_TEST_P(D2hSelectRows, InvalidSelectionsAreFlaggedByTheKernel)
{
  using B = TypeParam;
  constexpr std::uint64_t row_bytes = 32;
  fb::stream<B> s{this->b};
  auto src = this->source(row_bytes, s.view());
  auto dqsl = this->upload(std::vector<std::int32_t>{0, 4, 6}, s.view());
  auto good = this->upload(std::vector<std::int32_t>{1, 2}, s.view());
  auto bad_row = this->upload(std::vector<std::int32_t>{64, 3}, s.view());
  auto bad_req = this->upload(std::vector<std::int32_t>{2, 0}, s.view());
  auto short_req = this->upload(std::vector<std::int32_t>{1}, s.view());  // 2 tokens: window [1, 3) is past it
  auto too_many = this->upload(std::vector<std::int32_t>{9}, s.view());
  std::vector<fd::entry_status> status;
  std::vector<std::string> errors;
  std::mutex m;
  fd::channel<B> ch{this->rows_config(), this->b, [&](fd::entry_view&& v) {
                      std::lock_guard lock{m};
                      status.push_back(v.status());
                      try {
                        (void)v.bytes();
                      } catch (const fd::selection_error& e) {
                        errors.push_back(e.what());
                      }
                    }};
  const auto* q = static_cast<const std::int32_t*>(dqsl.data());
  const auto* g = static_cast<const std::int32_t*>(good.data());
  ch.begin_forward(s);
  ch.capture_rows(fd::hook_id{0}, src.data(), TestFixture::n_rows, row_bytes, fd::row_selection::rows(g, 2), s);
  ch.capture_rows(fd::hook_id{1}, src.data(), TestFixture::n_rows, row_bytes,
                  fd::row_selection::rows(static_cast<const std::int32_t*>(bad_row.data()), 2), s);
  ch.capture_rows(fd::hook_id{2}, src.data(), TestFixture::n_rows, row_bytes,
                  fd::row_selection::last_token(q, 2, static_cast<const std::int32_t*>(bad_req.data()), 2), s);
  ch.capture_rows(fd::hook_id{3}, src.data(), TestFixture::n_rows, row_bytes,
                  fd::row_selection::window(q, 2, static_cast<const std::int32_t*>(short_req.data()), 1, 1, 3), s);
  ch.capture_rows(fd::hook_id{4}, src.data(), TestFixture::n_rows, row_bytes,
                  fd::row_selection::rows(g, 0).counted_on_device(static_cast<const std::int32_t*>(too_many.data()), 2), s);
  ch.capture_rows(fd::hook_id{5}, src.data(), TestFixture::n_rows, row_bytes, fd::row_selection::rows(g, 2), s);
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  const std::vector<fd::entry_status> want{fd::entry_status::ok, fd::entry_status::selection_error,
                                           fd::entry_status::selection_error, fd::entry_status::selection_error,
                                           fd::entry_status::selection_error, fd::entry_status::ok};
  EXPECT_EQ(status, want);
  ASSERT_EQ(errors.size(), 4U);
  EXPECT_NE(errors[0].find("refused on the device"), std::string::npos) << errors[0];
  EXPECT_EQ(ch.stats().selection_errors, 4U);
}

/// What the CPU can see is refused at the call, naming the hook and the value; nothing is enqueued.
TYPED_TEST_P(D2hSelectRows, BadArgumentsAreRefusedAtTheCall)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  auto src = this->source(16, s.view());
  auto idx = this->upload(std::vector<std::int32_t>{1}, s.view());
  const auto* i = static_cast<const std::int32_t*>(idx.data());
  fd::channel<B> ch{this->rows_config(), this->b};
  auto derived_cfg = this->small_config(1 << 16, 3);
  derived_cfg.tuning.size_slots = 0;  // the default: derived (one per FIFO slot), so a row entry needs no knob
  fd::channel<B> derived{derived_cfg, this->b};
  ch.begin_forward(s);
  derived.begin_forward(s);
  auto sel = fd::row_selection::rows(i, 1);
  auto expect_refused = [&](auto&& f, const char* text) {
    try {
      f();
      ADD_FAILURE() << "expected a logic_error containing " << text;
    } catch (const ferry::logic_error& e) {
      EXPECT_NE(std::string{e.what()}.find(text), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { ch.capture_rows(fd::hook_id{1}, nullptr, 64, 16, sel, s); }, "a null source");
  expect_refused([&] { ch.capture_rows(fd::hook_id{1}, src.data(), 64, 0, sel, s); }, "got [64, 0]");
  auto two = sel;
  two.index_bytes = 2;
  expect_refused([&] { ch.capture_rows(fd::hook_id{1}, src.data(), 64, 16, two, s); }, "got 2 bytes");
  expect_refused([&] { ch.capture_rows(fd::hook_id{1}, src.data(), 64, 16, fd::row_selection::window(i, 1, i, 1, 3, 3), s); },
                 "got [3, 3)");
  expect_refused([&] { ch.capture_rows(fd::hook_id{1}, src.data(), 64, 16, fd::row_selection::rows(i, 1ULL << 40), s); },
                 "expected at most ring_bytes");
  derived.capture_rows(fd::hook_id{1}, src.data(), 64, 16, sel, s);  // (before issue 39: refused, no size slots)
  (void)ch.end_forward(s);
  (void)derived.end_forward(s);
  EXPECT_EQ(ch.stats().entries_reserved, 0U);
  EXPECT_EQ(derived.stats().entries_reserved, 1U);
  EXPECT_TRUE(derived.close().clean());
}

REGISTER_TYPED_TEST_SUITE_P(D2hSelectRows, EveryFormEagerHoldsTheSelectedRows, GraphReplaysReadTheSelectionOfTheirStep,
                            InvalidSelectionsAreFlaggedByTheKernel, BadArgumentsAreRefusedAtTheCall);

}  // namespace ferry::test
