// SPDX-License-Identifier: Apache-2.0
// Fault sweep (issue item 5). For each scenario: count its N fallible backend calls (faulty<host_backend>),
// then rerun it failing call i for every i < N, once non-sticky and once sticky (call i and every later
// call fail). Asserts: the owner is invalidated, the error names the failed call, no later publication
// silently succeeds, delivered data is never corrupt, storage a DMA may read is retained (pointer compare
// for h2d; ASan use-after-free for both), and nothing leaks (run under ASan/LSan).
//
//   ferry_rel_sweep [d2h|h2d|all]      prints "sweep: N faults injected, M failures"; exit 1 on failures
#include "../stress/common.hpp"

#include <ferry/testing/h2d_access.hpp>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <thread>

namespace ferry::rel {
namespace {

using FB = fb::faulty<fb::host_backend>;
using namespace std::chrono_literals;

struct sweep_stats {
  std::uint64_t scenarios{0}, injected{0}, not_reached{0}, delivered{0};
};

/// Calls made by the test's graph capture (graph_exec::capture), not by the channel.
bool test_call(const std::string& name)
{
  return name == "capture_begin" || name == "capture_end" || name == "graph_instantiate";
}

std::string call_name(const fb::fault_plan& plan, std::uint64_t i)
{
  const auto log = plan.log();
  if (i >= log.size()) { return {}; }
  return log[i].substr(log[i].find(':') + 1);
}

// ---------------------------------------------------------------------------------------------------------
// D2H: construction, eager forwards (static + dynamic entries), a captured graph replayed twice, close().
// Poll drain: every backend call is made by this thread, so the call sequence is (nearly) deterministic.

/// Runs the scenario; `fail_i` = never counts. Returns the number of calls made.
std::uint64_t d2h_scenario(fb::fault_plan& plan, std::uint64_t fail_i, bool sticky, bool disable, tally& t,
                           sweep_stats& st, const std::string& tag)
{
  plan.disarm();
  plan.reset_count();
  FB b{&plan};
  const fb::host_backend hb = b.base();
  hb.set_device(fb::device_id{0});
  fb::stream<FB> s{b};
  sources<fb::host_backend> src{hb, 16, 1024};
  src.fill(0, s.handle());
  fb::device_buffer<fb::host_backend> actual{64, hb};
  {
    const std::uint64_t a = 200;  // GPU-resolved size of the dynamic entry
    fb::pinned_buffer<fb::host_backend> h{64, hb};
    std::memcpy(h.data(), &a, 8);
    hb.memcpy_async(actual.data(), h.data(), 8, fb::memcpy_kind::host_to_device, s.handle());
    hb.stream_synchronize(s.handle());
  }
  d2h_checker chk;
  fd::config cfg;
  cfg.ring_bytes = 2048;
  cfg.publish_every = 3;
  cfg.drain = fd::drain_mode::poll;
  cfg.tuning.size_slots = 4;
  cfg.tuning.max_copies_in_flight = 4;
  cfg.fifo_capacity = 16;
  cfg.timeout = 200ms;
  if (disable) { cfg.on_error = fd::error_policy::disable; }
  const bool counting = fail_i == fb::fault_plan::never;
  plan.reset_count();
  if (!counting) { plan.fail_at(fail_i, sticky); }

  auto test_side = [&](auto&& f) {
    try {
      f();
    } catch (const std::exception&) {  // e.g. a failed capture_end left the stream capturing
    }
  };
  std::string first_error, reason, disabled_by;
  std::uint64_t after_close = fb::fault_plan::never;
  bool surfaced = false;
  std::optional<fd::channel<FB>> ch;
  std::uint64_t seq = 0;
  // Runs a channel call. After the channel was invalidated, a call that returns normally is a silent success;
  // under on_error = disable a producer call never throws (it is a no-op once capture is disabled), except a
  // replay whose graph launch itself failed (the engine's graph, not capture).
  auto call = [&](const char* what, auto&& f) -> bool {
    const bool was_invalid = ch && ch->invalidated();
    const std::string_view w{what};
    const bool producer_call = w != "poll" && w != "construct" && w != "close" && w != "graph capture";
    try {
      f();
      // poll is the consumer side: delivering what was published before the failure is allowed
      if (was_invalid && w != "poll" && !disable) { t.fail(tag + ": " + what + " succeeded on an invalidated channel"); }
      return true;
    } catch (const ferry::error& e) {
      if (!surfaced) {
        surfaced = true;
        first_error = e.what();
      }
      if (counting) { t.fail(tag + ": counting run threw at " + what + ": " + e.what()); }
      if (disable && producer_call && !(w == "replay" && contains(e.what(), "graph_launch"))) {
        t.fail(tag + ": " + what + " threw under on_error = disable: " + e.what());
      }
      return false;
    }
  };
  auto settle = [&] {  // let the drain stream finish (not a counted call), then poll
    std::this_thread::sleep_for(1ms);
    (void)call("poll", [&] {
      for (int k = 0; k < 4; ++k) {
        (void)ch->poll();
        std::this_thread::sleep_for(500us);
      }
    });
  };
  auto capture = [&](std::uint64_t slot_for_seq, std::uint64_t size) {
    return call("capture", [&] {
      chk.expect(seq, static_cast<std::uint32_t>(seq % 7), size);
      ch->capture(fd::hook_id{static_cast<std::uint32_t>(seq % 7)}, src.at(slot_for_seq), size, s);
      ++seq;
    });
  };

  if (!call("construct", [&] { ch.emplace(cfg, b, chk.callback()); })) {
    // Construction failed: the error names the call, and nothing stays registered or allocated.
    plan.disarm();
    try {
      fd::channel<FB> again{cfg, b};
      (void)again.close();
    } catch (const std::exception& e) {
      t.fail(tag + ": a channel cannot be created after a failed construction: " + e.what());
    }
  } else {
    // forward 1: static entries and one dynamic entry
    (void)call("begin_forward", [&] { ch->begin_forward(s); });
    for (std::uint64_t sz : {100, 512, 48}) { (void)capture(seq, sz); }
    (void)call("capture_dynamic", [&] {
      chk.expect(seq, 9, 200);
      ch->capture_dynamic(fd::hook_id{9}, src.at(seq), 256, actual.as<std::uint64_t>(), s);
      ++seq;
    });
    (void)capture(seq, 17);
    (void)call("end_forward", [&] { (void)ch->end_forward(s); });
    test_side([&] { hb.stream_synchronize(s.handle()); });
    settle();
    // graph: 3 entries captured once from slots 8..10, replayed twice (sources refilled for the second)
    std::optional<fb::graph_exec<FB>> g;
    fd::forward_plan fp;
    (void)call("graph capture", [&] {
      g.emplace(fb::graph_exec<FB>::capture(s, [&](fb::stream_view<FB> sv) {
        ch->begin_forward(sv);
        for (std::uint32_t k = 0; k < 3; ++k) { ch->capture(fd::hook_id{20 + k}, src.at(8 + k), 64 + 40 * k, sv); }
        fp = ch->end_forward(sv);
      }));
    });
    for (int rep = 0; rep < 2 && g; ++rep) {
      test_side([&] { hb.stream_synchronize(s.handle()); });
      test_side([&] { src.fill(seq - 8, s.handle()); });  // slot 8 + k holds pattern(seq + k)
      test_side([&] { hb.stream_synchronize(s.handle()); });
      const std::uint64_t first = seq;
      if (call("replay", [&] {
            for (std::uint32_t k = 0; k < 3; ++k) { chk.expect(first + k, 20 + k, 64 + 40 * k); }
            ch->replay(*g, fp, s);
          })) {
        seq += 3;
      }
      test_side([&] { hb.stream_synchronize(s.handle()); });
      settle();
    }
    test_side([&] { hb.stream_synchronize(s.handle()); });
    test_side([&] { src.fill(0, s.handle()); });
    test_side([&] { hb.stream_synchronize(s.handle()); });
    // forward 3: enough bytes to wrap the 2 KiB ring
    (void)call("begin_forward", [&] { ch->begin_forward(s); });
    for (std::uint64_t sz : {700, 333, 640, 64}) {
      const std::uint64_t slot = seq % 16;
      test_side([&] { hb.stream_synchronize(s.handle()); });
      test_side([&] { src.fill(seq - slot, s.handle()); });
      test_side([&] { hb.stream_synchronize(s.handle()); });
      (void)capture(slot, sz);
      test_side([&] { hb.stream_synchronize(s.handle()); });
      settle();
    }
    (void)call("end_forward", [&] { (void)ch->end_forward(s); });
    test_side([&] { hb.stream_synchronize(s.handle()); });
    settle();
    const bool closed_ok = call("close", [&] { (void)ch->close(); });
    disabled_by = ch->capture_error();
    after_close = plan.calls();  // later calls are the destructor's (noexcept: nothing can surface there)
    if (!counting && plan.injected() > 0 && fail_i < after_close && !test_call(call_name(plan, fail_i))) {
      const std::string name = call_name(plan, fail_i);
      reason = ch->invalidation_reason();
      t.expect(!closed_ok, tag + ": close() succeeded after call " + name + " failed");
      t.expect(ch->invalidated() || (disable && ch->capture_disabled()),
               tag + ": channel neither invalidated nor (on_error = disable) capture disabled after call " + name + " failed");
      t.expect(contains(ch->invalidation_reason(), name) || contains(disabled_by, name),
               tag + ": neither the invalidation reason nor the capture error names " + name + ": " +
                 ch->invalidation_reason() + " | " + disabled_by);
    }
    // A failed capture_end (injected before the backend's own end) leaves the test stream capturing: end it.
    test_side([&] {
      if (hb.stream_is_capturing(s.handle())) { hb.graph_destroy(hb.capture_end(s.handle())); }
    });
    ch.reset();  // destruction: waits for the drain stream; ASan checks no DMA touched freed storage
  }
  if (counting) {
    t.expect(chk.got == seq && seq == 15, tag + ": counting run delivered " + std::to_string(chk.got) + " of " +
                                            std::to_string(seq) + " entries (expected 15)");
  } else if (plan.injected() > 0 && fail_i >= after_close) {
    ++st.injected;  // a destructor call: the channel is gone, only ASan/LSan judge it
  } else if (plan.injected() > 0) {
    const std::string name = call_name(plan, fail_i);
    t.expect(surfaced || !disabled_by.empty(), tag + ": failing call " + name + " surfaced no error");
    // The channel's own calls: its invalidation reason names the call (a drain-side failure surfaces there,
    // not as an exception of the poll). Calls made by graph_exec::capture surface as the thrown error.
    t.expect(contains(first_error, name) || contains(reason, name) || contains(disabled_by, name),
             tag + ": neither the first error nor the invalidation reason names " + name + ": " + first_error);
    ++st.injected;
  } else {
    ++st.not_reached;
  }
  t.expect(chk.bad() == 0, tag + ": corrupt delivery: " + chk.first_bad);
  st.delivered += chk.got;
  ++st.scenarios;
  const auto n = plan.calls();
  plan.disarm();
  return n;
}

void sweep_d2h(tally& t, sweep_stats& st)
{
  fb::fault_plan plan;
  // Twice: on_error = raise (every failure is a typed error of the failing call), then on_error = disable (no
  // producer call throws; capture is disabled with the error kept, and what was published is delivered).
  for (const bool disable : {false, true}) {
    const std::uint64_t n = d2h_scenario(plan, fb::fault_plan::never, false, disable, t, st, "d2h count");
    std::printf("d2h (on_error = %s): scenario makes %llu backend calls\n", disable ? "disable" : "raise",
                static_cast<unsigned long long>(n));
    for (bool sticky : {false, true}) {
      for (std::uint64_t i = 0; i < n; ++i) {
        (void)d2h_scenario(plan, i, sticky, disable, t, st,
                           std::string{"d2h "} + (disable ? "disable " : "") + (sticky ? "sticky" : "once") + " fail#" +
                             std::to_string(i));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// H2D sticky variants (the non-sticky sweep is tests/h2d/suite.hpp FaultAtEachBackendCall...): a reused slot's
// begin (source wait), publish, a late resume + rewrite + republish, finish.

struct h2d_bufs {
  fh::buffer_handle ids, bytes, table;
};

h2d_bufs h2d_declare(fh::publisher<FB>& pub)
{
  h2d_bufs m;
  m.ids = pub.declare({.name = "input_ids", .groups = {"step", "tokens"}, .unit = fh::count_unit::elements,
                       .element_size = 4, .capacity = 64});
  m.bytes = pub.declare({.name = "mask_bytes", .groups = {"step"}, .unit = fh::count_unit::bytes, .element_size = 1,
                         .capacity = 100});
  m.table = pub.declare({.name = "block_table", .groups = {"step"}, .unit = fh::count_unit::rows, .element_size = 4,
                         .row_size = 12, .capacity = 20});
  return m;
}

/// Fills and sets counts for the group "step"; returns the expected device prefix per buffer.
std::map<std::uint32_t, std::vector<std::uint8_t>> h2d_produce(fh::publisher<FB>& pub, const h2d_bufs& m,
                                                               std::uint64_t seed, bool rewrite = false)
{
  std::map<std::uint32_t, std::vector<std::uint8_t>> want;
  auto p = rewrite ? pub.rewrite("step", "late correction") : pub.producer("step");
  const std::pair<fh::buffer_handle, std::size_t> counts[] = {{m.ids, 10}, {m.bytes, 37}, {m.table, 5}};
  const std::size_t unit[] = {4, 1, 12};
  for (std::size_t j = 0; j < 3; ++j) {
    auto [h, n] = counts[j];
    auto src = p.template source<std::uint8_t>(h);
    auto& w = want[h.value];
    for (std::size_t i = 0; i < n * unit[j]; ++i) {
      src[i] = ferry::testing::pattern_byte(seed * 131 + h.value, i);
      w.push_back(src[i]);
    }
    p.set_count(h, n);
  }
  return want;
}

void h2d_sticky_case(fh::upload_backend k, fb::fault_plan& plan, std::uint64_t fail_i, std::uint64_t& n_calls,
                     tally& t, sweep_stats& st)
{
  const bool counting = fail_i == fb::fault_plan::never;
  const std::string tag = std::string{"h2d sticky "} + std::string{fh::to_string(k)} + " fail#" + std::to_string(fail_i);
  plan.disarm();
  FB b{&plan};
  const fb::host_backend hb = b.base();
  hb.set_device(fb::device_id{0});
  fb::stream<FB> owner{b};
  fh::publisher<FB> pub{b};
  const auto m = h2d_declare(pub);
  fh::config c;
  c.slots = 2;
  c.backend = k;
  c.device = hb.current_device();
  c.calibration_iterations = 2;
  pub.initialize(c, owner.view());
  {
    auto s0 = pub.begin(0);
    (void)h2d_produce(pub, m, 1);
    pub.publish("step", owner.view());
    s0.finish();
  }
  hb.stream_synchronize(owner.handle());
  const auto storage = ferry::testing::h2d_access::storage(pub);
  plan.reset_count();
  if (!counting) { plan.fail_at(fail_i, /*sticky=*/true); }
  std::string err;
  try {
    auto s0 = pub.begin(0);
    (void)h2d_produce(pub, m, 2);
    pub.publish("step", owner.view());
    s0.finish();
    auto r0 = pub.resume(0);
    (void)h2d_produce(pub, m, 3, /*rewrite=*/true);
    pub.publish("step", owner.view());
    r0.finish();
    if (!counting && plan.injected() > 0) { t.fail(tag + ": no failure surfaced"); }
  } catch (const ferry::backend_error& e) {
    err = e.what();
    if (counting) { t.fail(tag + ": counting run failed: " + err); }
  } catch (const std::exception& e) {
    t.fail(tag + ": expected a backend_error, got: " + e.what());
  }
  if (counting) {
    n_calls = plan.calls();
    ++st.scenarios;
    return;
  }
  if (plan.injected() == 0) {
    ++st.not_reached;
    return;
  }
  ++st.injected;
  ++st.scenarios;
  const std::string name = call_name(plan, fail_i);
  t.expect(contains(err, name), tag + ": error does not name " + name + ": " + err);
  t.expect(pub.invalidated(), tag + ": publisher not invalidated");
  t.expect(contains(pub.invalidation_reason(), name), tag + ": reason does not name " + name);
  t.expect(ferry::testing::h2d_access::storage(pub) == storage, tag + ": storage moved or was released");
  auto refused = [&](const char* what, auto&& f) {
    try {
      f();
      t.fail(tag + ": " + what + " succeeded on an invalidated publisher");
    } catch (const ferry::invalidated_error&) {
    } catch (const std::exception& e) {
      t.fail(tag + ": " + what + ": expected invalidated_error, got: " + e.what());
    }
  };
  refused("begin", [&] { (void)pub.begin(1); });
  refused("publish", [&] { pub.publish("step", owner.view()); });
  refused("producer", [&] { (void)pub.producer("step"); });
  // Sticky: recovery itself fails (its drain is a backend call) and must leave the publisher invalidated.
  try {
    pub.recover();
    t.fail(tag + ": recover() succeeded while every backend call fails");
  } catch (const ferry::backend_error&) {
  } catch (const std::exception& e) {
    t.fail(tag + ": recover(): expected backend_error, got: " + e.what());
  }
  t.expect(pub.invalidated(), tag + ": a failed recover() cleared the invalidation");
  refused("publish after failed recover", [&] { pub.publish("step", owner.view()); });
  t.expect(ferry::testing::h2d_access::storage(pub) == storage, tag + ": storage released after failed recover");
  // The backend comes back: recover, publish on the other slot, bytes are exact.
  plan.disarm();
  try {
    pub.recover();
    auto s1 = pub.begin(1);
    const auto want = h2d_produce(pub, m, 4);
    pub.publish("step", owner.view());
    s1.finish();
    hb.stream_synchronize(owner.handle());
    t.expect(ferry::testing::h2d_access::storage(pub) == storage, tag + ": storage changed across recovery");
    for (const auto& [id, bytes] : want) {
      const auto got = read_back(hb, pub.device_pointer(fh::buffer_handle{id}), bytes.size());
      t.expect(got == bytes, tag + ": device bytes wrong after recovery, buffer #" + std::to_string(id));
    }
  } catch (const std::exception& e) {
    t.fail(tag + ": recovery failed: " + e.what());
  }
}

void sweep_h2d(tally& t, sweep_stats& st)
{
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct,
                 fh::upload_backend::batch}) {
    fb::fault_plan plan;
    std::uint64_t n = 0;
    h2d_sticky_case(k, plan, fb::fault_plan::never, n, t, st);
    std::printf("h2d %s: scenario makes %llu backend calls\n", std::string{fh::to_string(k)}.c_str(),
                static_cast<unsigned long long>(n));
    for (std::uint64_t i = 0; i < n; ++i) { h2d_sticky_case(k, plan, i, n, t, st); }
  }
}

}  // namespace
}  // namespace ferry::rel

int main(int argc, char** argv)
{
  const std::string_view what = argc > 1 ? argv[1] : "all";
  ferry::rel::tally t;
  ferry::rel::sweep_stats st;
  const auto t0 = std::chrono::steady_clock::now();
  if (what == "d2h" || what == "all") { ferry::rel::sweep_d2h(t, st); }
  if (what == "h2d" || what == "all") { ferry::rel::sweep_h2d(t, st); }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("sweep: %llu scenarios, %llu faults injected (%llu indices not reached), %llu entries delivered, "
              "%.1f s\n",
              static_cast<unsigned long long>(st.scenarios), static_cast<unsigned long long>(st.injected),
              static_cast<unsigned long long>(st.not_reached), static_cast<unsigned long long>(st.delivered), secs);
  std::printf("sweep: %llu faults injected, %llu failures\n", static_cast<unsigned long long>(st.injected),
              static_cast<unsigned long long>(t.failures));
  return t.failures == 0 ? 0 : 1;
}
