// SPDX-License-Identifier: Apache-2.0
// H2D typed suite H2dLifecycle: declaration, initialization (planning, bindings, environment, calibration).
// Instantiated in h2d_host_test.cpp (host) and h2d_cuda_test.cpp (cuda).
#pragma once

#include "h2d/fixture.hpp"

namespace ferry::test::h2d {

template <class B>
class H2dLifecycle : public h2d_fixture<B> {};
TYPED_TEST_SUITE_P(H2dLifecycle);

TYPED_TEST_P(H2dLifecycle, OverlappingBindingsAreRejectedNamingBoth)
{
  using B = TypeParam;
  fb::device_buffer<B> storage{4096, this->b};
  auto* base = storage.template as<unsigned char>();
  fh::publisher<B> pub{this->b};
  (void)pub.declare({.name = "slot_mapping", .groups = {"kv"}, .unit = fh::count_unit::elements, .element_size = 8,
                     .capacity = 64, .device_ptr = base});
  (void)pub.declare({.name = "seq_lens", .groups = {"kv"}, .unit = fh::count_unit::elements, .element_size = 4,
                     .capacity = 64, .device_ptr = base + 500});
  try {
    this->init(pub, fh::upload_backend::packed);
    ADD_FAILURE() << "overlap accepted";
  } catch (const ferry::logic_error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("slot_mapping"), std::string::npos) << w;
    EXPECT_NE(w.find("seq_lens"), std::string::npos) << w;
    EXPECT_NE(w.find("overlaps"), std::string::npos) << w;
  }
}

TYPED_TEST_P(H2dLifecycle, CoveredGroupKeepsCheckedDirectCopiesWithoutArena)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  auto m = this->declare_mixed(pub);
  this->init(pub, fh::upload_backend::packed);
  const auto step = pub.info("step");
  const auto sampling = pub.info("sampling");
  const auto tokens = pub.info("tokens");
  EXPECT_EQ(step.backend, fh::upload_backend::packed);
  EXPECT_GT(step.arena_bytes, 0U);
  EXPECT_TRUE(sampling.covered);
  EXPECT_EQ(sampling.arena_bytes, 0U) << "no duplicate packed arena for a covered group";
  EXPECT_TRUE(tokens.covered);
  typename TestFixture::model md;
  this->poison_all(pub, md, {m.ids, m.positions, m.bf16, m.mask, m.table});
  auto s = pub.begin(0);
  this->produce(pub, "sampling", &md, {{m.bf16, 6}, {m.mask, 3}}, 5);
  pub.publish("sampling", this->owner->view());  // standalone caller: checked direct copies
  this->produce(pub, "tokens", &md, {{m.ids, 4}}, 6);
  pub.publish("tokens", this->owner->view());
  // The combined group now finds its members already published this epoch.
  EXPECT_THROW((void)pub.producer("step"), ferry::logic_error);
  s.finish();
  this->expect_model(pub, md, "covered groups published standalone");
}

TYPED_TEST_P(H2dLifecycle, CoveredGroupThenCombinedGroupIsDuplicate)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  auto s = pub.begin(0);
  this->produce(pub, "sampling", &md, {{m.bf16, 6}, {m.mask, 3}}, 5);
  pub.publish("sampling", this->owner->view());
  this->produce(pub, "tokens", &md, {{m.ids, 4}}, 6);
  pub.publish("tokens", this->owner->view());
  EXPECT_THROW((void)pub.producer("step"), ferry::logic_error);
  try {
    pub.publish("step", this->owner->view());
    ADD_FAILURE() << "duplicate accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("duplicate publication"), std::string::npos) << e.what();
  }
  s.finish();
  this->expect_model(pub, md, "covered groups");
}

TYPED_TEST_P(H2dLifecycle, DirectFallbackFromEnvironmentAndStridedBindings)
{
  using B = TypeParam;
  ::setenv("FERRY_H2D_BACKEND", "direct", 1);
  fh::publisher<B> pub{this->b};
  auto m = this->declare_mixed(pub);
  fh::config c;
  c.device = this->b.current_device();
  pub.initialize(c, this->owner->view());  // reads FERRY_H2D_BACKEND once
  ::setenv("FERRY_H2D_BACKEND", "packed", 1);
  EXPECT_EQ(pub.requested_backend(), fh::upload_backend::direct);
  EXPECT_EQ(pub.info("step").backend, fh::upload_backend::direct);
  EXPECT_EQ(pub.info("step").arena_bytes, 0U);
  typename TestFixture::model md;
  this->poison_all(pub, md, {m.ids, m.positions, m.bf16, m.mask, m.table});
  this->step_cycle(pub, m, md, 0, 30, 3);
  this->expect_model(pub, md, "direct");
  ::unsetenv("FERRY_H2D_BACKEND");

  ::setenv("FERRY_H2D_BACKEND", "fast", 1);
  {
    fh::publisher<B> bad{this->b};
    (void)this->declare_mixed(bad);
    EXPECT_THROW(bad.initialize(c, this->owner->view()), ferry::logic_error);
  }
  ::unsetenv("FERRY_H2D_BACKEND");

  // A strided binding (every row 48 bytes apart) inside a packed group: direct row copies, gaps untouched.
  fb::device_buffer<B> tensor{48 * 16, this->b};
  this->b.memset_async(tensor.data(), poison, 48 * 16, this->owner->handle());
  fh::publisher<B> pub2{this->b};
  auto dense = pub2.declare({.name = "dense", .groups = {"g"}, .unit = fh::count_unit::elements, .element_size = 4, .capacity = 16});
  auto dense2 = pub2.declare({.name = "dense2", .groups = {"g"}, .unit = fh::count_unit::elements, .element_size = 4, .capacity = 16});
  auto strided = pub2.declare({.name = "strided_rows", .groups = {"g"}, .unit = fh::count_unit::rows, .element_size = 4,
                               .row_size = 32, .capacity = 16, .device_ptr = tensor.data(), .stride = 48});
  this->units = {{dense.value, 16}, {dense2.value, 16}, {strided.value, 16}};
  this->init(pub2, fh::upload_backend::packed);
  EXPECT_EQ(pub2.info("g").backend, fh::upload_backend::packed);
  typename TestFixture::model md2;
  this->poison_all(pub2, md2, {dense, dense2});
  auto s = pub2.begin(0);
  std::vector<std::uint8_t> rows;
  {
    auto p = pub2.producer("g");
    auto src = p.template source<std::uint8_t>(strided);
    for (std::size_t i = 0; i < 5 * 32; ++i) { src[i] = data_byte(77, i); }
    rows.assign(src.begin(), src.begin() + 5 * 32);
    p.set_count(strided, 5);
  }
  this->produce(pub2, "g", &md2, {{dense, 7}, {dense2, 9}}, 8);
  pub2.publish("g", this->owner->view());
  s.finish();
  this->expect_model(pub2, md2, "dense members");
  auto t = this->read_back(tensor.data(), 48 * 16);
  for (std::size_t r = 0; r < 16; ++r) {
    for (std::size_t i = 0; i < 48; ++i) {
      const std::uint8_t want = (r < 5 && i < 32) ? rows[r * 32 + i] : poison;
      ASSERT_EQ(t[r * 48 + i], want) << "row " << r << " byte " << i;
    }
  }
}

TYPED_TEST_P(H2dLifecycle, AutoPicksAMeasuredBackendPerGroup)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  auto m = this->declare_mixed(pub);
  this->init(pub, fh::upload_backend::automatic);
  const auto i = pub.info("step");
  ASSERT_EQ(i.calibration_us.size(), 4U);
  EXPECT_GE(i.calibration_us[0], 0.0);
  EXPECT_GE(i.calibration_us[2], 0.0);
  EXPECT_GE(i.calibration_us[3], 0.0);
  EXPECT_EQ(i.calibration_us[1] >= 0.0, fh::publisher<B>::batch_native());
  EXPECT_NE(i.backend, fh::upload_backend::automatic);
  double best = 1e300;
  for (double v : i.calibration_us) {
    if (v >= 0) { best = std::min(best, v); }
  }
  const auto idx = i.backend == fh::upload_backend::direct  ? 0
                   : i.backend == fh::upload_backend::batch ? 1
                   : i.backend == fh::upload_backend::packed ? 2
                                                             : 3;
  // The fastest, or zero-copy within 3% of it (near-tie preference: one operation, least CPU).
  if (i.backend == fh::upload_backend::zerocopy) {
    EXPECT_LE(i.calibration_us[3], best * 1.03);
  } else {
    EXPECT_EQ(i.calibration_us[static_cast<std::size_t>(idx)], best);
    EXPECT_GT(i.calibration_us[3], best * 1.03);
  }
  // The graph choice is the fastest replayed-graph candidate (batch is never capturable).
  ASSERT_EQ(i.calibration_graph_us.size(), 4U);
  EXPECT_LT(i.calibration_graph_us[1], 0.0);
  EXPECT_NE(i.graph_backend, fh::upload_backend::batch);
  double best_graph = 1e300;
  for (double v : i.calibration_graph_us) {
    if (v >= 0) { best_graph = std::min(best_graph, v); }
  }
  const auto gidx = i.graph_backend == fh::upload_backend::direct ? 0 : i.graph_backend == fh::upload_backend::packed ? 2 : 3;
  if (i.graph_backend == fh::upload_backend::zerocopy) {
    EXPECT_LE(i.calibration_graph_us[3], best_graph * 1.03);
  } else {
    EXPECT_EQ(i.calibration_graph_us[static_cast<std::size_t>(gidx)], best_graph);
    EXPECT_GT(i.calibration_graph_us[3], best_graph * 1.03);
  }
  // Calibration never wrote the destinations.
  typename TestFixture::model md;
  for (auto h : {m.ids, m.positions, m.bf16, m.mask, m.table}) { md.bytes[h.value].assign(pub.capacity_bytes(h), poison); }
  for (auto h : {m.ids, m.positions, m.bf16, m.mask, m.table}) {
    this->b.memset_async(pub.device_pointer(h), poison, pub.capacity_bytes(h), this->owner->handle());
  }
  this->step_cycle(pub, m, md, 0, 13, 4);
  this->expect_model(pub, md, "auto");
}

REGISTER_TYPED_TEST_SUITE_P(H2dLifecycle, OverlappingBindingsAreRejectedNamingBoth,
                                          CoveredGroupKeepsCheckedDirectCopiesWithoutArena,
                                          CoveredGroupThenCombinedGroupIsDuplicate,
                                          DirectFallbackFromEnvironmentAndStridedBindings,
                                          AutoPicksAMeasuredBackendPerGroup);

}  // namespace ferry::test::h2d
