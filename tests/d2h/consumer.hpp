// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hConsumer, over backends (host and faulty<host> in CI, cuda on the H200): what a
// consumer gets besides entry views one by one: the channel's hook schema and typed views of its entries
// (typed_view.hpp: dtype, [rows, *row_shape], no copy; the refusals), and the batch pop (try_pop(out, max)).
#pragma once

#include "d2h/fixture.hpp"

#include <ferry/d2h/typed_view.hpp>

#include <cstring>
#include <vector>

namespace ferry::test {

template <class B>
class D2hConsumer : public d2h_fixture<B> {
 protected:
  /// `bytes` of host data in device memory (synchronized).
  fb::device_buffer<B> upload(fb::stream_view<B> s, const void* host, std::size_t bytes)
  {
    fb::device_buffer<B> d{bytes, this->b};
    fb::pinned_buffer<B> h{bytes, this->b};
    std::memcpy(h.data(), host, bytes);
    this->b.memcpy_async(d.data(), h.data(), bytes, fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
    return d;
  }
  /// Pops `n` entries (waiting for the drain thread).
  static std::vector<fd::entry_view> pop(fd::channel<B>& ch, std::size_t n)
  {
    std::vector<fd::entry_view> out;
    EXPECT_TRUE(wait_until<B>([&] {
      (void)ch.try_pop(out, n - out.size());
      return out.size() == n;
    })) << "got " << out.size() << " of " << n << " entries";
    return out;
  }
};
TYPED_TEST_SUITE_P(D2hConsumer);

/// A user's bfloat16 (no dtype of its own: as<T>() checks its size only).
struct bf16_bits {
  std::uint16_t bits;
};

/// Entries of declared hooks are the tensors the schema says, over the staging (no copy): f32 [3, 4] from a
/// whole capture, bf16 [2, 2, 3], i64 [5] (one element per row); the wrong element type, an undeclared hook and
/// a size that is not whole rows are refused naming the hook, expected vs got.
TYPED_TEST_P(D2hConsumer, SchemaTypesEntriesWithoutACopy)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  std::vector<float> f(12);
  for (std::size_t i = 0; i < f.size(); ++i) { f[i] = 0.5F * static_cast<float>(i) - 2.0F; }
  std::vector<std::uint16_t> h(12);
  for (std::size_t i = 0; i < h.size(); ++i) { h[i] = static_cast<std::uint16_t>(0x3f80 + i); }  // bf16 bits
  std::vector<std::int64_t> t{7, -1, 1LL << 40, 0, 3};
  auto df = this->upload(s, f.data(), f.size() * 4);
  auto dh = this->upload(s, h.data(), h.size() * 2);
  auto dt = this->upload(s, t.data(), t.size() * 8);
  fd::hook_schema schema;
  schema.add(fd::hook_id{0}, "layers.0.mlp", fd::dtype::f32, {4})
    .add(fd::hook_id{1}, "layers.0.q", fd::dtype::bf16, {2, 3})
    .add(fd::hook_id{2}, "token_ids", fd::dtype::i64);
  fd::channel<B> ch{this->small_config(1 << 20, 4), this->b, {}, {}, schema};
  ASSERT_EQ(ch.schema()->size(), 3U);
  EXPECT_EQ(ch.schema()->find(fd::hook_id{1})->name, "layers.0.q");
  ch.begin_forward(s);
  ch.capture(fd::hook_id{0}, df.data(), 48, s);
  ch.capture(fd::hook_id{1}, dh.data(), 24, s);
  ch.capture(fd::hook_id{2}, dt.data(), 40, s);
  ch.capture(fd::hook_id{9}, df.data(), 16, s);  // not declared
  ch.capture(fd::hook_id{0}, df.data(), 12, s);  // not a whole row of 16 bytes
  (void)ch.end_forward(s);
  auto got = this->pop(ch, 5);
  ASSERT_EQ(got.size(), 5U);

  const fd::typed_view a = fd::typed(*ch.schema(), got[0]);
  EXPECT_EQ(a.name(), "layers.0.mlp");
  EXPECT_EQ(a.type(), fd::dtype::f32);
  EXPECT_EQ(a.shape(), (std::vector<std::uint64_t>{3, 4}));
  EXPECT_EQ(a.bytes().data(), got[0].bytes().data()) << "a view of the staging, not a copy";
  const auto fa = a.as<float>();
  EXPECT_EQ(std::vector<float>(fa.begin(), fa.end()), f);
  EXPECT_THROW((void)a.as<double>(), ferry::logic_error);
  EXPECT_THROW((void)a.as<std::int32_t>(), ferry::logic_error) << "same size, another dtype";

  const fd::typed_view q = fd::typed(*ch.schema(), got[1]);
  EXPECT_EQ(q.shape(), (std::vector<std::uint64_t>{2, 2, 3}));
  EXPECT_EQ(q.elements(), 12U);
  const auto bq = q.as<bf16_bits>();
  for (std::size_t i = 0; i < h.size(); ++i) { EXPECT_EQ(bq[i].bits, h[i]); }
  EXPECT_THROW((void)q.as<float>(), ferry::logic_error);

  const fd::typed_view ids = fd::typed(*ch.schema(), got[2]);
  EXPECT_EQ(ids.shape(), (std::vector<std::uint64_t>{5}));
  const auto ti = ids.as<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(ti.begin(), ti.end()), t);

  try {
    (void)fd::typed(*ch.schema(), got[3]);
    ADD_FAILURE() << "an undeclared hook must be refused";
  } catch (const fd::entry_shape_error& e) {
    EXPECT_EQ(e.hook().value, 9U);
    EXPECT_EQ(e.row_bytes(), 0U);
    EXPECT_NE(std::string{e.what()}.find("hook 9"), std::string::npos) << e.what();
  }
  try {
    (void)fd::typed(*ch.schema(), got[4]);
    ADD_FAILURE() << "a size that is not whole rows must be refused";
  } catch (const fd::entry_shape_error& e) {
    EXPECT_EQ(e.hook().value, 0U);
    EXPECT_EQ(e.size(), 12U);
    EXPECT_EQ(e.row_bytes(), 16U);
    EXPECT_NE(std::string{e.what()}.find("\"layers.0.mlp\": expected a multiple of its row bytes 16"), std::string::npos)
      << e.what();
  }
  got[0].release();
  EXPECT_THROW((void)fd::typed(*ch.schema(), got[0]), ferry::logic_error) << "a released view";
  got.clear();
  (void)ch.close();
  EXPECT_EQ(ch.schema()->size(), 3U) << "the schema outlives close()";
  fd::channel<B> plain{this->small_config(1 << 20, 4), this->b};
  EXPECT_TRUE(plain.schema() != nullptr && plain.schema()->empty());
  (void)plain.close();
}

/// Every entry sits in the staging at its ring alignment (16 bytes): a run that ends with an entry of an odd size
/// (13 bytes) does not shift the next run, so a typed view's as<double>() takes the next entry (a staging region
/// placed right after the 13 bytes would be refused: "expected bytes aligned to 8").
TYPED_TEST_P(D2hConsumer, EveryEntrySitsInStagingAlignedAsInTheRing)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  const std::vector<double> d{1.5, -2.25, 1e300};
  std::vector<std::uint8_t> odd(13, 0x5a);
  auto dd = this->upload(s, d.data(), d.size() * 8);
  auto dodd = this->upload(s, odd.data(), odd.size());
  fd::hook_schema schema;
  schema.add(fd::hook_id{0}, "odd", fd::dtype::u8).add(fd::hook_id{1}, "values", fd::dtype::f64);
  fd::channel<B> ch{this->small_config(1 << 16, 1), this->b, {}, {}, schema};
  std::vector<fd::entry_view> held;  // held: the staging's head moves on past each region
  for (int f = 0; f < 4; ++f) {
    ch.begin_forward(s);
    ch.capture(fd::hook_id{0}, dodd.data(), odd.size(), s);  // a run of its own: 13 bytes
    (void)ch.end_forward(s);
    for (auto& v : this->pop(ch, 1)) { held.push_back(std::move(v)); }
    ch.begin_forward(s);
    ch.capture(fd::hook_id{1}, dd.data(), d.size() * 8, s);
    (void)ch.end_forward(s);
    for (auto& v : this->pop(ch, 1)) { held.push_back(std::move(v)); }
  }
  ASSERT_EQ(held.size(), 8U);
  const auto* base = held.front().bytes().data();
  for (std::size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(held[i].bytes().data() - base) % fd::entry_alignment, 0U) << "entry " << i;
    if (i % 2 == 1) {
      const fd::typed_view t = fd::typed(*ch.schema(), held[i]);
      const auto x = t.as<double>();
      EXPECT_EQ(std::vector<double>(x.begin(), x.end()), d) << "entry " << i;
    }
  }
  held.clear();
  (void)ch.close();
}

/// try_pop(out, max) moves up to max completed entries, in order, to the end of `out`; their staging goes back
/// when the views are released (here: all at once), and the next forward reuses it.
TYPED_TEST_P(D2hConsumer, TryPopBatchTakesEntriesInOrder)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  constexpr std::uint64_t n = 20, size = 4096;
  sources<B> src{this->b, s, 0, 2 * n, size};
  auto cfg = this->small_config(n * size, 4);
  cfg.staging_bytes = n * size;  // one forward fills the staging: the second needs the first's released
  fd::channel<B> ch{cfg, this->b};
  for (std::uint64_t f = 0; f < 2; ++f) {
    ch.begin_forward(s);
    for (std::uint64_t i = 0; i < n; ++i) { ch.capture(fd::hook_id{3}, src.at(f * n + i), size, s); }
    (void)ch.end_forward(s);
    std::vector<fd::entry_view> out;
    ASSERT_TRUE(wait_until<B>([&] { return ch.stats().entries_drained == (f + 1) * n; }));
    EXPECT_EQ(ch.try_pop(out, 8), 8U);
    EXPECT_EQ(ch.try_pop(out, 100), n - 8) << "what is left, appended";
    EXPECT_EQ(ch.try_pop(out, 100), 0U);
    ASSERT_EQ(out.size(), n);
    for (std::uint64_t i = 0; i < n; ++i) {
      EXPECT_EQ(out[i].seq().value, f * n + i);
      const auto bytes = out[i].bytes();
      bool exact = bytes.size() == size;
      for (std::uint64_t k = 0; exact && k < size; ++k) {
        exact = static_cast<std::uint8_t>(bytes[k]) == ferry::testing::pattern_byte(f * n + i, k);
      }
      EXPECT_TRUE(exact) << "entry " << f * n + i;
    }
    out.clear();  // every view released at once
  }
  const auto rep = ch.close();
  EXPECT_TRUE(rep.clean());
  EXPECT_EQ(rep.delivered, 2 * n);
}

REGISTER_TYPED_TEST_SUITE_P(D2hConsumer, SchemaTypesEntriesWithoutACopy, EveryEntrySitsInStagingAlignedAsInTheRing,
                            TryPopBatchTakesEntriesInOrder);

}  // namespace ferry::test
