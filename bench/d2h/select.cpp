// SPDX-License-Identifier: Apache-2.0
// ferry_bench_select: selective capture under continuous batching (issue 27), graph replays of a simulated
// forward (28 layers of a spin kernel; the spin per layer is set so that the no-capture step takes what a
// Qwen3-0.6B-shaped step of that many tokens takes on the H200: bench/d2h/README.md) with DMI's vllm-full hook
// sizes per token (forward_sizes, 341 hooks; hidden-states: 28 hooks of 2 KiB), every hook a [tokens, row] tensor.
// Each step the row selection is uploaded by ferry's own h2d::publisher (both halves of ferry in one engine step),
// then the graph is replayed; every delivered entry is checked row by row against the step's selection, which the
// consumer finds through the entry's forward tag (attribution). Contestants, round-robin in one run:
//   none          the forward alone
//   full_gather   every row of every hook (capture_deferred: one gather per batch)
//   select        the selected rows of every hook, one select_rows kernel per hook (capture_rows)
//   select_gather the selected rows, one gather_rows_publish per batch (capture_rows_deferred)
// A step's time is the wall time of `steps` back-to-back steps (publish, plan, replay) until the compute stream
// finished, divided by `steps`: the drain's copies run beside it and any backpressure they cause (a full ring
// blocks plan()) is inside; after each round the run waits for every entry to be checked (the lag is reported).
// The consumer hands each entry to a pool of checker threads, which compare every row with the host's copy.
// Usage: ferry_bench_select [--quick|--full] [K] > select_raw.json   (K: publish_every, default 128: one gather per
// 128 hooks, 3 per vllm-full forward; medians in microseconds; JSON on stdout)
#include "common.hpp"

#include <ferry/h2d.hpp>
#include <ferry/testing/pattern.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>

namespace ferry::bench {
namespace {

namespace fh = ferry::h2d;
using clk = std::chrono::steady_clock;

enum class mode { none, full_gather, select, select_gather };
const char* mode_name(mode m)
{
  switch (m) {
    case mode::none: return "none";
    case mode::full_gather: return "full_gather";
    case mode::select: return "select";
    default: return "select_gather";
  }
}

struct scenario {
  std::string name;
  std::uint64_t tokens;        ///< rows per hook
  std::uint64_t spin_ns;       ///< per layer (28 layers)
  std::vector<std::uint64_t> row_bytes;  ///< per hook, a multiple of 8
  std::uint64_t picked;        ///< rows selected per step (0: the last token of each of `requests`)
  std::uint64_t requests;      ///< last-token scenarios: requests of tokens / requests tokens each
  std::vector<mode> modes;
  std::uint32_t k{16};  ///< config::publish_every of every channel
};

struct result {
  std::unordered_map<std::string, double> us;
  std::atomic<std::uint64_t> checked{0}, bad{0};  ///< every contestant's drain thread adds
};

/// Word k of row r of a hook with `rb`-byte rows: every hook reads the one activation buffer, word-indexed.
std::uint64_t word_of(std::uint64_t r, std::uint64_t rb, std::uint64_t k) { return ferry::testing::pattern_word(0, r * (rb / 8) + k); }

void run(const scenario& sc, int rounds, int steps, result& res)
{
  B b{};
  b.set_device(fb::device_id{0});
  const int sms = b.attributes(fb::device_id{0}).sm_count;
  fb::stream<B> s{b};
  const std::uint64_t H = sc.row_bytes.size(), T = sc.tokens, layers = 28;
  const std::uint64_t widest = *std::max_element(sc.row_bytes.begin(), sc.row_bytes.end());
  std::uint64_t full = 0;
  for (const auto rb : sc.row_bytes) { full += fd::align_up(T * rb, 16); }
  fb::device_buffer<B> act{T * widest, b};
  fill_device(b, s, act.data(), T * widest, 0);
  fb::device_buffer<B> aux{256, b};
  b.memset_async(aux.data(), 0, 256, s.handle());
  s.synchronize();
  // The step's metadata: the selected rows (or requests) and query_start_loc, published each step.
  const std::uint64_t picks = sc.picked != 0 ? sc.picked : sc.requests;
  fh::publisher<B> pub{b};
  auto sel_buf = pub.declare({.name = "selection", .groups = {"step"}, .unit = fh::count_unit::elements,
                              .element_size = 4, .capacity = picks});
  auto qsl_buf = pub.declare({.name = "query_start_loc", .groups = {"step"}, .unit = fh::count_unit::elements,
                              .element_size = 4, .capacity = sc.requests + 1});
  pub.initialize({.slots = 2, .device = b.current_device()}, s.view());
  const auto* sel_dev = static_cast<const std::int32_t*>(pub.device_pointer(sel_buf));
  const auto* qsl_dev = static_cast<const std::int32_t*>(pub.device_pointer(qsl_buf));
  const fd::row_selection sel = sc.picked != 0
                                  ? fd::row_selection::rows(sel_dev, picks)
                                  : fd::row_selection::last_token(qsl_dev, static_cast<std::uint32_t>(sc.requests), sel_dev, picks);
  std::mt19937_64 rng{42};
  std::mutex m;
  std::unordered_map<std::uint64_t, std::vector<std::int64_t>> rows_of_step;  // tag -> source rows
  std::atomic<std::uint64_t> delivered{0};
  // The consumer: the drain hands every entry to a pool of checker threads (a checker on the drain thread
  // would be the bottleneck); each row is compared with the activation's row on the host (memcmp).
  std::vector<std::byte> host_act(T * widest);
  for (std::uint64_t i = 0; i < T * widest / 8; ++i) {
    const std::uint64_t w = ferry::testing::pattern_word(0, i);
    std::memcpy(host_act.data() + i * 8, &w, 8);
  }
  struct pool {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<fd::entry_view, bool>> q;
    bool stop{false};
    std::vector<std::thread> threads;
    void push(fd::entry_view&& e, bool whole)
    {
      {
        std::lock_guard lock{mu};
        q.emplace_back(std::move(e), whole);
      }
      cv.notify_one();
    }
  } checker;
  auto check = [&](const fd::entry_view& e, bool whole) {
    const std::uint64_t rb = sc.row_bytes[e.hook().value];
    std::vector<std::int64_t> rows;
    if (whole) {
      return e.ok() && e.size() == T * rb && std::memcmp(e.bytes().data(), host_act.data(), T * rb) == 0;
    }
    {
      std::lock_guard lock{m};
      rows = rows_of_step.at(e.tag());
    }
    bool ok = e.ok() && e.size() == rows.size() * rb;
    for (std::size_t j = 0; ok && j < rows.size(); ++j) {
      ok = std::memcmp(e.bytes().data() + j * rb, host_act.data() + static_cast<std::uint64_t>(rows[j]) * rb, rb) == 0;
    }
    return ok;
  };
  for (int t = 0; t < (host_mode ? 1 : 8); ++t) {
    checker.threads.emplace_back([&] {
      std::unique_lock lock{checker.mu};
      for (;;) {
        checker.cv.wait(lock, [&] { return checker.stop || !checker.q.empty(); });
        if (checker.q.empty()) { return; }
        auto [e, whole] = std::move(checker.q.front());
        checker.q.pop_front();
        lock.unlock();
        const bool ok = check(e, whole);
        e.release();
        res.checked.fetch_add(1);
        res.bad.fetch_add(ok ? 0 : 1);
        delivered.fetch_add(1, std::memory_order_release);
        lock.lock();
      }
    });
  }
  struct contestant {
    mode md;
    std::optional<fd::channel<B>> ch;
    fb::graph_exec<B> g;
    fd::forward_plan plan;
    std::uint64_t entries{0};
    std::vector<double> us;
    double lag_us{0};  ///< the longest wait, after a round's last step, for its last entry to be checked
  };
  std::vector<contestant> cs(sc.modes.size());
  for (std::size_t c = 0; c < cs.size(); ++c) {
    auto& x = cs[c];
    x.md = sc.modes[c];
    if (x.md != mode::none) {
      fd::config cfg;
      const std::uint64_t per_fwd = x.md == mode::full_gather ? full : full / T * picks + 16 * H;
      cfg.ring_bytes = fd::align_up(std::max<std::uint64_t>(3 * per_fwd, 1 << 20), 16);
      cfg.staging_bytes = cfg.ring_bytes;
      cfg.tuning.size_slots = static_cast<std::uint32_t>(4 * H);
      cfg.fifo_capacity = static_cast<std::uint32_t>(4 * H);
      cfg.timeout = std::chrono::seconds(60);
      cfg.publish_every = sc.k;  // K: one gather (and one release) per K hooks
      cfg.tuning.gather_batch = sc.k;
      x.ch.emplace(cfg, b, [&, md = x.md](fd::entry_view&& e) { checker.push(std::move(e), md == mode::full_gather); });
    }
    const fb::launch_config layer_shape{{static_cast<std::uint32_t>(sms)}, {256}, 0};
    x.g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> g) {
      if (x.ch) { x.ch->begin_forward(g); }
      for (std::uint64_t l = 0; l < layers; ++l) {
        layer_args la{aux.template as<std::uint64_t>(), H, 0, 0, nullptr, 0, sc.spin_ns, nullptr, nullptr};
        b.launch(layer_kernel(typename B::tag{}), layer_shape, g.handle(), la);
        for (std::uint64_t h = l * H / layers; h < (l + 1) * H / layers && x.ch; ++h) {
          const auto hk = fd::hook_id{static_cast<std::uint32_t>(h)};
          const std::uint64_t rb = sc.row_bytes[h];
          if (x.md == mode::full_gather) { x.ch->capture_deferred(hk, act.data(), T * rb, g); }
          if (x.md == mode::select) { x.ch->capture_rows(hk, act.data(), T, rb, sel, g); }
          if (x.md == mode::select_gather) { x.ch->capture_rows_deferred(hk, act.data(), T, rb, sel, g); }
        }
      }
      if (x.ch) { x.plan = x.ch->end_forward(g); }
    });
    x.entries = x.ch ? H : 0;
  }
  std::uint64_t step = 0;
  auto one_step = [&](contestant& x) {
    // the scheduler's step: which rows (or requests) want capture, published before the replay
    std::vector<std::int32_t> pick(picks);
    std::vector<std::int64_t> rows(picks);
    std::vector<std::int32_t> qsl(sc.requests + 1);
    for (std::uint64_t r = 0; r <= sc.requests; ++r) { qsl[r] = static_cast<std::int32_t>(r * (T / std::max<std::uint64_t>(sc.requests, 1))); }
    for (std::uint64_t k = 0; k < picks; ++k) {
      if (sc.picked != 0) {
        rows[k] = pick[k] = static_cast<std::int32_t>(rng() % T);
      } else {
        pick[k] = static_cast<std::int32_t>(sc.requests - 1 - k);  // every request, in reverse order
        rows[k] = qsl[pick[k] + 1] - 1;
      }
    }
    auto slot = pub.begin(step % 2);
    {
      auto p = pub.producer("step");
      std::memcpy(p.source<std::int32_t>(sel_buf).data(), pick.data(), picks * 4);
      p.set_count(sel_buf, picks);
      std::memcpy(p.source<std::int32_t>(qsl_buf).data(), qsl.data(), qsl.size() * 4);
      p.set_count(qsl_buf, qsl.size());
    }
    pub.publish("step", s.view());
    {
      std::lock_guard lock{m};
      rows_of_step[step] = std::move(rows);
    }
    if (x.ch) {
      fd::forward_meta meta;
      meta.tag = step;
      x.ch->replay(x.g, x.plan, s.view(), std::move(meta));
    } else {
      x.g.launch(s.view());
    }
    slot.finish();
    ++step;
  };
  for (int r = -1; r < rounds; ++r) {  // round -1: warm-up
    for (auto& x : cs) {
      const std::uint64_t want = delivered.load() + x.entries * static_cast<std::uint64_t>(steps);
      s.synchronize();
      const auto t0 = clk::now();
      for (int k = 0; k < steps; ++k) { one_step(x); }
      s.synchronize();  // the engine's steps: any backpressure of the capture (a full ring) is inside
      const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / steps;
      const auto t1 = clk::now();
      while (delivered.load(std::memory_order_acquire) < want) { std::this_thread::yield(); }
      x.lag_us = std::max(x.lag_us, std::chrono::duration<double, std::micro>(clk::now() - t1).count());
      if (r >= 0) { x.us.push_back(us); }
    }
  }
  for (auto& x : cs) {
    if (x.ch) { (void)x.ch->close(); }
    res.us[mode_name(x.md)] = median(x.us);
    std::fprintf(stderr, "ferry_bench_select %s %s: median %.1f us/step (min %.1f, max %.1f, %zu rounds of %d steps; "
                 "drain lag after a round <= %.0f us)\n",
                 sc.name.c_str(), mode_name(x.md), median(x.us), *std::min_element(x.us.begin(), x.us.end()),
                 *std::max_element(x.us.begin(), x.us.end()), x.us.size(), steps, x.lag_us);
  }
  {
    std::lock_guard lock{checker.mu};
    checker.stop = true;
  }
  checker.cv.notify_all();
  for (auto& t : checker.threads) { t.join(); }
}

std::vector<std::uint64_t> vllm_rows()
{
  std::vector<std::uint64_t> v = forward_sizes(341, true);
  v.front() = 8;  // token ids (int64)
  return v;
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv)
{
  using namespace ferry::bench;
  const bool quick = host_mode || (argc > 1 && std::string{argv[1]} == "--quick");
  const int rounds = quick ? 3 : 15, steps = quick ? 2 : 20;
  const std::uint64_t scale = quick ? 16 : 1;  // the host backend: 1/16 of the tokens
  const std::vector<std::uint64_t> hidden(28, 2 * KiB);
  const std::uint32_t k = argc > 2 ? static_cast<std::uint32_t>(std::stoul(argv[2])) : 128;  // --quick K
  std::vector<scenario> all{
    {"d2h_t256_select16", 256 / scale, 107'000, vllm_rows(), 16 / scale, 1,
     {mode::none, mode::full_gather, mode::select, mode::select_gather}},
    {"d2h_t16_full", 16, 60'000, vllm_rows(), 0, 1, {mode::none, mode::full_gather}},
    {"prefill_last_token_hidden_states", 8192 / scale, 900'000 / scale, hidden, 0, 16, {mode::none, mode::select_gather}},
    {"prefill_last_token_vllm_full", 8192 / scale, 900'000 / scale, vllm_rows(), 0, 16, {mode::none, mode::select_gather}}};
  std::printf("{\"host_backend\": %s, \"publish_every\": %u", host_mode ? "true" : "false", k);
  for (auto& sc : all) {
    sc.k = k;
    result r;
    run(sc, rounds, steps, r);
    std::printf(",\n \"%s\": {", sc.name.c_str());
    for (const auto& [k, v] : r.us) { std::printf("\"%s_us\": %.2f, ", k.c_str(), v); }
    std::printf("\"entries_checked\": %llu, \"entries_bad\": %llu}", static_cast<unsigned long long>(r.checked.load()),
                static_cast<unsigned long long>(r.bad.load()));
  }
  std::printf("}\n");
  return 0;
}
