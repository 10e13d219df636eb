// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hGraph, over backends (host and faulty<host> in CI, cuda on the H200).
// Graph mode: captured forwards replayed with plan().
#pragma once

#include "d2h/fixture.hpp"

namespace ferry::test {

template <class B>
class D2hGraph : public d2h_fixture<B> {};
TYPED_TEST_SUITE_P(D2hGraph);

TYPED_TEST_P(D2hGraph, GraphReplaysLandInTheRightPlaceAcrossWrap)
{
  using B = TypeParam;
  for (auto [k, branch] : {std::pair{2U, false}, std::pair{16U, false}, std::pair{2U, true}}) {
    fb::stream<B> s{this->b};
    const std::vector<std::uint64_t> sizes{1000, 48, 4096, 333, 2048};
    constexpr std::uint64_t stride = 4096, replays = 24;
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
    checker chk;
    auto cfg = this->small_config(13 << 10, k);  // not a multiple of the forward: wraps move around
    cfg.branch_publish = branch;
    fd::channel<B> ch{cfg, this->b, chk.callback()};
    fd::forward_plan plan;
    auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      ch.begin_forward(cs);
      for (std::uint64_t j = 0; j < n; ++j) {
        ch.capture(fd::hook_id{static_cast<std::uint32_t>(100 + j)},
                   static_cast<const std::byte*>(dsrc.data()) + j * stride, sizes[j], cs);
      }
      plan = ch.end_forward(cs);
    });
    ASSERT_EQ(plan.size(), n);
    for (std::uint64_t r = 0; r < replays; ++r) {
      for (std::uint64_t j = 0; j < n; ++j) { chk.expect(r * n + j, static_cast<std::uint32_t>(100 + j), sizes[j]); }
      // New payloads for this replay, in stream order after the previous replay's copies.
      this->b.memcpy_async(dsrc.data(), h + r * n * stride, n * stride, fb::memcpy_kind::host_to_device, s.handle());
      ch.replay(g, plan, s);
    }
    EXPECT_TRUE(ch.close().clean());
    EXPECT_EQ(chk.got, replays * n) << "K " << k;
    EXPECT_EQ(chk.bad_entries, 0U) << "K " << k;
    EXPECT_EQ(chk.bad_meta, 0U) << "K " << k;
  }
}

REGISTER_TYPED_TEST_SUITE_P(D2hGraph, GraphReplaysLandInTheRightPlaceAcrossWrap);

}  // namespace ferry::test
