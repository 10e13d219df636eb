// SPDX-License-Identifier: Apache-2.0
// H2D typed suite H2dGraph: graph padding, first consumers in a replayed graph, captured uploads replayed
// with staged counts, a captured direct upload's baked counts.
// Instantiated in h2d_host_test.cpp (host) and h2d_cuda_test.cpp (cuda).
#pragma once

#include "h2d/fixture.hpp"

namespace ferry::test::h2d {

template <class B>
class H2dGraph : public h2d_fixture<B> {};
TYPED_TEST_SUITE_P(H2dGraph);

TYPED_TEST_P(H2dGraph, GraphPaddingIsPublished)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  // 5 real requests padded to the captured graph batch of 8: padding rows are producer data too.
  auto s = pub.begin(0);
  {
    auto p = pub.producer("step");
    auto ids = p.template source<std::int32_t>(m.ids);
    for (int i = 0; i < 8; ++i) { ids[static_cast<std::size_t>(i)] = i < 5 ? 1000 + i : -1; }
    auto pos = p.template source<std::int64_t>(m.positions);
    for (int i = 0; i < 8; ++i) { pos[static_cast<std::size_t>(i)] = i < 5 ? 77 * i : 0; }
    p.set_count(m.ids, 8);
    p.set_count(m.positions, 8);
    p.set_count(m.bf16, 0);
    p.set_count(m.mask, 0);
    p.set_count(m.table, 0);
  }
  pub.publish("step", this->owner->view());
  s.finish();
  this->owner->synchronize();
  auto ids = this->read_back(pub.device_pointer(m.ids), 8 * 4);
  auto pos = this->read_back(pub.device_pointer(m.positions), 8 * 8);
  for (int i = 0; i < 8; ++i) {
    std::int32_t v;
    std::memcpy(&v, ids.data() + 4 * i, 4);
    EXPECT_EQ(v, i < 5 ? 1000 + i : -1);
    std::int64_t w;
    std::memcpy(&w, pos.data() + 8 * i, 8);
    EXPECT_EQ(w, i < 5 ? 77 * i : 0);
  }
  auto tail = this->read_back(pub.device_pointer(m.ids), 64 * 4);
  for (std::size_t i = 8 * 4; i < tail.size(); ++i) { ASSERT_EQ(tail[i], poison) << i; }
}

TYPED_TEST_P(H2dGraph, FirstConsumerInGraphReplayReadsPublishedValues)
{
  using B = TypeParam;
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct,
                 fh::upload_backend::automatic}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    // The consumer graph (captured once): copies every destination into a result buffer on the device.
    const fh::buffer_handle all[] = {m.ids, m.positions, m.bf16, m.mask, m.table};
    std::size_t total = 0;
    for (auto h : all) { total += pub.capacity_bytes(h); }
    fb::device_buffer<B> result{total, this->b};
    auto g = fb::graph_exec<B>::capture(this->owner->view(), [&](fb::stream_view<B> s) {
      std::size_t off = 0;
      for (auto h : all) {
        this->b.memcpy_async(result.template as<unsigned char>() + off, pub.device_pointer(h), pub.capacity_bytes(h),
                             fb::memcpy_kind::device_to_device, s.handle());
        off += pub.capacity_bytes(h);
      }
    });
    for (std::size_t step = 0; step < 6; ++step) {
      auto s = pub.begin(step % 2);
      const std::size_t n = 1 + step * 11;
      this->produce(pub, "step", &md, {{m.ids, n}, {m.positions, n}, {m.bf16, 2 * n}, {m.mask, n}, {m.table, 4 * n}},
                    300 + step);
      pub.publish("step", this->owner->view());  // before replay, on the consumer stream
      g.launch(this->owner->view());
      s.finish();
      this->owner->synchronize();
      const auto got = this->read_back(result.data(), total);
      std::size_t off = 0;
      for (auto h : all) {
        const auto& want = md.bytes[h.value];
        ASSERT_EQ(0, std::memcmp(got.data() + off, want.data(), want.size())) << "step " << step << " buffer " << h.value;
        off += want.size();
      }
    }
  }
}

TYPED_TEST_P(H2dGraph, CapturedUploadReplaysWithStagedCounts)
{
  using B = TypeParam;
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    auto graphs = this->step_graphs(pub);
    // batch is never capturable
    for (std::size_t step = 0; step < 6; ++step) {
      auto s = pub.begin(step % 2);
      const std::size_t n = (step * 23) % 64;
      this->produce(pub, "step", &md, this->step_counts(m, n),
                    700 + step);
      pub.stage("step");
      EXPECT_THROW(pub.publish("step", this->owner->view()), ferry::logic_error);
      graphs[step % 2].launch(this->owner->view());
      s.finish();
      this->expect_model(pub, md, "graph replay");
    }
  }
}

/// A direct upload captured into a graph bakes its counts (a direct copy reads no count at replay). stage()
/// with other counts, larger (stale elements would be published) or smaller (the graph would overwrite the
/// tail past the published prefix), is refused naming the group, the buffer, the baked and the staged counts,
/// and nothing is staged; the baked counts replay exactly. Fails when stage() does not compare them.
TYPED_TEST_P(H2dGraph, DirectCaptureRefusesOtherCountsAtStage)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::direct, md);
  std::optional<fb::graph_exec<B>> graph;
  {
    auto s = pub.begin(0);
    this->produce(pub, "step", nullptr, this->step_counts(m, 4), 900);
    graph.emplace(fb::graph_exec<B>::capture(this->owner->view(), [&](fb::stream_view<B> st) {
      pub.capture_upload("step", 0, st);
    }));
    s.finish();
  }
  for (std::size_t n : {10U, 2U}) {
    auto s = pub.begin(0);
    this->produce(pub, "step", nullptr, this->step_counts(m, n), 910 + n);
    try {
      pub.stage("step");
      ADD_FAILURE() << "stage() with " << n << " ids accepted by a graph that baked 4";
    } catch (const ferry::logic_error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("group 'step'"), std::string::npos) << w;
      EXPECT_NE(w.find("as a direct copy of 4 units"), std::string::npos) << w;
      EXPECT_NE(w.find("got " + std::to_string(n)), std::string::npos) << w;
    }
    s.finish();
  }
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto s = pub.begin(0);
    this->produce(pub, "step", &md, this->step_counts(m, 4), 950 + step);
    pub.stage("step");
    graph->launch(this->owner->view());
    s.finish();
    this->expect_model(pub, md, "direct capture replayed with its baked counts");
  }
}

REGISTER_TYPED_TEST_SUITE_P(H2dGraph, GraphPaddingIsPublished, FirstConsumerInGraphReplayReadsPublishedValues,
                            CapturedUploadReplaysWithStagedCounts, DirectCaptureRefusesOtherCountsAtStage);

}  // namespace ferry::test::h2d
