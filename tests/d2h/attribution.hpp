// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hAttribution, over backends (host and faulty<host> in CI, cuda on the H200): every
// delivered entry carries its forward's index, tag and metadata (forward_info.hpp: begin_forward for an eager
// forward, plan / replay per graph replay), its row size, and per-request views of its rows (rows_of).
#pragma once

#include "d2h/select_rows.hpp"

#include <cstring>
#include <mutex>
#include <vector>

namespace ferry::test {

template <class B>
class D2hAttribution : public D2hSelectRows<B> {
 protected:
  /// What the consumer saw of one entry.
  struct seen {
    std::uint64_t forward{0}, tag{0}, rows{0}, row_bytes{0};
    std::uint32_t hook{0};
    std::vector<std::byte> user;
    std::vector<std::vector<std::uint8_t>> per_request;  ///< rows_of(request) for each request of the forward
    bool has_meta{false};
  };
  struct log {
    std::mutex m;
    std::vector<seen> all;
    auto callback()
    {
      return [this](fd::entry_view&& v) {
        seen s{v.forward_index(), v.tag(), v.rows(), v.row_bytes(), v.hook().value, {}, {}, v.meta() != nullptr};
        if (v.meta() != nullptr) { s.user = v.meta()->user; }
        if (v.meta() != nullptr && v.row_bytes() != 0) {
          for (const auto& r : v.meta()->requests) {
            const auto b = v.rows_of(r.request);
            s.per_request.emplace_back(reinterpret_cast<const std::uint8_t*>(b.data()),
                                       reinterpret_cast<const std::uint8_t*>(b.data()) + b.size());
          }
        }
        std::lock_guard lock{m};
        all.push_back(std::move(s));
      };
    }
    std::size_t size()
    {
      std::lock_guard lock{m};
      return all.size();
    }
  };
  static std::vector<std::byte> bytes_of(const char* s)
  {
    std::vector<std::byte> b(std::strlen(s));
    std::memcpy(b.data(), s, b.size());
    return b;
  }
};
TYPED_TEST_SUITE_P(D2hAttribution);

/// Eager forwards: a tagged forward's row entries expose the tag, the user bytes and each request's rows (the
/// last token of requests 5, 2, 7: rows_of(5) is the last token of request 5); an untagged forward's tag is its
/// index; an entry captured whole has no rows; rows_of refuses an unknown request and a whole entry.
TYPED_TEST_P(D2hAttribution, EagerForwardsCarryTagMetadataAndRequestRows)
{
  using B = TypeParam;
  constexpr std::uint64_t row_bytes = 32;
  fb::stream<B> s{this->b};
  auto src = this->source(row_bytes, s.view());
  // 8 requests of 8 tokens each
  std::vector<std::int32_t> qsl;
  for (std::int32_t r = 0; r <= 8; ++r) { qsl.push_back(r * 8); }
  auto dqsl = this->upload(qsl, s.view());
  const std::vector<std::int32_t> req{5, 2, 7};
  auto dreq = this->upload(req, s.view());
  typename TestFixture::log got;
  fd::channel<B> ch{this->rows_config(), this->b, got.callback()};
  const auto sel = fd::row_selection::last_token(static_cast<const std::int32_t*>(dqsl.data()), 8,
                                                 static_cast<const std::int32_t*>(dreq.data()), req.size());
  const auto win = fd::row_selection::window(static_cast<const std::int32_t*>(dqsl.data()), 8,
                                             static_cast<const std::int32_t*>(dreq.data()), req.size(), 2, 4);
  fd::forward_meta m;
  m.tag = 1000;
  m.requests = fd::forward_meta::consecutive(req.data(), req.size());
  m.user = TestFixture::bytes_of("step 1000");
  ch.begin_forward(s, m);
  ch.capture_rows(fd::hook_id{1}, src.data(), TestFixture::n_rows, row_bytes, sel, s);
  ch.capture(fd::hook_id{2}, src.data(), 64, s);
  (void)ch.end_forward(s);
  ch.begin_forward(s);  // untagged
  ch.capture_rows(fd::hook_id{3}, src.data(), TestFixture::n_rows, row_bytes, sel, s);
  (void)ch.end_forward(s);
  fd::forward_meta w;
  w.tag = 1002;
  w.requests = fd::forward_meta::consecutive(req.data(), req.size(), 2);
  ch.begin_forward(s, w);
  ch.capture_rows(fd::hook_id{4}, src.data(), TestFixture::n_rows, row_bytes, win, s);
  (void)ch.end_forward(s);
  // rows_of's refusals, on a consumer-held view (poll mode would do as well; the callback keeps the first)
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.size(), 4U);
  const auto& a = got.all;
  EXPECT_EQ(a[0].forward, 0U);
  EXPECT_EQ(a[0].tag, 1000U);
  EXPECT_EQ(a[0].user, TestFixture::bytes_of("step 1000"));
  EXPECT_EQ(a[0].rows, 3U);
  EXPECT_EQ(a[0].row_bytes, row_bytes);
  ASSERT_EQ(a[0].per_request.size(), 3U);
  for (std::size_t i = 0; i < req.size(); ++i) {
    EXPECT_EQ(a[0].per_request[i], TestFixture::expected({qsl[req[i] + 1] - 1}, row_bytes)) << "request " << req[i];
  }
  EXPECT_EQ(a[1].tag, 1000U) << "an entry captured whole in a tagged forward";
  EXPECT_EQ(a[1].rows, 0U);
  EXPECT_EQ(a[1].row_bytes, 0U);
  EXPECT_EQ(a[2].forward, 1U);
  EXPECT_EQ(a[2].tag, 1U) << "untagged: the forward's index";
  EXPECT_FALSE(a[2].has_meta);
  EXPECT_EQ(a[3].tag, 1002U);
  ASSERT_EQ(a[3].per_request.size(), 3U);
  for (std::size_t i = 0; i < req.size(); ++i) {
    EXPECT_EQ(a[3].per_request[i], TestFixture::expected({qsl[req[i]] + 2, qsl[req[i]] + 3}, row_bytes)) << req[i];
  }
}

/// rows_of refuses what it cannot answer, naming the entry and the request; a captured forward refuses
/// metadata at begin_forward (it belongs to each replay's plan).
TYPED_TEST_P(D2hAttribution, RowsOfAndCapturedMetadataRefusals)
{
  using B = TypeParam;
  constexpr std::uint64_t row_bytes = 16;
  fb::stream<B> s{this->b};
  auto src = this->source(row_bytes, s.view());
  auto idx = this->upload(std::vector<std::int32_t>{3, 4}, s.view());
  auto c = this->rows_config();
  c.drain = fd::drain_mode::poll;
  fd::channel<B> ch{c, this->b};
  fd::forward_meta m;
  m.requests = {{7, 0, 1}, {9, 1, 5}};  // request 9's rows lie past the entry's 2 rows
  ch.begin_forward(s, m);
  ch.capture_rows(fd::hook_id{1}, src.data(), TestFixture::n_rows, row_bytes,
                  fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), 2), s);
  ch.capture(fd::hook_id{2}, src.data(), 32, s);
  (void)ch.end_forward(s);
  std::vector<fd::entry_view> v;
  EXPECT_TRUE(wait_until<B>([&] {
    (void)ch.poll();
    while (auto e = ch.try_pop()) { v.push_back(std::move(*e)); }
    return v.size() == 2;
  }, 10s));
  ASSERT_EQ(v.size(), 2U);
  EXPECT_EQ(v[0].rows_of(7).size(), row_bytes);
  auto refused = [](auto&& f, const char* text) {
    try {
      f();
      ADD_FAILURE() << "expected a logic_error containing " << text;
    } catch (const ferry::logic_error& e) {
      EXPECT_NE(std::string{e.what()}.find(text), std::string::npos) << e.what();
    }
  };
  refused([&] { (void)v[0].rows_of(8); }, "got request 8");
  refused([&] { (void)v[0].rows_of(9); }, "within the entry's 2 rows");
  refused([&] { (void)v[1].rows_of(7); }, "captured whole");
  v.clear();
  fd::forward_plan plan;
  fd::forward_meta tagged;
  tagged.tag = 5;
  refused([&] {
    auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) { ch.begin_forward(cs, tagged); },
                                        [&](fb::stream_view<B> cs) { (void)ch.abort_forward(cs); });
  }, "give each replay's to plan()");
  EXPECT_NO_THROW((void)ch.close(10s));
}

/// Graph replays: each replay's plan carries its own tag and request layout (a new selection per step); every
/// entry of a replay carries that replay's, and rows_of gives each request's row.
TYPED_TEST_P(D2hAttribution, EachReplayCarriesItsPlansMetadata)
{
  using B = TypeParam;
  constexpr std::uint64_t row_bytes = 48, replays = 12;
  fb::stream<B> s{this->b};
  auto src = this->source(row_bytes, s.view());
  fb::device_buffer<B> idx{TestFixture::n_rows * 4, this->b};
  fb::device_buffer<B> count{4, this->b};
  typename TestFixture::log got;
  fd::channel<B> ch{this->rows_config(8 << 10), this->b, got.callback()};
  const auto sel = fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), 0)
                     .counted_on_device(static_cast<const std::int32_t*>(count.data()), 16);
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    ch.capture_rows(fd::hook_id{1}, src.data(), TestFixture::n_rows, row_bytes, sel, cs);
    ch.capture_rows(fd::hook_id{2}, src.data(), TestFixture::n_rows, row_bytes, sel, cs);
    plan = ch.end_forward(cs);
  });
  std::vector<std::vector<std::int32_t>> rows(replays);
  for (std::uint64_t r = 0; r < replays; ++r) {
    const auto n = static_cast<std::int32_t>(1 + r % 16);
    for (std::int32_t k = 0; k < n; ++k) { rows[r].push_back(static_cast<std::int32_t>((r * 7 + k * 5) % TestFixture::n_rows)); }
    this->write(idx, rows[r], s.view());
    this->write(count, std::vector<std::int32_t>{n}, s.view());
    fd::forward_meta m;
    m.tag = 500 + r;
    std::vector<std::uint64_t> ids(rows[r].size());
    for (std::size_t k = 0; k < ids.size(); ++k) { ids[k] = 9000 + r * 100 + k; }  // request k holds row k
    m.requests = fd::forward_meta::consecutive(ids.data(), ids.size());
    ch.replay(g, plan, s, std::move(m));
    s.synchronize();  // the next step rewrites the selection
  }
  EXPECT_TRUE(wait_until<B>([&] { return got.size() == 2 * replays; }, 10s));
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.size(), 2 * replays);
  for (std::uint64_t i = 0; i < 2 * replays; ++i) {
    const auto& e = got.all[i];
    const std::uint64_t r = i / 2;
    EXPECT_EQ(e.forward, r) << "entry " << i;
    EXPECT_EQ(e.tag, 500 + r) << "entry " << i;
    ASSERT_EQ(e.per_request.size(), rows[r].size()) << "entry " << i;
    for (std::size_t k = 0; k < rows[r].size(); ++k) {
      EXPECT_EQ(e.per_request[k], TestFixture::expected({rows[r][k]}, row_bytes)) << "entry " << i << " request " << k;
    }
  }
}

REGISTER_TYPED_TEST_SUITE_P(D2hAttribution, EagerForwardsCarryTagMetadataAndRequestRows,
                            RowsOfAndCapturedMetadataRefusals, EachReplayCarriesItsPlansMetadata);

}  // namespace ferry::test
