// SPDX-License-Identifier: Apache-2.0
// H2D typed suite H2dCapacity: exact values for every backend and unit, untouched tails, changing batch
// sizes, a single active member, the scatter knobs.
// Instantiated in h2d_host_test.cpp (host) and h2d_cuda_test.cpp (cuda).
#pragma once

#include "h2d/fixture.hpp"

#include <fmt/format.h>

namespace ferry::test::h2d {

template <class B>
class H2dCapacity : public h2d_fixture<B> {};
TYPED_TEST_SUITE_P(H2dCapacity);

TYPED_TEST_P(H2dCapacity, ExactValuesForEveryBackendAndUnit)
{
  using B = TypeParam;
  for (auto k : all_backends) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    auto m = this->declare_mixed(pub);
    this->init(pub, k);
    EXPECT_EQ(pub.info("step").arena_bytes > 0, k != fh::upload_backend::direct);
    typename TestFixture::model md;
    this->poison_all(pub, md, {m.ids, m.positions, m.bf16, m.mask, m.table});
    for (std::size_t round = 0; round < 4; ++round) {
      this->step_cycle(pub, m, md, round % 2, 7 + round * 13, 100 + round);
      this->expect_model(pub, md, "after publish");
    }
  }
}

TYPED_TEST_P(H2dCapacity, UntouchedTailsAndChangingBatchSizes)
{
  using B = TypeParam;
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    // Shrinking and growing batches: bytes past each prefix keep what the last longer publication left.
    const std::size_t sizes[] = {64, 3, 40, 1, 0, 17, 64, 2};
    std::uint64_t seed = 7;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      this->step_cycle(pub, m, md, i % 2, sizes[i], ++seed);
      this->expect_model(pub, md, "batch size change");
    }
  }
}

TYPED_TEST_P(H2dCapacity, SingleActiveMemberUsesOneDirectCopy)
{
  using B = TypeParam;
  fb::fault_plan plan;  // unarmed: only counts and logs calls (faulty backends)
  B pb = this->b;
  if constexpr (is_faulty<B>) { pb = B{&plan}; }
  fh::publisher<B> pub{pb};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  this->step_cycle(pub, m, md, 0, 64, 1);  // a packed publication first
  this->step_cycle(pub, m, md, 1, 64, 2);
  auto s = pub.begin(0);
  this->produce(pub, "step", &md, {{m.ids, 0}, {m.positions, 0}, {m.bf16, 0}, {m.mask, 0}, {m.table, 7}}, 3);
  const auto before = h2d_access::snapshot(pub);
  plan.reset_count();
  pub.publish("step", this->owner->view());
  const auto log = plan.log();
  s.finish();
  this->expect_model(pub, md, "single member");
  if constexpr (is_faulty<B>) {
    std::size_t copies = 0, launches = 0;
    for (const auto& l : log) {
      copies += l.rfind("copy:", 0) == 0;
      launches += l.rfind("launch:", 0) == 0;
    }
    EXPECT_EQ(copies, 1U) << "one direct copy, no arena DMA";
    EXPECT_EQ(launches, 0U) << "no scatter kernel";
  }
  // The arena header of slot 0 still holds the earlier packed publication's pairs (not borrowed).
  const auto after = h2d_access::snapshot(pub);
  ASSERT_EQ(before.words.size(), after.words.size());
  const std::size_t hdr = 2 * 5;
  const std::size_t slot0_end = 2 + 3 * 5 + hdr;
  for (std::size_t i = 2 + 3 * 5; i < slot0_end; ++i) { EXPECT_EQ(before.words[i], after.words[i]) << i; }
}

// Every scatter knob keeps the exact bytes: small tiles (a member spans many tiles, partial last vectors),
// warp-sized blocks, each speculation mode, eager (counts in the parameters) and replayed (counts from the
// header) publications with changing counts.
TYPED_TEST_P(H2dCapacity, ScatterKnobsKeepExactBytes)
{
  using B = TypeParam;
  for (std::size_t tile : {std::size_t{32}, std::size_t{48}, std::size_t{4096}, std::size_t{8192}}) {
    for (std::uint32_t th : {32u, 128u, 256u}) {
      for (int spec : {0, 1, 2}) {
        for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy}) {
          SCOPED_TRACE(fmt::format("{} tile {} threads {} spec {}", fh::to_string(k), tile, th, spec));
          this->knob_tile_bytes = tile;
          this->knob_threads = th;
          this->knob_speculation = spec;
          fh::publisher<B> pub{this->b};
          typename TestFixture::model md;
          auto m = this->prepare(pub, k, md);
          auto graphs = this->step_graphs(pub);
          for (std::size_t step = 0; step < 6; ++step) {
            auto s = pub.begin(step % 2);
            const std::size_t n = (step * 37 + 5) % 64;
            this->produce(pub, "step", &md,
                          this->step_counts(m, n),
                          900 + step);
            if (step % 2 == 0) {
              pub.publish("step", this->owner->view());
            } else {
              pub.stage("step");
              graphs[step % 2].launch(this->owner->view());
            }
            s.finish();
            this->expect_model(pub, md, "knobs");
          }
        }
      }
    }
  }
  this->knob_tile_bytes = fh::config{}.tile_bytes;
  this->knob_threads = fh::config{}.threads_per_tile;
  this->knob_speculation = -1;
}

REGISTER_TYPED_TEST_SUITE_P(H2dCapacity, ExactValuesForEveryBackendAndUnit,
                                         UntouchedTailsAndChangingBatchSizes,
                                         SingleActiveMemberUsesOneDirectCopy, ScatterKnobsKeepExactBytes);

}  // namespace ferry::test::h2d
