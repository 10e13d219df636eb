// SPDX-License-Identifier: Apache-2.0
// H2D typed suite H2dMisuse: misuse of the producer and slot guards is refused with a typed error and loses
// nothing already published (wrong element type, guards outliving the publisher, moved-from guards).
// Instantiated in h2d_host_test.cpp (host) and h2d_cuda_test.cpp (cuda).
#pragma once

#include "h2d/fixture.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <type_traits>

namespace ferry::test::h2d {

template <class B>
class H2dMisuse : public h2d_fixture<B> {};
TYPED_TEST_SUITE_P(H2dMisuse);

template <class F>
void expect_logic_error(F&& op, std::initializer_list<const char*> words)
{
  try {
    op();
    ADD_FAILURE() << "accepted";
  } catch (const ferry::logic_error& e) {
    for (const char* w : words) { EXPECT_NE(std::string{e.what()}.find(w), std::string::npos) << e.what(); }
  }
}

TYPED_TEST_P(H2dMisuse, SourceWithMismatchedElementTypeIsRefused)
{
  using B = TypeParam;
  struct row {
    std::int32_t v[9];
  };
  static_assert(sizeof(row) == 36);
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  this->step_cycle(pub, m, md, 0, 10, 1);
  {
    auto s = pub.begin(1);
    auto p = pub.producer("step");
    // elements (int32): sizeof(T) must be 4 (or 1 for raw bytes).
    expect_logic_error([&] { (void)p.template source<std::int64_t>(m.ids); }, {"input_ids", "sizeof(T) 8", "element size 4"});
    expect_logic_error([&] { (void)p.template source<std::int16_t>(m.ids); }, {"input_ids", "sizeof(T) 2"});
    EXPECT_EQ(p.template source<std::int32_t>(m.ids).size(), 64U);
    EXPECT_EQ(p.template source<std::uint8_t>(m.ids).size(), 256U);
    // elements (int64).
    expect_logic_error([&] { (void)p.template source<std::int32_t>(m.positions); }, {"positions", "sizeof(T) 4", "element size 8"});
    // rows (element 4, row 36): the element or the row type.
    expect_logic_error([&] { (void)p.template source<std::int64_t>(m.table); }, {"block_table", "sizeof(T) 8", "row size 36"});
    EXPECT_EQ(p.template source<std::int32_t>(m.table).size(), 300U * 9U);
    EXPECT_EQ(p.template source<row>(m.table).size(), 300U);
    // bytes: any T whose size divides the capacity.
    EXPECT_EQ(p.template source<std::uint16_t>(m.bf16).size(), 64U);
    expect_logic_error([&] { (void)p.template source<std::uint16_t>(m.mask); }, {"is_greedy_bool", "61"});
  }
  // Nothing published was lost, and publication goes on.
  this->expect_model(pub, md, "after the refused source<T>");
  this->step_cycle(pub, m, md, 1, 12, 2);
  this->expect_model(pub, md, "after the next forward");
}

TYPED_TEST_P(H2dMisuse, GuardsOutlivingThePublisherAreRefusedAndDestroyQuietly)
{
  using B = TypeParam;
  for (bool finish_first : {false, true}) {
    SCOPED_TRACE(finish_first ? "slot finished" : "slot open");
    std::optional<fh::publisher<B>> pub;
    pub.emplace(this->b);
    typename TestFixture::model md;
    auto m = this->prepare(*pub, fh::upload_backend::packed, md);
    this->step_cycle(*pub, m, md, 0, 10, 1);
    this->expect_model(*pub, md, "before");
    std::optional<fh::slot_guard<B>> s{pub->begin(1)};
    std::optional<fh::producer_guard<B>> p{pub->producer("tokens")};
    if (finish_first) { s->finish(); }
    pub.reset();  // the guards outlive their publisher
    expect_logic_error([&] { (void)p->template source<std::int32_t>(m.ids); }, {"publisher destroyed"});
    expect_logic_error([&] { p->set_count(m.ids, 1); }, {"publisher destroyed"});
    expect_logic_error([&] { s->finish(); }, {"publisher destroyed"});
    EXPECT_EQ(s->slot(), 1U);
    fh::producer_guard<B> moved{std::move(*p)};
    expect_logic_error([&] { (void)moved.template source<std::int32_t>(m.ids); }, {"publisher destroyed"});
    p.reset();  // a no-op, as is every destructor below
    s.reset();
  }
}

TYPED_TEST_P(H2dMisuse, MovedFromGuardsAreRefused)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  this->step_cycle(pub, m, md, 0, 10, 1);
  {
    auto s = pub.begin(1);
    fh::slot_guard<B> s2{std::move(s)};
    {
      auto p = pub.producer("tokens");
      fh::producer_guard<B> p2{std::move(p)};
      expect_logic_error([&] { (void)p.template source<std::int32_t>(m.ids); }, {"moved-from"});  // NOLINT(bugprone-use-after-move)
      expect_logic_error([&] { p.set_count(m.ids, 1); }, {"moved-from"});
      EXPECT_EQ(p2.template source<std::int32_t>(m.ids).size(), 64U);
    }
    expect_logic_error([&] { s.finish(); }, {"moved-from"});  // NOLINT(bugprone-use-after-move)
    s2.finish();
  }
  this->step_cycle(pub, m, md, 1, 12, 2);
  this->expect_model(pub, md, "after the refused moved-from guards");
}

/// The owner stream destroyed before an open slot_guard and the publisher (host backend: every use of the
/// destroyed handle is a host_error): ~slot_guard and ~publisher neither hang nor throw, each reports on
/// stderr, and the publisher refuses further work (invalidated) instead of touching the stream.
TYPED_TEST_P(H2dMisuse, OwnerStreamDestroyedFirstIsReportedNotAHang)
{
  using B = TypeParam;
  if constexpr (!std::is_base_of_v<fb::host_backend, B>) {
    GTEST_SKIP() << "a destroyed CUDA/HIP stream's handle is undefined behaviour to use; the host backend checks it";
  }
  std::optional<fh::publisher<B>> pub;
  pub.emplace(this->b);
  typename TestFixture::model md;
  auto m = this->prepare(*pub, fh::upload_backend::packed, md);
  this->step_cycle(*pub, m, md, 0, 10, 1);
  this->expect_model(*pub, md, "before");
  std::optional<fh::slot_guard<B>> s{pub->begin(1)};
  const auto t0 = std::chrono::steady_clock::now();
  this->owner.reset();  // the misuse: the owner stream goes first
  ::testing::internal::CaptureStderr();
  s.reset();  // ~slot_guard: finish() records on the destroyed stream
  EXPECT_TRUE(pub->invalidated()) << "the failed completion record invalidates the publisher";
  pub.reset();  // ~publisher: synchronizes the destroyed stream
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "no hang";
  EXPECT_NE(err.find("h2d slot_guard destroyed"), std::string::npos) << err;
  EXPECT_NE(err.find("h2d publisher destroyed"), std::string::npos) << err;
  EXPECT_NE(err.find("destroyed (stream_destroy)"), std::string::npos) << err;
  this->owner.emplace(this->b);  // the fixture's later users
}

/// producer(group, expected_slot), the current-slot check of @h2d_producer(..., slot=): refused before it
/// holds anything unless the active slot is the expected one, also for a group covered by the combined
/// group `step`; the right slot opens the scope and the forward publishes exactly.
TYPED_TEST_P(H2dMisuse, ProducerWithAnExpectedSlotRefusesAnotherSlot)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  expect_logic_error([&] { (void)pub.producer("step", 1); },
                     {"h2d producer 'step'", "expected slot 1, got no active slot (call begin(1) first)"});
  {
    auto s = pub.begin(1);
    expect_logic_error([&] { (void)pub.producer("step", 0); }, {"h2d producer 'step'", "expected slot 0, got active slot 1"});
    expect_logic_error([&] { (void)pub.producer("tokens", 0); }, {"h2d producer 'tokens'", "expected slot 0, got active slot 1"});
    { auto p = pub.producer("tokens", 1); }  // nothing was held by the refused calls
    {
      auto p = pub.producer("step", 1);
      EXPECT_EQ(p.template source<std::int32_t>(m.ids).size(), 64U);
      expect_logic_error([&] { (void)pub.producer("tokens", 1); }, {"reentry rejected", "'input_ids'", "group 'step'"});
    }
    this->produce(pub, "step", &md, this->step_counts(m, 7), 5);
    pub.publish("step", this->owner->view());
    expect_logic_error([&] { (void)pub.producer("sampling", 1); }, {"reentry rejected", "already published", "group 'step'"});
  }
  this->expect_model(pub, md, "after the refused slot checks");
}

REGISTER_TYPED_TEST_SUITE_P(H2dMisuse, SourceWithMismatchedElementTypeIsRefused,
                            GuardsOutlivingThePublisherAreRefusedAndDestroyQuietly, MovedFromGuardsAreRefused,
                            OwnerStreamDestroyedFirstIsReportedNotAHang, ProducerWithAnExpectedSlotRefusesAnotherSlot);

}  // namespace ferry::test::h2d
