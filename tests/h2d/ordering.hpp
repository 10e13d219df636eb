// SPDX-License-Identifier: Apache-2.0
// H2D typed suite H2dOrdering: slots, epochs, source reuse, two-batch overlap, producer reentry and
// deliberate second publications.
// Instantiated in h2d_host_test.cpp (host) and h2d_cuda_test.cpp (cuda).
#pragma once

#include "h2d/fixture.hpp"

namespace ferry::test::h2d {

template <class B>
class H2dOrdering : public h2d_fixture<B> {};
TYPED_TEST_SUITE_P(H2dOrdering);

TYPED_TEST_P(H2dOrdering, DelayedSourceReuseMakesBeginWait)
{
  using B = TypeParam;
  this->jitter(30);
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    // Stall the owner stream: a kernel spins until the CPU releases the flag.
    fb::mapped_buffer<B> flag{64, this->b};
    fb::device_buffer<B> sink{64, this->b};
    auto* f = flag.template as<std::uint64_t>();
    fb::host_store_release(f, 0);
    this->b.launch(ferry::testing::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {32}, 0},
                   this->owner->handle(), static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()),
                   std::uint64_t{1}, static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()),
                   sink.template as<std::uint64_t>(), std::uint64_t{1});
    auto first = md;
    this->step_cycle(pub, m, first, 0, 33, 500);  // queued behind the stall
    this->step_cycle(pub, m, first, 1, 20, 600);  // slot 1: no wait needed
    std::thread releaser{[f] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      fb::host_store_release(f, 1);
    }};
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto s = pub.begin(0);  // must wait until slot 0's uploads have read their sources
      const auto waited = std::chrono::steady_clock::now() - t0;
      EXPECT_GE(waited, std::chrono::milliseconds(100)) << "begin() did not wait for source reuse";
      // The producer now overwrites slot 0's sources; the earlier upload must already have its bytes.
      typename TestFixture::model scratch = first;
      this->produce(pub, "step", &scratch,
                    {{m.ids, 64}, {m.positions, 64}, {m.bf16, 128}, {m.mask, 61}, {m.table, 300}}, 999);
      releaser.join();
      this->expect_model(pub, first, "slot 0 sources rewritten after begin()");
      pub.publish("step", this->owner->view());
      s.finish();
      this->expect_model(pub, scratch, "third publication");
    }
  }
}

TYPED_TEST_P(H2dOrdering, PipelineRotationOverThreeSlots)
{
  using B = TypeParam;
  this->jitter(20);
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md, 3);
  // Back to back without any CPU synchronization: each slot's sources stay intact until its upload read them.
  for (std::size_t step = 0; step < 12; ++step) { this->step_cycle(pub, m, md, step % 3, 1 + (step * 5) % 64, 40 + step); }
  this->expect_model(pub, md, "after rotation");
  EXPECT_THROW((void)pub.begin(3), ferry::logic_error);
}

TYPED_TEST_P(H2dOrdering, TwoBatchOverlapResumesTheSameEpoch)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  auto a = pub.declare({.name = "ub0_ids", .groups = {"ubatch0"}, .unit = fh::count_unit::elements, .element_size = 4, .capacity = 32});
  auto a2 = pub.declare({.name = "ub0_pos", .groups = {"ubatch0"}, .unit = fh::count_unit::elements, .element_size = 8, .capacity = 32});
  auto c = pub.declare({.name = "ub1_ids", .groups = {"ubatch1"}, .unit = fh::count_unit::elements, .element_size = 4, .capacity = 32});
  auto c2 = pub.declare({.name = "ub1_pos", .groups = {"ubatch1"}, .unit = fh::count_unit::elements, .element_size = 8, .capacity = 32});
  this->units = {{a.value, 32}, {a2.value, 32}, {c.value, 32}, {c2.value, 32}};
  this->init(pub, fh::upload_backend::packed);
  typename TestFixture::model md;
  this->poison_all(pub, md, {a, a2, c, c2});
  std::uint64_t epoch = 0;
  {
    auto s = pub.begin(0);
    epoch = s.epoch();
    this->produce(pub, "ubatch0", &md, {{a, 10}, {a2, 10}}, 1);
    pub.publish("ubatch0", this->owner->view());
    s.finish();
  }
  {
    auto s = pub.resume(0);  // late preparation of the second micro-batch
    EXPECT_EQ(s.epoch(), epoch);
    EXPECT_THROW((void)pub.producer("ubatch0"), ferry::logic_error) << "ubatch0 is already published this epoch";
    this->produce(pub, "ubatch1", &md, {{c, 12}, {c2, 5}}, 2);
    pub.publish("ubatch1", this->owner->view());
    EXPECT_THROW(pub.publish("ubatch0", this->owner->view()), ferry::logic_error);
    s.finish();  // records completion again
  }
  this->expect_model(pub, md, "tbo");
  {
    auto s = pub.begin(0);  // a new epoch: both groups may publish again
    EXPECT_GT(s.epoch(), epoch);
    this->produce(pub, "ubatch0", &md, {{a, 3}, {a2, 4}}, 3);
    pub.publish("ubatch0", this->owner->view());
  }  // the guard's destructor finishes the epoch
  this->expect_model(pub, md, "next epoch");
}

TYPED_TEST_P(H2dOrdering, ProducerReentryIsRejectedAndSourcesStayIntact)
{
  using B = TypeParam;
  this->jitter(20);
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  auto s = pub.begin(0);
  {
    auto p = pub.producer("step");
    // Nested reentry while the first producer is open: rejected.
    EXPECT_THROW((void)pub.producer("step"), ferry::logic_error);
    EXPECT_THROW((void)pub.producer("tokens"), ferry::logic_error) << "tokens shares input_ids with the open producer";
  }
  this->produce(pub, "step", &md, {{m.ids, 9}, {m.positions, 9}, {m.bf16, 18}, {m.mask, 9}, {m.table, 36}}, 11);
  std::vector<std::uint8_t> before;
  {
    // Snapshot the sources through a fresh producer is impossible now (reentry); snapshot via the model.
    before = md.bytes[m.ids.value];
  }
  pub.publish("step", this->owner->view());
  // Reentry after publication, directly and through the covered group whose upload went through `step`.
  try {
    (void)pub.producer("step");
    ADD_FAILURE() << "reentry after publication accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("reentry rejected"), std::string::npos) << e.what();
    EXPECT_NE(std::string{e.what()}.find("'step'"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)pub.producer("tokens"), ferry::logic_error);
  EXPECT_THROW((void)pub.producer("sampling"), ferry::logic_error);
  EXPECT_THROW(pub.set_count(m.ids, 3), ferry::logic_error);
  s.finish();
  this->expect_model(pub, md, "after rejected reentry");
  // A stale guard (from a finished epoch) is refused too.
  auto s2 = pub.begin(1);
  auto p2 = pub.producer("tokens");
  s2.finish();
  EXPECT_THROW((void)p2.template source<std::int32_t>(m.ids), ferry::logic_error);
}

TYPED_TEST_P(H2dOrdering, SecondPublicationNeedsReasonAndStallsUntilSourceRead)
{
  using B = TypeParam;
  this->jitter(20);
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  fb::mapped_buffer<B> flag{64, this->b};
  fb::device_buffer<B> sink{64, this->b};
  auto* f = flag.template as<std::uint64_t>();
  fb::host_store_release(f, 0);
  auto s = pub.begin(0);
  this->b.launch(ferry::testing::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {32}, 0}, this->owner->handle(),
                 static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()), std::uint64_t{1},
                 static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()),
                 sink.template as<std::uint64_t>(), std::uint64_t{1});
  auto first = md;
  this->produce(pub, "step", &first, {{m.ids, 20}, {m.positions, 20}, {m.bf16, 40}, {m.mask, 20}, {m.table, 80}}, 21);
  pub.publish("step", this->owner->view());
  EXPECT_THROW(pub.publish("step", this->owner->view()), ferry::logic_error);
  EXPECT_THROW((void)pub.rewrite("step", ""), ferry::logic_error);
  std::thread releaser{[f] {
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    fb::host_store_release(f, 1);
  }};
  const auto t0 = std::chrono::steady_clock::now();
  {
    auto p = pub.rewrite("step", "speculative verification corrected the draft");
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(80)) << "rewrite did not acquire";
    releaser.join();
    this->expect_model(pub, first, "first publication read its sources before the rewrite");
  }
  auto second = first;
  this->produce(pub, "step", &second, {{m.ids, 5}, {m.positions, 5}, {m.bf16, 10}, {m.mask, 5}, {m.table, 20}}, 22);
  pub.publish("step", this->owner->view());
  s.finish();
  EXPECT_EQ(pub.last_rewrite_reason(), "speculative verification corrected the draft");
  this->expect_model(pub, second, "second publication");
}

REGISTER_TYPED_TEST_SUITE_P(H2dOrdering, DelayedSourceReuseMakesBeginWait, PipelineRotationOverThreeSlots,
                                         TwoBatchOverlapResumesTheSameEpoch,
                                         ProducerReentryIsRejectedAndSourcesStayIntact,
                                         SecondPublicationNeedsReasonAndStallsUntilSourceRead);

}  // namespace ferry::test::h2d
