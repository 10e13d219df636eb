// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hMultiChannel: any number of channels on one device, each independent (own ring,
// state block, published_head, drain stream and thread). Two channels on one device interleave forwards on
// two streams, eager and graph; each channel's payloads carry their own pattern (checker::pattern_base), so
// an entry read from the other channel's ring, or released by the other channel's head, is caught.
#pragma once

#include "d2h/fixture.hpp"

namespace ferry::test {

template <class B>
class D2hMultiChannel : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hMultiChannel);

// Eager: one producer thread alternates hooks between the two channels inside overlapping forwards, with
// random sizes across wraps; releases inline on one channel and on the branch on the other, then swapped.
TYPED_TEST_P(D2hMultiChannel, TwoChannelsOnOneDeviceInterleaveEager)
{
  using B = TypeParam;
  constexpr std::uint64_t n = 160, stride = 2048, base1 = 1'000'000;
  for (const bool branch : {false, true}) {
    fb::stream<B> s0{this->b};
    fb::stream<B> s1{this->b};
    sources<B> src0{this->b, s0, 0, n, stride};
    sources<B> src1{this->b, s1, base1, n, stride};
    checker chk0;
    checker chk1;
    chk1.pattern_base = base1;
    auto cfg0 = this->small_config(16 << 10, 3);
    cfg0.tuning.branch_publish = branch;
    auto cfg1 = this->small_config(12 << 10, 5);
    cfg1.tuning.branch_publish = !branch;
    cfg1.tuning.head_memory = fd::head_memory::pinned_mapped;
    std::mt19937_64 rng{branch ? 7U : 11U};
    {
      fd::channel<B> ch0{cfg0, this->b, chk0.callback()};
      fd::channel<B> ch1{cfg1, this->b, chk1.callback()};
      EXPECT_EQ(ch0.device(), ch1.device());
      std::uint64_t q0 = 0, q1 = 0;
      while (q0 < n || q1 < n) {
        ch0.begin_forward(s0);
        ch1.begin_forward(s1);
        const std::uint64_t in_fwd = 1 + rng() % 9;
        for (std::uint64_t j = 0; j < in_fwd; ++j) {
          if (q0 < n) {
            const std::uint64_t size = 1 + rng() % stride;
            chk0.expect(q0, 10, size);
            ch0.capture(fd::hook_id{10}, src0.at(q0), size, s0);
            ++q0;
          }
          if (q1 < n) {
            const std::uint64_t size = 1 + rng() % stride;
            chk1.expect(q1, 11, size);
            ch1.capture(fd::hook_id{11}, src1.at(q1), size, s1);
            ++q1;
          }
        }
        (void)ch1.end_forward(s1);
        (void)ch0.end_forward(s0);
      }
      EXPECT_TRUE(ch0.close().clean());
      EXPECT_TRUE(ch1.close().clean());
      EXPECT_EQ(ch0.stats().entries_published, n);
      EXPECT_EQ(ch1.stats().entries_published, n);
    }
    for (const checker* c : {&chk0, &chk1}) {
      EXPECT_EQ(c->got, n) << "branch " << branch;
      EXPECT_EQ(c->bad_entries, 0U) << "branch " << branch << ": " << c->first_bad;
      EXPECT_EQ(c->bad_meta, 0U) << "branch " << branch << ": " << c->first_bad;
      EXPECT_EQ(c->out_of_order, 0U) << "branch " << branch;
    }
  }
}

// Graph: each channel captures one forward on its own stream (odd and even entry counts); the replays
// (plan + launch) alternate between the channels, each with new payloads, across wraps of both rings.
TYPED_TEST_P(D2hMultiChannel, TwoChannelsOnOneDeviceInterleaveGraph)
{
  using B = TypeParam;
  constexpr std::uint64_t stride = 4096, replays = 20;
  const std::vector<std::uint64_t> sizes[2] = {{1000, 48, 4096, 333, 2048}, {512, 3000, 16, 777}};
  const std::uint64_t base[2] = {0, 1'000'000};
  fb::stream<B> s[2] = {fb::stream<B>{this->b}, fb::stream<B>{this->b}};
  checker chk[2];
  std::vector<fb::device_buffer<B>> dsrc;
  std::vector<fb::pinned_buffer<B>> all;
  for (int c = 0; c < 2; ++c) {
    const std::uint64_t n = sizes[c].size();
    chk[c].pattern_base = base[c];
    dsrc.emplace_back(n * stride, this->b);
    all.emplace_back(replays * n * stride, this->b);
    auto* h = static_cast<std::uint8_t*>(all.back().data());
    for (std::uint64_t q = 0; q < replays * n; ++q) {
      for (std::uint64_t i = 0; i < stride; ++i) { h[q * stride + i] = ferry::testing::pattern_byte(base[c] + q, i); }
    }
  }
  auto cfg0 = this->small_config(13 << 10, 2);  // branch releases (the default)
  auto cfg1 = this->small_config(11 << 10, 16);
  cfg1.tuning.branch_publish = false;
  {
    fd::channel<B> ch[2] = {fd::channel<B>{cfg0, this->b, chk[0].callback()},
                            fd::channel<B>{cfg1, this->b, chk[1].callback()}};
    fd::forward_plan plan[2];
    std::vector<fb::graph_exec<B>> g;
    for (int c = 0; c < 2; ++c) {
      g.push_back(fb::graph_exec<B>::capture(s[c].view(), [&](fb::stream_view<B> cs) {
        ch[c].begin_forward(cs);
        for (std::uint64_t j = 0; j < sizes[c].size(); ++j) {
          ch[c].capture(fd::hook_id{static_cast<std::uint32_t>(100 * (c + 1) + j)},
                        static_cast<const std::byte*>(dsrc[c].data()) + j * stride, sizes[c][j], cs);
        }
        plan[c] = ch[c].end_forward(cs);
      }));
      ASSERT_EQ(plan[c].size(), sizes[c].size());
    }
    for (std::uint64_t r = 0; r < replays; ++r) {
      for (int c = 0; c < 2; ++c) {
        const std::uint64_t n = sizes[c].size();
        for (std::uint64_t j = 0; j < n; ++j) {
          chk[c].expect(r * n + j, static_cast<std::uint32_t>(100 * (c + 1) + j), sizes[c][j]);
        }
        // New payloads for this replay, in stream order after the previous replay's copies.
        this->b.memcpy_async(dsrc[c].data(), static_cast<const std::byte*>(all[c].data()) + r * n * stride, n * stride,
                             fb::memcpy_kind::host_to_device, s[c].handle());
        ch[c].replay(g[c], plan[c], s[c]);
      }
    }
    EXPECT_TRUE(ch[0].close().clean());
    EXPECT_TRUE(ch[1].close().clean());
  }
  for (int c = 0; c < 2; ++c) {
    EXPECT_EQ(chk[c].got, replays * sizes[c].size()) << "channel " << c;
    EXPECT_EQ(chk[c].bad_entries, 0U) << "channel " << c << ": " << chk[c].first_bad;
    EXPECT_EQ(chk[c].bad_meta, 0U) << "channel " << c << ": " << chk[c].first_bad;
    EXPECT_EQ(chk[c].out_of_order, 0U) << "channel " << c;
  }
}

REGISTER_TYPED_TEST_SUITE_P(D2hMultiChannel, TwoChannelsOnOneDeviceInterleaveEager,
                            TwoChannelsOnOneDeviceInterleaveGraph);

}  // namespace ferry::test
