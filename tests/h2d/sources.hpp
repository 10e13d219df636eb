// SPDX-License-Identifier: Apache-2.0
// H2D typed suite H2dSources: the window in which a slot's pinned sources may be written, and the debug
// check (config::debug_sources, FERRY_H2D_DEBUG_SOURCES=1) that reports a source written after its
// publication: found by the next begin() (of either slot), resume(), producer() or stage(), naming the group,
// buffer, slot and first changed byte; legitimate writes (after the slot's next begin(), a rewrite()'s second
// publication, a resumed epoch's other group) are not reported; without the debug mode nothing is checked.
// Instantiated in h2d_host_test.cpp (host) and h2d_cuda_test.cpp (cuda).
#pragma once

#include "h2d/fixture.hpp"

#include <functional>
#include <optional>
#include <span>
#include <string>

namespace ferry::test::h2d {

template <class B>
class H2dSources : public h2d_fixture<B> {
 protected:
  /// begin(slot), the standard "step" publication of batch 10, then the misuse: byte 5 of input_ids' source
  /// (a span taken inside a producer scope) flipped after publish(). Returns the still active slot.
  fh::slot_guard<B> publish_then_write(fh::publisher<B>& pub, const typename h2d_fixture<B>::mixed& m,
                                       typename h2d_fixture<B>::model& md, std::size_t slot)
  {
    auto s = pub.begin(slot);
    this->produce(pub, "step", &md, this->step_counts(m, 10), 100 + slot);
    std::span<std::uint8_t> ids;
    {
      auto p = pub.producer("step");  // not published yet: the scope opens again
      ids = p.template source<std::uint8_t>(m.ids);
    }
    pub.publish("step", this->owner->view());
    // The upload has read the source before the misuse: without this the write races the host backend's copy
    // (a data race ThreadSanitizer reports: tests/reliability/run_sanitizers.sh); the debug check compares
    // with the bytes recorded at publish() either way.
    this->owner->synchronize();
    ids[5] = static_cast<std::uint8_t>(ids[5] ^ 0xFFU);  // the misuse: a write after publish()
    return s;
  }

  /// The debug check's report: a logic_error naming the group, buffer, slot, byte and the call that found it.
  static void expect_report(const std::function<void()>& op, std::size_t slot, const char* found_by)
  {
    try {
      op();
      ADD_FAILURE() << "a source written after publish() was not reported (found by " << found_by << ")";
    } catch (const ferry::logic_error& e) {
      const std::string w = e.what();
      for (const std::string& word :
           {std::string{"h2d group 'step': buffer 'input_ids' source of slot "} + std::to_string(slot) +
              " was written after publish()",
            std::string{"byte 5 of its 40 published bytes"}, std::string{"found by "} + found_by,
            std::string{"FERRY_H2D_DEBUG_SOURCES"}}) {
        EXPECT_NE(w.find(word), std::string::npos) << "missing '" << word << "' in: " << w;
      }
    }
  }
};
TYPED_TEST_SUITE_P(H2dSources);

TYPED_TEST_P(H2dSources, WriteAfterPublishIsReportedInDebugMode)
{
  using B = TypeParam;
  this->knob_debug_sources = true;
  for (const char* finder : {"begin() of the other slot", "begin() of the same slot", "producer()", "resume()"}) {
    SCOPED_TRACE(finder);
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, fh::upload_backend::packed, md);
    ASSERT_TRUE(pub.debug_sources());
    const std::string f{finder};
    {
      auto s = this->publish_then_write(pub, m, md, 0);
      if (f == "producer()") {
        this->expect_report([&] { (void)pub.producer("tokens"); }, 0, "producer()");
      } else {
        s.finish();
        if (f == "resume()") {
          this->expect_report([&] { (void)pub.resume(0); }, 0, "resume()");
        } else {
          this->expect_report([&] { (void)pub.begin(f.find("other") != std::string::npos ? 1 : 0); }, 0, "begin()");
        }
      }
    }
    // Reported once: the publisher goes on, and the next forwards publish exactly.
    this->step_cycle(pub, m, md, 1, 12, 7);
    this->step_cycle(pub, m, md, 0, 12, 8);
    this->expect_model(pub, md, "after the report");
  }
}

TYPED_TEST_P(H2dSources, WriteAfterStageIsReportedInDebugMode)
{
  using B = TypeParam;
  this->knob_debug_sources = true;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  auto graphs = this->step_graphs(pub);
  {
    auto s = pub.begin(1);
    this->produce(pub, "step", &md, this->step_counts(m, 10), 3);
    std::span<std::uint8_t> ids;
    {
      auto p = pub.producer("step");
      ids = p.template source<std::uint8_t>(m.ids);
    }
    pub.stage("step");
    ids[5] = static_cast<std::uint8_t>(ids[5] ^ 0xFFU);  // before the replay reads it: changes the upload
    graphs[1].launch(this->owner->view());
    s.finish();
  }
  this->expect_report([&] { (void)pub.begin(0); }, 1, "begin()");
}

TYPED_TEST_P(H2dSources, WritesInsideTheWindowAreNotReported)
{
  using B = TypeParam;
  this->knob_debug_sources = true;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  // Rotation without synchronization: each begin() waits, then the producer overwrites the slot's sources.
  for (std::size_t step = 0; step < 6; ++step) { this->step_cycle(pub, m, md, step % 2, 5 + step, 20 + step); }
  {
    // A deliberate second publication rewrites the sources after rewrite() acquired them.
    auto s = pub.begin(0);
    this->produce(pub, "step", nullptr, this->step_counts(m, 9), 30);
    pub.publish("step", this->owner->view());
    {
      auto p = pub.rewrite("step", "draft corrected");
      for (auto [h, n] : this->step_counts(m, 11)) {
        auto src = p.template source<std::uint8_t>(h);
        for (std::size_t i = 0; i < n * (pub.capacity_bytes(h) / this->units.at(h.value)); ++i) {
          src[i] = data_byte(31 + h.value * 1000003ULL, i);
          md.bytes[h.value][i] = src[i];
        }
        p.set_count(h, n);
      }
    }
    pub.publish("step", this->owner->view());
    s.finish();
  }
  for (std::size_t step = 0; step < 4; ++step) { this->step_cycle(pub, m, md, (step + 1) % 2, 12, 40 + step); }
  this->expect_model(pub, md, "debug mode, legitimate writes only");
}

TYPED_TEST_P(H2dSources, WithoutDebugModeNothingIsChecked)
{
  using B = TypeParam;
  this->knob_debug_sources = false;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  EXPECT_FALSE(pub.debug_sources());
  {
    auto s = this->publish_then_write(pub, m, md, 0);
    EXPECT_THROW((void)pub.producer("tokens"), ferry::logic_error) << "the reentry check, not the debug check";
    s.finish();
  }
  EXPECT_NO_THROW({ auto s = pub.begin(1); }) << "no check without the debug mode";
  EXPECT_NO_THROW({ auto s = pub.begin(0); });
  this->step_cycle(pub, m, md, 1, 12, 7);
  this->step_cycle(pub, m, md, 0, 12, 8);
  this->expect_model(pub, md, "without the debug mode");
}

REGISTER_TYPED_TEST_SUITE_P(H2dSources, WriteAfterPublishIsReportedInDebugMode, WriteAfterStageIsReportedInDebugMode,
                            WritesInsideTheWindowAreNotReported, WithoutDebugModeNothingIsChecked);

}  // namespace ferry::test::h2d
