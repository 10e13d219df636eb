// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hReduceRows, over backends (host and faulty<host> in CI, cuda on the GPU machine):
// channel::capture_reduced (reducer.hpp, kernels/d2h/reduce). Every record is compared with a reference computed
// here from the same source rows: top-k against a sort (ties: the lower index first), fp8 by its scale and the
// decoded codes (torch's own cast is the Python tests' reference), mean and stats against double sums.
#pragma once

#include "d2h/select_rows.hpp"  // its fixture: collected, upload, write, rows_config

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

namespace ferry::test {

template <class B>
class D2hReduceRows : public D2hSelectRows<B> {
 protected:
  static constexpr std::uint64_t n_rows = 24;  // the sources here (D2hSelectRows' 64 are its own)

  static float f32_at(const std::vector<std::uint8_t>& b, std::size_t off)
  {
    float f;
    std::memcpy(&f, b.data() + off, 4);
    return f;
  }
  static std::uint32_t u32_at(const std::vector<std::uint8_t>& b, std::size_t off)
  {
    std::uint32_t u;
    std::memcpy(&u, b.data() + off, 4);
    return u;
  }
  /// bf16 bits of `f` (truncation: every value the test uses is exact in bf16 or only needs to be some bf16).
  static std::uint16_t bf16_of(float f) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16); }
  static float of_bf16(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }
  /// Row `j`'s top-k record in `got` (k values, then k indices) against a stable descending sort of `value(c)`,
  /// c < width: equal values, the lower index first.
  template <class Value>
  static void expect_topk(const std::vector<std::uint8_t>& got, std::size_t j, std::uint32_t k, std::uint64_t width,
                          Value value)
  {
    std::vector<std::pair<float, std::int32_t>> v(width);
    for (std::uint64_t c = 0; c < width; ++c) { v[c] = {value(c), static_cast<std::int32_t>(c)}; }
    std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first > b.first; });
    const std::size_t base = j * 8ULL * k;
    for (std::uint32_t i = 0; i < k; ++i) {
      ASSERT_EQ(f32_at(got, base + 4ULL * i), v[i].first) << "row " << j << " rank " << i;
      ASSERT_EQ(static_cast<std::int32_t>(u32_at(got, base + 4ULL * (k + i))), v[i].second)
          << "row " << j << " rank " << i;
    }
  }
  /// One forward holding one capture_reduced of `r` over the source rows `rows` of the [n_rows, width] bf16 rows `h`,
  /// delivered into `got` (the channel closed: every entry delivered).
  void reduce_bf16_once(const std::vector<std::uint16_t>& h, std::uint64_t width, const std::vector<std::int32_t>& rows,
                        const fd::reducer& r, std::size_t ring_bytes, typename D2hReduceRows::collected& got)
  {
    fb::stream<B> s{this->b};
    auto dh = this->upload(h, s.view());
    auto idx = this->upload(rows, s.view());
    fd::channel<B> ch{this->rows_config(ring_bytes), this->b, got.callback()};
    ch.begin_forward(s);
    ch.capture_reduced(fd::hook_id{0}, dh.data(), n_rows, width, fd::reduce_input::bf16,
                       fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), rows.size()), r, s);
    (void)ch.end_forward(s);
    s.synchronize();
    EXPECT_NO_THROW((void)ch.close(10s));
  }
  /// float8_e4m3fn bits as float (finite codes).
  static float of_e4m3(std::uint8_t c)
  {
    const int e = (c >> 3) & 15;
    const int m = c & 7;
    const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0F + static_cast<float>(m) / 8, e - 7);
    return (c & 0x80) != 0 ? -v : v;
  }
};
TYPED_TEST_SUITE_P(D2hReduceRows);

/// topk over f32 and bf16 rows (bf16 from a few values, so ties abound), k = 1, 7, 64 and the whole row: the
/// values of a stable descending sort and their indices (equal values: the lower index first).
TYPED_TEST_P(D2hReduceRows, TopkIsTheSortedPrefixWithTiesByLowerIndex)
{
  using B = TypeParam;
  constexpr std::uint64_t width = 300;
  std::mt19937_64 rng{3};
  fb::stream<B> s{this->b};
  std::vector<float> f(TestFixture::n_rows * width);
  std::vector<std::uint16_t> h(TestFixture::n_rows * width);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = normal(rng);
    h[i] = TestFixture::bf16_of(static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5F);  // 9 values: ties
  }
  auto df = this->upload(f, s.view());
  auto dh = this->upload(h, s.view());
  const std::vector<std::int32_t> rows{5, 0, 23, 5};
  auto idx = this->upload(rows, s.view());
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(1 << 20), this->b, got.callback()};
  struct want_t {
    std::uint32_t k;
    bool bf16;
  };
  std::vector<want_t> want;
  ch.begin_forward(s);
  for (const std::uint32_t k : {1U, 7U, 64U, 300U}) {
    for (const bool bf16 : {false, true}) {
      ch.capture_reduced(fd::hook_id{static_cast<std::uint32_t>(want.size())}, bf16 ? dh.data() : df.data(),
                         TestFixture::n_rows, width, bf16 ? fd::reduce_input::bf16 : fd::reduce_input::f32,
                         fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), rows.size()),
                         fd::reducer::topk(k), s);
      want.push_back({k, bf16});
    }
  }
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), want.size());
  for (std::size_t e = 0; e < want.size(); ++e) {
    const auto [k, bf16] = want[e];
    SCOPED_TRACE(::testing::Message() << "k " << k << (bf16 ? " bf16" : " f32"));
    ASSERT_EQ(got.status[e], fd::entry_status::ok);
    ASSERT_EQ(got.row_bytes[e], 8ULL * k);
    ASSERT_EQ(got.bytes[e].size(), rows.size() * 8ULL * k);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      ASSERT_NO_FATAL_FAILURE(TestFixture::expect_topk(got.bytes[e], j, k, width, [&, b16 = bf16](std::uint64_t c) {
        const std::size_t at = rows[j] * width + c;  // b16: clang before 16 captures no structured binding
        return b16 ? TestFixture::of_bf16(h[at]) : f[at];
      }));
    }
  }
}

/// topk over bf16 rows of 4096 elements that take 3 values, so the k-th value has about 1365 equal elements. k = 1
/// and 64: all of them pass topk_filtered's filter and fit its candidates. k = 1024 (topk_max), topk_radix's: more
/// ties than it keeps in shared memory (topk_tie_cap), so the lowest indices among them come from the second radix
/// select. Each: the values of a stable descending sort and their indices.
TYPED_TEST_P(D2hReduceRows, TopkTiesBeyondTheSharedBufferTakeTheLowestIndices)
{
  using B = TypeParam;
  constexpr std::uint64_t width = 4096;
  std::mt19937_64 rng{11};
  fb::stream<B> s{this->b};
  std::vector<std::uint16_t> h(TestFixture::n_rows * width);
  for (auto& x : h) { x = TestFixture::bf16_of(static_cast<float>(static_cast<int>(rng() % 3) - 1)); }
  auto dh = this->upload(h, s.view());
  const std::vector<std::int32_t> rows{7, 1};
  auto idx = this->upload(rows, s.view());
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(1 << 20), this->b, got.callback()};
  const std::vector<std::uint32_t> ks{1U, 64U, 1024U};
  ch.begin_forward(s);
  for (std::size_t e = 0; e < ks.size(); ++e) {
    ch.capture_reduced(fd::hook_id{static_cast<std::uint32_t>(e)}, dh.data(), TestFixture::n_rows, width,
                       fd::reduce_input::bf16,
                       fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), rows.size()),
                       fd::reducer::topk(ks[e]), s);
  }
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), ks.size());
  for (std::size_t e = 0; e < ks.size(); ++e) {
    const std::uint32_t k = ks[e];
    SCOPED_TRACE(::testing::Message() << "k " << k);
    ASSERT_EQ(got.status[e], fd::entry_status::ok);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      ASSERT_NO_FATAL_FAILURE(TestFixture::expect_topk(
          got.bytes[e], j, k, width, [&](std::uint64_t c) { return TestFixture::of_bf16(h[rows[j] * width + c]); }));
    }
  }
}

/// topk over wide bf16 rows, as logits are: normal values (bf16 rounding makes ties near the top) in a row whose
/// width is whole 16-byte vectors and in one that is not (the GPU's vector and scalar passes), and a constant row.
/// k = 64 and 256 take the group-maxima filter (topk_filtered) on the normal rows; on the constant row every element
/// passes the filter, more than it keeps, so topk_radix gives the record (its ties beyond the shared buffer: the
/// second select); k = 257 is topk_radix's at once. Each: the values of a stable descending sort and their indices.
TYPED_TEST_P(D2hReduceRows, TopkOfWideRowsFiltersByGroupMaximaElseSelects)
{
  using B = TypeParam;
  std::mt19937_64 rng{17};
  fb::stream<B> s{this->b};
  const std::vector<std::int32_t> rows{3, 9, 17};  // row 9: constant
  auto idx = this->upload(rows, s.view());
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(8 << 20), this->b, got.callback()};
  const std::uint64_t widths[2] = {32768, 32771};
  const std::uint32_t ks[3] = {64, 256, 257};
  std::vector<std::vector<std::uint16_t>> h(2);
  std::vector<fb::device_buffer<B>> dh;
  std::normal_distribution<float> normal{0.0F, 2.0F};
  for (std::size_t w = 0; w < 2; ++w) {
    h[w].resize(TestFixture::n_rows * widths[w]);
    for (std::size_t i = 0; i < h[w].size(); ++i) {
      h[w][i] = TestFixture::bf16_of(i / widths[w] == 9 ? 0.5F : normal(rng));
    }
    dh.push_back(this->upload(h[w], s.view()));
  }
  ch.begin_forward(s);
  for (std::size_t e = 0; e < 6; ++e) {
    ch.capture_reduced(fd::hook_id{static_cast<std::uint32_t>(e)}, dh[e / 3].data(), TestFixture::n_rows,
                       widths[e / 3], fd::reduce_input::bf16,
                       fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), rows.size()),
                       fd::reducer::topk(ks[e % 3]), s);
  }
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), 6U);
  for (std::size_t e = 0; e < 6; ++e) {
    const std::size_t w = e / 3;
    SCOPED_TRACE(::testing::Message() << "width " << widths[w] << " k " << ks[e % 3]);
    ASSERT_EQ(got.status[e], fd::entry_status::ok);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      ASSERT_NO_FATAL_FAILURE(TestFixture::expect_topk(got.bytes[e], j, ks[e % 3], widths[w], [&](std::uint64_t c) {
        return TestFixture::of_bf16(h[w][rows[j] * widths[w] + c]);
      }));
    }
  }
}

/// fp8_e4m3: the scale is amax / 448 (1 for a row of zeros), the codes decode to x / scale within e4m3's half ulp
/// (2^-4 relative, or 2^-10 absolute below the normals), the row's largest |x| to +-448, and the padding is zero.
TYPED_TEST_P(D2hReduceRows, Fp8CodesDecodeWithinHalfAnUlpOfTheScaledRow)
{
  using B = TypeParam;
  constexpr std::uint64_t width = 37;  // not a multiple of 4: 3 padding bytes
  std::mt19937_64 rng{5};
  std::vector<std::uint16_t> h(TestFixture::n_rows * width);
  std::normal_distribution<float> normal{0.0F, 3.0F};
  for (std::size_t i = 0; i < h.size(); ++i) { h[i] = TestFixture::bf16_of(i / width == 2 ? 0.0F : normal(rng)); }
  const std::vector<std::int32_t> rows{1, 2, 20};
  typename TestFixture::collected got;
  this->reduce_bf16_once(h, width, rows, fd::reducer::fp8_e4m3(), 1 << 20, got);
  ASSERT_EQ(got.status.size(), 1U);
  ASSERT_EQ(got.row_bytes[0], 4 + 40U);
  ASSERT_EQ(got.bytes[0].size(), rows.size() * 44U);
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const std::size_t base = j * 44;
    float amax = 0;
    for (std::uint64_t c = 0; c < width; ++c) { amax = std::max(amax, std::fabs(TestFixture::of_bf16(h[rows[j] * width + c]))); }
    const float scale = TestFixture::f32_at(got.bytes[0], base);
    EXPECT_EQ(scale, amax > 0 ? amax / 448.0F : 1.0F) << "row " << j;
    for (std::uint64_t c = 0; c < width; ++c) {
      const float x = TestFixture::of_bf16(h[rows[j] * width + c]) / scale;
      const float d = TestFixture::of_e4m3(got.bytes[0][base + 4 + c]);
      EXPECT_LE(std::fabs(d - x), std::max(std::fabs(x) / 16, 1.0F / 1024)) << "row " << j << " column " << c;
      if (std::fabs(x) == 448.0F) { EXPECT_EQ(std::fabs(d), 448.0F); }
    }
    for (std::uint64_t c = width; c < 40; ++c) { EXPECT_EQ(got.bytes[0][base + 4 + c], 0) << "padding " << c; }
  }
}

/// fp8_e4m3 against an oracle independent of the kernels' conversion (e4m3fn_of: torch's software rule on the host, the
/// hardware's cvt on sm_89+): every bf16 value of magnitude <= 448, each sign, in rows that start with 448 (so the
/// scale is exactly 1 and each code is the value's own rounding): the nearest finite e4m3 value, a tie to the even
/// code, the sign kept (-0 and negative values that round to zero: 0x80). 24 rows of 4096 (16-byte vectors on the GPU).
TYPED_TEST_P(D2hReduceRows, Fp8CodesRoundEveryBf16ValueToTheNearestEven)
{
  using B = TypeParam;
  constexpr std::uint64_t width = 4096;
  std::vector<std::uint16_t> h(TestFixture::n_rows * width, 0);
  std::vector<std::uint16_t> values;
  for (std::uint32_t u = 0; u <= 0x43e0U; ++u) {  // 0x43e0: 448
    values.push_back(static_cast<std::uint16_t>(u));
    values.push_back(static_cast<std::uint16_t>(u | 0x8000U));
  }
  for (std::size_t r = 0, k = 0; r < TestFixture::n_rows; ++r) {
    h[r * width] = TestFixture::bf16_of(448.0F);
    for (std::uint64_t c = 1; c < width && k < values.size(); ++c) { h[r * width + c] = values[k++]; }
  }
  ASSERT_LE(values.size(), TestFixture::n_rows * (width - 1));
  std::vector<std::int32_t> rows(TestFixture::n_rows);
  for (std::size_t r = 0; r < rows.size(); ++r) { rows[r] = static_cast<std::int32_t>(r); }
  typename TestFixture::collected got;
  this->reduce_bf16_once(h, width, rows, fd::reducer::fp8_e4m3(), 4 << 20, got);
  ASSERT_EQ(got.status.size(), 1U);
  ASSERT_EQ(got.status[0], fd::entry_status::ok);
  const std::size_t rec = 4 + width;
  std::vector<float> mag(0x7f);  // the finite e4m3 magnitudes, by code
  for (int c = 0; c < 0x7f; ++c) { mag[c] = TestFixture::of_e4m3(static_cast<std::uint8_t>(c)); }
  auto oracle = [&](float x) {  // the nearest finite e4m3 magnitude, ties to the even code, then the sign
    int best = 0;
    for (int c = 1; c < 0x7f; ++c) {
      const float d = std::fabs(mag[c] - std::fabs(x)), e = std::fabs(mag[best] - std::fabs(x));
      if (d < e || (d == e && (c & 1) == 0)) { best = c; }
    }
    return static_cast<std::uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
  };
  std::size_t checked = 0;
  for (std::size_t r = 0; r < TestFixture::n_rows; ++r) {
    ASSERT_EQ(TestFixture::f32_at(got.bytes[0], r * rec), 1.0F) << "row " << r;
    for (std::uint64_t c = 0; c < width; ++c, ++checked) {
      const float x = TestFixture::of_bf16(h[r * width + c]);
      ASSERT_EQ(got.bytes[0][r * rec + 4 + c], oracle(x)) << "row " << r << " column " << c << " x " << x;
    }
  }
  EXPECT_EQ(checked, TestFixture::n_rows * width);
}

/// mean over a window of each request and stats over every selected row: within 1e-5 relative of double sums
/// (f32 sums of at most 8 rows of N(0, 1)); the counts; max |x| exact. 300 columns: a mean record is several work
/// units of mean_chunk_cols (the last one partial).
TYPED_TEST_P(D2hReduceRows, MeanAndStatsMatchDoubleSums)
{
  using B = TypeParam;
  constexpr std::uint64_t width = 300;
  static_assert(width > 2 * fd::mean_chunk_cols && width % fd::mean_chunk_cols != 0);
  std::mt19937_64 rng{9};
  fb::stream<B> s{this->b};
  std::vector<float> f(TestFixture::n_rows * width);
  std::normal_distribution<float> normal;
  for (auto& x : f) { x = normal(rng); }
  auto df = this->upload(f, s.view());
  const std::vector<std::int32_t> qsl{0, 8, 11, 24};  // three requests of 8, 3 and 13 tokens
  auto dq = this->upload(qsl, s.view());
  const std::vector<std::int32_t> req{2, 0};
  auto dr = this->upload(req, s.view());
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(1 << 20), this->b, got.callback()};
  const auto win = fd::row_selection::window(static_cast<const std::int32_t*>(dq.data()), 3,
                                             static_cast<const std::int32_t*>(dr.data()), req.size(), 1, 7);
  ch.begin_forward(s);
  ch.capture_reduced(fd::hook_id{0}, df.data(), TestFixture::n_rows, width, fd::reduce_input::f32, win, fd::reducer::mean(), s);
  ch.capture_reduced(fd::hook_id{1}, df.data(), TestFixture::n_rows, width, fd::reduce_input::f32, win, fd::reducer::stats(), s);
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), 2U);
  ASSERT_EQ(got.status[0], fd::entry_status::ok);
  ASSERT_EQ(got.status[1], fd::entry_status::ok);
  ASSERT_EQ(got.bytes[0].size(), req.size() * (4 * width + 4));
  ASSERT_EQ(got.bytes[1].size(), 12 * width + 4);
  EXPECT_EQ(got.row_bytes[1], 0U);  // one record: a whole entry
  std::vector<std::int64_t> all;
  for (std::size_t i = 0; i < req.size(); ++i) {
    const std::size_t base = i * (4 * width + 4);
    for (std::uint64_t c = 0; c < width; ++c) {
      double sum = 0;
      for (int r = 1; r < 7; ++r) { sum += f[(qsl[req[i]] + r) * width + c]; }
      EXPECT_NEAR(TestFixture::f32_at(got.bytes[0], base + 4 * c), sum / 6, 1e-5) << "item " << i << " column " << c;
    }
    EXPECT_EQ(TestFixture::u32_at(got.bytes[0], base + 4 * width), 6U);
    for (int r = 1; r < 7; ++r) { all.push_back(qsl[req[i]] + r); }
  }
  for (std::uint64_t c = 0; c < width; ++c) {
    double sum = 0, sq = 0;
    float mx = 0;
    for (const auto r : all) { sum += f[r * width + c]; mx = std::max(mx, std::fabs(f[r * width + c])); }
    const double mean = sum / static_cast<double>(all.size());
    for (const auto r : all) { sq += (f[r * width + c] - mean) * (f[r * width + c] - mean); }
    EXPECT_NEAR(TestFixture::f32_at(got.bytes[1], 4 * c), mean, 1e-5) << "column " << c;
    EXPECT_NEAR(TestFixture::f32_at(got.bytes[1], 4 * (width + c)), sq, 1e-4 * (1 + sq)) << "column " << c;
    EXPECT_EQ(TestFixture::f32_at(got.bytes[1], 4 * (2 * width + c)), mx) << "column " << c;
  }
  EXPECT_EQ(TestFixture::u32_at(got.bytes[1], 12 * width), all.size());
}

/// The CPU refuses a bad k or width at the call (nothing reserved); an item only the GPU sees as invalid (a
/// window past its request) is a selection_error entry, counted, and the next entry is whole.
TYPED_TEST_P(D2hReduceRows, BadReducersAreRefusedAndBadItemsFlagged)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  auto src = this->upload(std::vector<float>(TestFixture::n_rows * 8, 1.0F), s.view());
  auto idx = this->upload(std::vector<std::int32_t>{1}, s.view());
  auto dq = this->upload(std::vector<std::int32_t>{0, 2}, s.view());
  auto dr = this->upload(std::vector<std::int32_t>{0}, s.view());
  const auto sel = fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), 1);
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(1 << 20), this->b, got.callback()};
  ch.begin_forward(s);
  auto expect_refused = [&](fd::reducer r, std::uint64_t width, const char* text) {
    try {
      ch.capture_reduced(fd::hook_id{1}, src.data(), TestFixture::n_rows, width, fd::reduce_input::f32, sel, r, s);
      ADD_FAILURE() << "expected a logic_error containing " << text;
    } catch (const ferry::logic_error& e) {
      EXPECT_NE(std::string{e.what()}.find(text), std::string::npos) << e.what();
    }
  };
  expect_refused(fd::reducer::topk(0), 8, "expected topk's k in [1, min(row width 8, 1024)], got 0");
  expect_refused(fd::reducer::topk(9), 8, "got 9");
  expect_refused(fd::reducer::topk(2000), 4000, "got 2000");
  expect_refused(fd::reducer::mean(), 0, "expected rows of 1 to 2^31 - 1 elements, got 0");
  expect_refused(fd::reducer{fd::reduce_op::mean, 3}, 8, "expected k = 0 for mean, got 3");
  EXPECT_EQ(ch.stats().entries_reserved, 0U);
  ch.capture_reduced(fd::hook_id{2}, src.data(), TestFixture::n_rows, 8, fd::reduce_input::f32,
                     fd::row_selection::window(static_cast<const std::int32_t*>(dq.data()), 1,
                                               static_cast<const std::int32_t*>(dr.data()), 1, 0, 3),
                     fd::reducer::mean(), s);  // the request has 2 tokens: the window [0, 3) is past it
  ch.capture_reduced(fd::hook_id{3}, src.data(), TestFixture::n_rows, 8, fd::reduce_input::f32, sel, fd::reducer::topk(2), s);
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), 2U);
  EXPECT_EQ(got.status[0], fd::entry_status::selection_error);
  EXPECT_EQ(got.status[1], fd::entry_status::ok);
  EXPECT_EQ(ch.stats().selection_errors, 1U);
}

/// An invalid item fails its entry whichever block reads it, and only its entry: a launch of at most reduce_threads
/// items is committed by block 0 after it checked every item (no join), so the bad item is put where another block
/// reads it (the 6th of 8 top-k rows, a mean's 2nd request); a larger launch (300 rows) joins its blocks at the
/// counter, the bad row its last. Each is beside its valid twin.
TYPED_TEST_P(D2hReduceRows, BadItemsFailTheirEntryWhicheverBlockReadsThem)
{
  using B = TypeParam;
  constexpr std::uint64_t width = 8, n = TestFixture::n_rows;
  fb::stream<B> s{this->b};
  std::vector<float> f(n * width);
  for (std::size_t i = 0; i < f.size(); ++i) { f[i] = static_cast<float>((i * 7919) % 1009); }
  auto src = this->upload(f, s.view());
  std::vector<std::int32_t> few(8), many(300);
  for (std::size_t j = 0; j < many.size(); ++j) { many[j] = static_cast<std::int32_t>((j * 5) % n); }
  std::copy_n(many.begin(), few.size(), few.begin());
  auto few_bad = few;
  few_bad[5] = static_cast<std::int32_t>(n);  // past the source
  auto many_bad = many;
  many_bad.back() = -1;
  auto d_few = this->upload(few, s.view()), d_few_bad = this->upload(few_bad, s.view());
  auto d_many = this->upload(many, s.view()), d_many_bad = this->upload(many_bad, s.view());
  auto dq = this->upload(std::vector<std::int32_t>{0, 10, 14}, s.view());  // request 1 has 4 tokens
  auto dr = this->upload(std::vector<std::int32_t>{0, 1}, s.view());
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(1 << 20), this->b, got.callback()};
  auto rows = [](const auto& d, std::size_t count) {
    return fd::row_selection::rows(static_cast<const std::int32_t*>(d.data()), count);
  };
  ch.begin_forward(s);
  for (const auto* d : {&d_few, &d_few_bad}) {
    ch.capture_reduced(fd::hook_id{0}, src.data(), n, width, fd::reduce_input::f32, rows(*d, few.size()),
                       fd::reducer::topk(1), s);
  }
  for (const auto* d : {&d_many, &d_many_bad}) {
    ch.capture_reduced(fd::hook_id{1}, src.data(), n, width, fd::reduce_input::f32, rows(*d, many.size()),
                       fd::reducer::topk(1), s);
  }
  for (const std::int32_t end : {4, 6}) {  // the window [0, 6) is past request 1
    ch.capture_reduced(fd::hook_id{2}, src.data(), n, width, fd::reduce_input::f32,
                       fd::row_selection::window(static_cast<const std::int32_t*>(dq.data()), 2,
                                                 static_cast<const std::int32_t*>(dr.data()), 2, 0, end),
                       fd::reducer::mean(), s);
  }
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), 6U);
  for (std::size_t e = 0; e < 6; e += 2) {
    EXPECT_EQ(got.status[e], fd::entry_status::ok) << "entry " << e;
    EXPECT_EQ(got.status[e + 1], fd::entry_status::selection_error) << "entry " << e + 1;
  }
  EXPECT_EQ(ch.stats().selection_errors, 3U);
  ASSERT_EQ(got.bytes[2].size(), many.size() * 8);
  for (std::size_t j = 0; j < many.size(); ++j) {
    TestFixture::expect_topk(got.bytes[2], j, 1, width, [&](std::uint64_t c) { return f[many[j] * width + c]; });
  }
  ASSERT_EQ(got.bytes[4].size(), 2 * (4 * width + 4));
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::uint64_t c = 0; c < width; ++c) {
      double sum = 0;
      for (std::size_t r = 0; r < 4; ++r) { sum += f[(10 * i + r) * width + c]; }
      EXPECT_NEAR(TestFixture::f32_at(got.bytes[4], i * (4 * width + 4) + 4 * c), sum / 4, 1e-3) << i << " " << c;
    }
  }
}

/// In a graph: the selection (rows and a device count) at fixed device addresses, rewritten before every replay;
/// the source rewritten too. Every replay's top-k entry holds that replay's rows' top-k, and its stats entry the
/// count of that replay's rows (planned or not: plan() without and with forward_meta::selected).
TYPED_TEST_P(D2hReduceRows, GraphReplaysReduceTheRowsOfTheirStep)
{
  using B = TypeParam;
  constexpr std::uint64_t width = 40, k = 3, replays = 12;
  std::mt19937_64 rng{13};
  fb::stream<B> s{this->b};
  fb::device_buffer<B> src{TestFixture::n_rows * width * 4, this->b};
  fb::device_buffer<B> idx{TestFixture::n_rows * 4, this->b};
  fb::device_buffer<B> count{4, this->b};
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(1 << 20), this->b, got.callback()};
  const auto sel = fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), 0)
                     .counted_on_device(static_cast<const std::int32_t*>(count.data()), TestFixture::n_rows);
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    ch.capture_reduced(fd::hook_id{1}, src.data(), TestFixture::n_rows, width, fd::reduce_input::f32, sel,
                       fd::reducer::topk(k), cs);
    ch.capture_reduced(fd::hook_id{2}, src.data(), TestFixture::n_rows, width, fd::reduce_input::f32, sel,
                       fd::reducer::stats(), cs);
    plan = ch.end_forward(cs);
  });
  std::vector<std::vector<float>> sources;
  std::vector<std::vector<std::int32_t>> selections;
  std::normal_distribution<float> normal;
  for (std::uint64_t r = 0; r < replays; ++r) {
    std::vector<float> f(TestFixture::n_rows * width);
    for (auto& x : f) { x = normal(rng); }
    const std::uint64_t n = r == 0 ? 0 : 1 + rng() % TestFixture::n_rows;
    std::vector<std::int32_t> rows(n);
    for (auto& x : rows) { x = static_cast<std::int32_t>(rng() % TestFixture::n_rows); }
    this->write(src, f, s.view());
    this->write(idx, rows, s.view());
    this->write(count, std::vector<std::int32_t>{static_cast<std::int32_t>(n)}, s.view());
    fd::forward_meta meta;
    if (r % 2 == 1) { meta.selected = n; }  // every other replay planned with its item count
    ch.plan(plan, s.view(), std::move(meta));
    g.launch(s.view());
    s.synchronize();  // the next step rewrites the source and the selection
    sources.push_back(std::move(f));
    selections.push_back(std::move(rows));
  }
  EXPECT_TRUE(wait_until<B>([&] { return got.size() == 2 * replays; }, 10s));
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), 2 * replays);
  for (std::uint64_t r = 0; r < replays; ++r) {
    SCOPED_TRACE(::testing::Message() << "replay " << r);
    const auto& top = got.bytes[2 * r];
    const auto& st = got.bytes[2 * r + 1];
    ASSERT_EQ(got.status[2 * r], fd::entry_status::ok);
    ASSERT_EQ(got.status[2 * r + 1], fd::entry_status::ok);
    ASSERT_EQ(top.size(), selections[r].size() * 8 * k);
    for (std::size_t j = 0; j < selections[r].size(); ++j) {
      std::vector<float> row(sources[r].begin() + selections[r][j] * width,
                             sources[r].begin() + (selections[r][j] + 1) * width);
      std::sort(row.begin(), row.end(), std::greater<>{});
      for (std::uint64_t i = 0; i < k; ++i) { EXPECT_EQ(TestFixture::f32_at(top, j * 8 * k + 4 * i), row[i]); }
    }
    ASSERT_EQ(st.size(), 12 * width + 4);
    EXPECT_EQ(TestFixture::u32_at(st, 12 * width), selections[r].size());
  }
}

/// A mean over windows longer than a block's row groups take in one batch of loads (kernels/detail/reduce_shared.cuh:
/// mean_batch rows a group, at most 32 groups): two requests' windows of 600 rows within 1e-5 of double sums;
/// 130 f32 columns, so that every other row is not 16-byte aligned (the GPU's element loads). Then the same window
/// over a request of 450 tokens, which it does not fit: a selection_error entry, nothing written for it, and the
/// valid entry after it whole.
TYPED_TEST_P(D2hReduceRows, MeanOverWindowsLongerThanATileTakesEveryTile)
{
  using B = TypeParam;
  constexpr std::uint64_t width = 130, n = 1300;
  std::mt19937_64 rng{21};
  fb::stream<B> s{this->b};
  std::vector<float> f(n * width);
  std::normal_distribution<float> normal;
  for (auto& x : f) { x = normal(rng); }
  auto df = this->upload(f, s.view());
  const std::vector<std::int32_t> qsl{0, 650, 1300}, short_qsl{0, 650, 1100};
  auto dq = this->upload(qsl, s.view());
  auto dq_short = this->upload(short_qsl, s.view());
  auto dr = this->upload(std::vector<std::int32_t>{1, 0}, s.view());
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(4 << 20), this->b, got.callback()};
  auto window = [&](const void* q) {
    return fd::row_selection::window(static_cast<const std::int32_t*>(q), 2, static_cast<const std::int32_t*>(dr.data()),
                                     2, 10, 610);
  };
  ch.begin_forward(s);
  ch.capture_reduced(fd::hook_id{0}, df.data(), n, width, fd::reduce_input::f32, window(dq.data()), fd::reducer::mean(), s);
  ch.capture_reduced(fd::hook_id{1}, df.data(), n, width, fd::reduce_input::f32, window(dq_short.data()),
                     fd::reducer::mean(), s);  // request 1 has 450 tokens: rows 440.. of its window are past it
  ch.capture_reduced(fd::hook_id{2}, df.data(), n, width, fd::reduce_input::f32, window(dq.data()), fd::reducer::mean(), s);
  (void)ch.end_forward(s);
  s.synchronize();
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), 3U);
  EXPECT_EQ(got.status[1], fd::entry_status::selection_error);
  EXPECT_EQ(ch.stats().selection_errors, 1U);
  for (const std::size_t e : {0U, 2U}) {
    ASSERT_EQ(got.status[e], fd::entry_status::ok) << "entry " << e;
    ASSERT_EQ(got.bytes[e].size(), 2 * (4 * width + 4));
    for (std::size_t i = 0; i < 2; ++i) {
      const std::size_t base = i * (4 * width + 4), first = i == 0 ? 650 : 0;  // requests 1, then 0
      for (std::uint64_t c = 0; c < width; ++c) {
        double sum = 0;
        for (std::size_t r = 10; r < 610; ++r) { sum += f[(first + r) * width + c]; }
        EXPECT_NEAR(TestFixture::f32_at(got.bytes[e], base + 4 * c), sum / 600, 1e-5)
          << "entry " << e << " item " << i << " column " << c;
      }
      EXPECT_EQ(TestFixture::u32_at(got.bytes[e], base + 4 * width), 600U);
    }
  }
}

/// capture_reduced_deferred: in a graph, three hooks of different widths reduced as one batch (fp8, then top-3: one
/// reduce_rows_publish each), each beside the same hooks through capture_reduced (one reduce_rows each); every
/// replay's deferred entries hold the same bytes as their one-launch twins, planned or not (plan() without and
/// with forward_meta::selected), and a reducer without a record per row is refused at the call.
TYPED_TEST_P(D2hReduceRows, DeferredBatchesHoldWhatOneLaunchPerEntryHolds)
{
  using B = TypeParam;
  constexpr std::uint64_t replays = 6, hooks = 3;
  constexpr std::uint64_t widths[hooks] = {40, 300, 7};
  std::mt19937_64 rng{17};
  fb::stream<B> s{this->b};
  std::vector<fb::device_buffer<B>> src;
  for (const auto w : widths) { src.emplace_back(TestFixture::n_rows * w * 4, this->b); }
  fb::device_buffer<B> idx{TestFixture::n_rows * 4, this->b};
  fb::device_buffer<B> count{4, this->b};
  typename TestFixture::collected got;
  fd::channel<B> ch{this->rows_config(1 << 22), this->b, got.callback()};
  const auto sel = fd::row_selection::rows(static_cast<const std::int32_t*>(idx.data()), 0)
                     .counted_on_device(static_cast<const std::int32_t*>(count.data()), TestFixture::n_rows);
  const fd::reducer reducers[2] = {fd::reducer::fp8_e4m3(), fd::reducer::topk(3)};
  fd::forward_plan plan;
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    ch.begin_forward(cs);
    std::uint32_t hook = 0;
    for (const auto& r : reducers) {
      for (std::uint64_t h = 0; h < hooks; ++h) {  // hooks 0-2 (fp8), 6-8 (top-3): one batch each
        ch.capture_reduced_deferred(fd::hook_id{hook++}, src[h].data(), TestFixture::n_rows, widths[h],
                                    fd::reduce_input::f32, sel, r, cs);
      }
      for (std::uint64_t h = 0; h < hooks; ++h) {  // hooks 3-5, 9-11: their twins, one launch each
        ch.capture_reduced(fd::hook_id{hook++}, src[h].data(), TestFixture::n_rows, widths[h], fd::reduce_input::f32,
                           sel, r, cs);
      }
    }
    EXPECT_THROW(ch.capture_reduced_deferred(fd::hook_id{99}, src[0].data(), TestFixture::n_rows, widths[0],
                                             fd::reduce_input::f32, sel, fd::reducer::mean(), cs),
                 ferry::logic_error);
    plan = ch.end_forward(cs);
  });
  std::normal_distribution<float> normal;
  std::vector<std::uint64_t> counts;
  for (std::uint64_t r = 0; r < replays; ++r) {
    for (std::uint64_t h = 0; h < hooks; ++h) {
      std::vector<float> f(TestFixture::n_rows * widths[h]);
      for (auto& x : f) { x = normal(rng); }
      this->write(src[h], f, s.view());
    }
    const std::uint64_t n = r == 0 ? 0 : 1 + rng() % TestFixture::n_rows;
    std::vector<std::int32_t> rows(n);
    for (auto& x : rows) { x = static_cast<std::int32_t>(rng() % TestFixture::n_rows); }
    this->write(idx, rows, s.view());
    this->write(count, std::vector<std::int32_t>{static_cast<std::int32_t>(n)}, s.view());
    fd::forward_meta meta;
    if (r % 2 == 1) { meta.selected = n; }
    ch.plan(plan, s.view(), std::move(meta));
    g.launch(s.view());
    s.synchronize();  // the next replay rewrites the sources and the selection
    counts.push_back(n);
  }
  constexpr std::uint64_t per = 4 * hooks;
  EXPECT_TRUE(wait_until<B>([&] { return got.size() == per * replays; }, 10s));
  EXPECT_NO_THROW((void)ch.close(10s));
  ASSERT_EQ(got.status.size(), per * replays);
  for (std::uint64_t r = 0; r < replays; ++r) {
    for (std::uint64_t k = 0; k < 2; ++k) {
      for (std::uint64_t h = 0; h < hooks; ++h) {
        SCOPED_TRACE(::testing::Message() << "replay " << r << " reducer " << k << " hook " << h);
        const std::size_t d = r * per + k * 2 * hooks + h, one = d + hooks;
        ASSERT_EQ(got.status[d], fd::entry_status::ok);
        ASSERT_EQ(got.status[one], fd::entry_status::ok);
        EXPECT_EQ(got.bytes[d].size(), counts[r] * fd::record_bytes(reducers[k], widths[h]));
        EXPECT_TRUE(got.bytes[d] == got.bytes[one]) << "the deferred records differ from capture_reduced's";
      }
    }
  }
}

REGISTER_TYPED_TEST_SUITE_P(D2hReduceRows, TopkIsTheSortedPrefixWithTiesByLowerIndex,
                            TopkTiesBeyondTheSharedBufferTakeTheLowestIndices,
                            TopkOfWideRowsFiltersByGroupMaximaElseSelects,
                            Fp8CodesDecodeWithinHalfAnUlpOfTheScaledRow,
                            Fp8CodesRoundEveryBf16ValueToTheNearestEven, MeanAndStatsMatchDoubleSums,
                            BadReducersAreRefusedAndBadItemsFlagged, BadItemsFailTheirEntryWhicheverBlockReadsThem,
                            GraphReplaysReduceTheRowsOfTheirStep,
                            MeanOverWindowsLongerThanATileTakesEveryTile,
                            DeferredBatchesHoldWhatOneLaunchPerEntryHolds);

}  // namespace ferry::test
