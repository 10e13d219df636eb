// SPDX-License-Identifier: Apache-2.0
// H2D typed suite H2dFailure: validation leaves state and memory unchanged; a backend failure invalidates,
// retains storage and recovers.
// Instantiated in h2d_host_test.cpp (host) and h2d_cuda_test.cpp (cuda).
#pragma once

#include "h2d/fixture.hpp"

namespace ferry::test::h2d {

template <class B>
class H2dFailure : public h2d_fixture<B> {};
TYPED_TEST_SUITE_P(H2dFailure);

TYPED_TEST_P(H2dFailure, EveryValidationFailureLeavesStateAndMemoryUnchanged)
{
  using B = TypeParam;
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    this->step_cycle(pub, m, md, 0, 10, 1);
    const auto image0 = this->device_image(pub, md);

    auto expect_rejected = [&](const char* what, auto&& op, std::initializer_list<const char*> words) {
      SCOPED_TRACE(what);
      const auto st = h2d_access::snapshot(pub);
      const auto img = this->device_image(pub, md);
      try {
        op();
        ADD_FAILURE() << what << ": accepted";
      } catch (const ferry::logic_error& e) {
        for (const char* w : words) { EXPECT_NE(std::string{e.what()}.find(w), std::string::npos) << e.what(); }
      }
      EXPECT_EQ(h2d_access::snapshot(pub), st) << what << ": state changed";
      EXPECT_EQ(this->device_image(pub, md), img) << what << ": device memory changed";
    };

    expect_rejected("no active slot", [&] { pub.publish("step", this->owner->view()); }, {"step", "no active slot"});
    auto s = pub.begin(1);
    {
      auto p = pub.producer("step");
      auto ids = p.template source<std::uint8_t>(m.ids);
      for (std::size_t i = 0; i < ids.size(); ++i) { ids[i] = data_byte(9, i); }
      p.set_count(m.ids, 64);
      p.set_count(m.positions, 64);
      p.set_count(m.bf16, 128);
      p.set_count(m.mask, 61);
      expect_rejected("over capacity", [&] { p.set_count(m.table, 301); }, {"block_table", "301", "300"});
    }
    expect_rejected("missing count", [&] { pub.publish("step", this->owner->view()); }, {"step", "block_table", "no count"});
    pub.set_count(m.table, 300);
    expect_rejected("wrong stream", [&] { pub.publish("step", this->aux->view()); }, {"step", "owner stream"});
    expect_rejected("wrong thread", [&] {
      std::exception_ptr ep;
      std::thread t{[&] {
        try {
          pub.publish("step", this->owner->view());
        } catch (...) {
          ep = std::current_exception();
        }
      }};
      t.join();
      if (ep) { std::rethrow_exception(ep); }
    }, {"step", "owner thread"});
    if (this->b.device_count() > 1) {
      expect_rejected("wrong device", [&] {
        const auto d = this->b.current_device();
        this->b.set_device(fb::device_id{d.value == 0 ? 1 : 0});
        struct restore {
          B b;
          fb::device_id d;
          ~restore() { b.set_device(d); }
        } r{this->b, d};
        pub.publish("step", this->owner->view());
      }, {"step", "device"});
    }
    expect_rejected("during capture", [&] {
      this->b.capture_begin(this->owner->handle());
      struct end {
        B b;
        typename B::stream_type s;
        ~end() { b.graph_destroy(b.capture_end(s)); }
      } e{this->b, this->owner->handle()};
      pub.publish("step", this->owner->view());
    }, {"step", "capture"});
    expect_rejected("unknown group", [&] { pub.publish("nope", this->owner->view()); }, {"nope"});
    // The valid publication still goes through afterwards, then duplicates are rejected.
    pub.publish("step", this->owner->view());
    expect_rejected("duplicate", [&] { pub.publish("step", this->owner->view()); }, {"duplicate", "input_ids"});
    expect_rejected("duplicate via covered group", [&] { pub.publish("tokens", this->owner->view()); }, {"duplicate", "tokens"});
    expect_rejected("rewrite without reason", [&] { (void)pub.rewrite("step", ""); }, {"reason"});
    s.finish();
    expect_rejected("finish twice", [&] { pub.finish(); }, {"no active slot"});
    (void)image0;
  }
}

TYPED_TEST_P(H2dFailure, FaultAtEachBackendCallInvalidatesAndRetainsStorage)
{
  using B = TypeParam;
  if constexpr (!is_faulty<B>) {
    GTEST_SKIP() << "needs the fault-injecting backend";
  } else {
    for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct,
                   fh::upload_backend::batch}) {
      SCOPED_TRACE(std::string{fh::to_string(k)});
      fb::fault_plan plan;
      B fb_backend{&plan};
      // Count the calls of one full cycle (begin of a reused slot, publication, finish).
      std::uint64_t n_calls = 0;
      {
        fh::publisher<B> pub{fb_backend};
        typename TestFixture::model md;
        auto m = this->prepare(pub, k, md);
        this->step_cycle(pub, m, md, 0, 9, 1);
        plan.reset_count();
        this->step_cycle(pub, m, md, 0, 9, 2);
        n_calls = plan.calls();
        this->owner->synchronize();
      }
      // Every upload goes through the backend layer (the batch backend too: memcpy_batch_h2d_async), so
      // the injector sees at least: begin wait, capture query, upload, completion record.
      ASSERT_GE(n_calls, 4U) << "begin wait, capture query, upload (>= 1), completion record";
      for (std::uint64_t i = 0; i < n_calls; ++i) {
        SCOPED_TRACE("fail call " + std::to_string(i));
        plan.disarm();
        fh::publisher<B> pub{fb_backend};
        typename TestFixture::model md;
        auto m = this->prepare(pub, k, md);
        this->step_cycle(pub, m, md, 0, 9, 1);
        this->owner->synchronize();
        const auto storage = h2d_access::storage(pub);
        plan.reset_count();
        plan.fail_at(i);
        std::string failed_call;
        try {
          this->step_cycle(pub, m, md, 0, 9, 2);
          ADD_FAILURE() << "no failure surfaced";
        } catch (const ferry::backend_error& e) {
          const auto log = plan.log();
          ASSERT_GT(log.size(), i);
          failed_call = log[i].substr(log[i].find(':') + 1);
          EXPECT_NE(std::string{e.what()}.find(failed_call), std::string::npos) << e.what();
        }
        plan.disarm();
        EXPECT_TRUE(pub.invalidated());
        EXPECT_NE(pub.invalidation_reason().find(failed_call), std::string::npos) << pub.invalidation_reason();
        EXPECT_EQ(h2d_access::storage(pub), storage) << "storage moved or was released";
        EXPECT_THROW((void)pub.begin(1), ferry::invalidated_error);
        EXPECT_THROW(pub.publish("step", this->owner->view()), ferry::invalidated_error);
        EXPECT_THROW((void)pub.producer("step"), ferry::invalidated_error);
        // Explicit recovery after the drain; the bound storage is unchanged and publication works again.
        pub.recover();
        EXPECT_FALSE(pub.invalidated());
        EXPECT_EQ(h2d_access::storage(pub), storage);
        this->step_cycle(pub, m, md, 1, 17, 3);
        this->expect_model(pub, md, "after recovery");
      }
    }
  }
}

REGISTER_TYPED_TEST_SUITE_P(H2dFailure, EveryValidationFailureLeavesStateAndMemoryUnchanged,
                                        FaultAtEachBackendCallInvalidatesAndRetainsStorage);

}  // namespace ferry::test::h2d
