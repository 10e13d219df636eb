// SPDX-License-Identifier: Apache-2.0
// D2H publication benchmarks (Google Benchmark). Self-checking: every entry ferry delivers is verified
// (every word in the simulated forward, sampled words in the large-payload runs); the binary exits
// non-zero when any entry is bad.
//
//   1. per_hook_graph/<bytes>: hooks captured back to back in one graph; GPU time of a replay (events),
//      median over replays, divided by the hooks: copy only, old volatile flag, per-entry st.release.sys,
//      ferry with K in {1, 4, 16, 64} (+ plain launch, inline releases, pinned head). The baselines are
//      replayed round-robin beside each ferry configuration (per_hook_table), so drift hits all alike.
//   2. forward/<variant>/hooks:<28|341>: 28 layers of a ~60 us spin kernel, 16 KiB per hook, graph replay,
//      drain running: no capture, copy only, old volatile, per-entry release, ferry (K = 16).
//   3. drain/64MiB: ferry's drain bandwidth with 64 MiB entries, and the plain pinned D2H ceiling.
//
//   4. variants/...: copy layouts x publication placement (per hook at 4/16/64 KiB, and the 341-hook
//      forward with diagnostics: drain paused, publications only at the forward end). Printed as a table
//      at the end and written under "variants" in the JSON. FERRY_D2H_VARIANTS=0 leaves them out.
//
// Flags: --ferry_json=PATH writes the summary JSON (env FERRY_COMMIT, FERRY_DATE, FERRY_COMMAND fill
// commit/date/command). Everything else goes to Google Benchmark.
#include "bench_kernels.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/testing/pattern.hpp>

#if defined(FERRY_BENCH_CUDA)
#include <ferry/backend/cuda/backend.hpp>
#endif

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace bk = ferry::bench;

#if defined(FERRY_BENCH_CUDA)
using B = fb::cuda_backend;
constexpr bool host_mode = false;
#else
using B = fb::host_backend;
constexpr bool host_mode = true;
#endif

constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;

// ---------------------------------------------------------------------------------------------------
struct results_t {
  std::map<std::uint64_t, std::map<std::string, double>> forward;    // hooks -> variant -> us/forward
  std::map<std::uint64_t, std::map<std::string, double>> per_hook;   // bytes -> variant -> us/hook
  std::map<std::string, std::map<std::uint64_t, double>> variants;  // variant -> bytes -> us/hook
  std::map<std::string, double> fwd_variants;                        // variant -> us/forward (341 hooks)
  std::optional<double> drain_gbps, memcpy_gbps;
  std::atomic<std::uint64_t> checked{0}, bad{0};                    // ferry entries
  std::atomic<std::uint64_t> baseline_checked{0}, baseline_bad{0};  // baseline drains (old volatile is invalid)
  std::string device{"?"};
};
results_t& results()
{
  static results_t r;
  return r;
}

double median(std::vector<double> v)
{
  if (v.empty()) { return 0; }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Words of an entry equal pattern_word(seq, i): all of them, or a sample (first, last, every 4096th).
bool check_words(const std::byte* p, std::uint64_t bytes, std::uint64_t seq, bool all)
{
  const std::uint64_t words = bytes / 8;
  auto ok = [&](std::uint64_t i) {
    std::uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    return w == ferry::testing::pattern_word(seq, i);
  };
  if (words == 0) { return true; }
  if (all) {
    for (std::uint64_t i = 0; i < words; ++i) {
      if (!ok(i)) { return false; }
    }
    return true;
  }
  for (std::uint64_t i = 0; i < words; i += 4096) {
    if (!ok(i)) { return false; }
  }
  return ok(words - 1);
}

void fill_device(B b, fb::stream<B>& s, void* dev, std::uint64_t bytes, std::uint64_t seq)
{
  fb::pinned_buffer<B> h{bytes, b};
  auto* w = h.template as<std::uint64_t>();
  for (std::uint64_t i = 0; i < bytes / 8; ++i) { w[i] = ferry::testing::pattern_word(seq, i); }
  b.memcpy_async(dev, h.data(), bytes, fb::memcpy_kind::host_to_device, s.handle());
  s.synchronize();
}

/// A copy-kernel launch layout (the fd::config knobs of the same names). The copy-only baseline launches
/// its kernel (same body as ferry's) with exactly the shape ferry's channel would use for the entry.
struct shape_opts {
  std::string label{"default"};
  std::uint32_t threads{fd::config{}.copy_block_threads};
  std::uint32_t vpt{fd::config{}.copy_vecs_per_thread};
  std::uint64_t single_max{fd::config{}.single_block_copy_max_bytes};
  std::uint64_t fused_max{fd::config{}.fused_copy_max_bytes};
  bool programmatic{fd::config{}.programmatic_launch};  ///< programmatic dependent launch (sm_90+ only)
  bool branch{fd::config{}.branch_publish};             ///< batch releases on a forked branch (ferry only)
  bool drain_paused{false};  ///< per-hook ferry runs: drain in poll mode, polled only between replays
};
/// The layout before the shape knobs (one 1-vector-per-thread block up to 32 KiB, 256-thread blocks above):
/// today's published numbers. The old-design baselines (per-entry flag) keep it: one block, no grid join.
shape_opts legacy_shape() { return {"legacy", 256, 1, 32 * KiB, 32 * KiB, false}; }
/// The default layout launched plainly (no programmatic dependent launch): what PDL buys.
shape_opts plain_shape()
{
  shape_opts o;
  o.label = "plain";
  o.programmatic = false;
  return o;
}

/// Whether the copy-only baseline may be launched programmatically: the same rule as ferry's channel
/// (device sm_90+ and the loaded code contains griddepcontrol.wait).
bool programmatic_ok()
{
  static const bool ok = [] {
    B b{};
    const auto a = b.attributes(fb::device_id{0});
    return fb::programmatic_launch_ok(a.compute_capability_major, b.preload(bk::bench_copy_kernel(typename B::tag{})));
  }();
  return ok;
}

void apply(fd::config& cfg, const shape_opts& o)
{
  cfg.copy_block_threads = o.threads;
  cfg.copy_vecs_per_thread = o.vpt;
  cfg.single_block_copy_max_bytes = o.single_max;
  cfg.fused_copy_max_bytes = o.fused_max;
  cfg.programmatic_launch = o.programmatic;
  cfg.branch_publish = o.branch;
  if (o.drain_paused) { cfg.drain = fd::drain_mode::poll; }
}

/// Mirrors channel::launch_copy for a non-publishing entry.
fb::launch_config copy_shape(std::uint64_t bytes, int sms, const shape_opts& o)
{
  const std::uint64_t vpt = o.vpt == 8 || o.vpt == 4 || o.vpt == 2 ? o.vpt : 1;
  const std::uint64_t per_thread = ((bytes + 15) / 16 + vpt - 1) / vpt;
  const bool programmatic = o.programmatic && programmatic_ok();
  if (bytes <= o.single_max) {
    const auto threads = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((per_thread + 31) / 32 * 32, 32, 1024));
    return {{1}, {threads}, 0, programmatic};
  }
  const std::uint64_t threads = std::clamp<std::uint64_t>((o.threads + 31) / 32 * 32, 32, 1024);
  const std::uint64_t max_blocks = static_cast<std::uint64_t>(sms) * std::max<std::uint64_t>(1, 2048 / threads);
  const auto blocks = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((per_thread + threads - 1) / threads, 1, max_blocks));
  return {{blocks}, {static_cast<std::uint32_t>(threads)}, 0, programmatic};
}
std::uint32_t vpt_of(const shape_opts& o) { return o.vpt == 8 || o.vpt == 4 || o.vpt == 2 ? o.vpt : 1; }

/// ferry_kernel (diagnostic): ferry's own copy kernel (copy_entry, real ring_ref and cursor chain) launched
/// by the copy-only harness, with no channel: no FIFO, no drain, no release kernels.
enum class variant { no_capture, copy_only, old_volatile, per_entry_release, ferry, ferry_kernel };
const char* name(variant v)
{
  switch (v) {
    case variant::no_capture: return "no_capture";
    case variant::copy_only: return "copy_only";
    case variant::old_volatile: return "old_volatile";
    case variant::per_entry_release: return "per_entry_release";
    case variant::ferry: return "ferry";
    case variant::ferry_kernel: return "ferry_kernel";
  }
  return "?";
}


template <class Tag>
auto baseline_kernel(variant v, Tag tag)
{
  if (v == variant::old_volatile) { return bk::baseline_volatile_kernel(tag); }
  if (v == variant::per_entry_release) { return bk::baseline_sysflag_kernel(tag); }
  return bk::bench_copy_kernel(tag);
}

std::string env_or(const char* k, const char* d)
{
  const char* v = std::getenv(k);
  return v != nullptr ? v : d;
}

// ---------------------------------------------------------------------------------------------------
/// variant::ferry_kernel: ferry's multi-block copy kernel for the h-th entry of a forward, as the channel
/// would launch it (ring_ref over `ring`, cursor slot parity h % 2), without a channel.
void launch_ferry_kernel(B b, fb::stream_view<B> cs, const fb::launch_config& launch, void* ring,
                         std::uint64_t ring_bytes, void* state, std::uint64_t h, std::uint64_t bytes,
                         std::uint32_t vpt, const void* src)
{
  fd::ring_ref r;
  r.ring = static_cast<std::byte*>(ring);
  r.state = static_cast<fd::device_state*>(state);
  r.ring_bytes = ring_bytes;
  r.reserved = fd::align_up(bytes, fd::entry_alignment);
  r.parity = static_cast<std::uint32_t>(h % 2);
  fd::detail::copy_args a{r, static_cast<const std::byte*>(src), bytes};
  a.vecs_per_thread = vpt;
  b.launch(fd::detail::copy_entry_kernel(typename B::tag{}), launch, cs.handle(), a);
}

// ---------------------------------------------------------------------------------------------------
// 1. per hook in a graph. A contestant is one captured graph of `hooks` back-to-back hooks, plus what runs
// around each of its replays (ferry: plan() before; with a paused drain, polling after). Contestants are
// replayed round-robin and each one's median replay time is taken: slow drifts (clocks, the machine) hit
// every contestant alike, so their differences are what the design costs.
struct per_hook_rig {
  B b{};
  std::uint64_t P, hooks, slots;
  int sms;
  fb::stream<B> s{b};
  fb::device_buffer<B> src, ring, aux, state;
  fb::mapped_buffer<B> flag;
  static std::uint64_t ring_cap() { return host_mode ? 64 * MiB : 1024 * MiB; }
  explicit per_hook_rig(std::uint64_t p)
    : P{p}, hooks{std::max<std::uint64_t>(1, std::min<std::uint64_t>(host_mode ? 64 : 512, ring_cap() / p / 2))},
      slots{std::max<std::uint64_t>(1, std::min<std::uint64_t>(hooks, ring_cap() / p))},
      sms{b.attributes(fb::device_id{0}).sm_count}, src{p + 256, b}, ring{slots * p + 256, b}, aux{256, b},
      state{256, b}, flag{128, b}
  {
    fill_device(b, s, src.data(), P, 7);
    // A zero word past the payload and past the ring's last slot (diagnostic cursor_modes 7 and 8).
    b.memset_async(static_cast<std::byte*>(src.data()) + P, 0, 256, s.handle());
    b.memset_async(static_cast<std::byte*>(ring.data()) + slots * P, 0, 256, s.handle());
    b.memset_async(aux.data(), 0, 256, s.handle());  // [0] forward counter (u64), [64] join counter (u32)
    b.memset_async(state.data(), 0, 256, s.handle());  // a device_state, or cursor_mode 5's two lines
    s.synchronize();
  }
  [[nodiscard]] int rounds() const { return host_mode ? 5 : (P <= MiB ? 40 : 15); }
};

struct contestant {
  std::string name;
  std::optional<fb::graph_exec<B>> g;
  std::function<void()> before{[] {}};
  std::function<void(int)> after{[](int) {}};  ///< argument: replays of this contestant so far
  std::shared_ptr<fd::channel<B>> ch;
  std::vector<double> ms;
  int replays{0};
  [[nodiscard]] double us_per_hook(std::uint64_t hooks) const { return median(ms) * 1000.0 / static_cast<double>(hooks); }
};

/// A contestant of the copy harness: copy only / old volatile / per-entry release (bench kernels), or
/// ferry's own copy kernel without a channel (variant::ferry_kernel). `cursor_mode` as in bk::copy_args.
contestant copy_contestant(per_hook_rig& r, std::string name, variant v, const shape_opts& sh, std::uint32_t cursor_mode = 0)
{
  contestant c;
  c.name = std::move(name);
  auto* fwd = r.aux.template as<std::uint64_t>();
  auto* join = reinterpret_cast<unsigned*>(static_cast<std::byte*>(r.aux.data()) + 64);
  const auto launch = copy_shape(r.P, r.sms, sh);
  c.g.emplace(fb::graph_exec<B>::capture(r.s.view(), [&](fb::stream_view<B> cs) {
    for (std::uint64_t h = 0; h < r.hooks; ++h) {
      if (v == variant::ferry_kernel) {  // cursor_mode 1: every entry at parity 0 (no cursor chain)
        launch_ferry_kernel(r.b, cs, launch, r.ring.data(), r.slots * r.P, r.state.data(), cursor_mode == 1 ? 0 : h,
                            r.P, vpt_of(sh), r.src.data());
        continue;
      }
      bk::copy_args a{static_cast<std::byte*>(r.ring.data()) + (h % r.slots) * r.P,
                      static_cast<const std::byte*>(r.src.data()), r.P, r.flag.template device_as<std::uint64_t>(), fwd,
                      r.hooks, h, join, vpt_of(sh), cursor_mode, fwd + 16};  // aux[128..136): zero, its own line
      if (cursor_mode == 7) { a.cursor = reinterpret_cast<std::uint64_t*>(static_cast<std::byte*>(r.src.data()) + r.P); }
      if (cursor_mode == 8) { a.cursor = reinterpret_cast<std::uint64_t*>(static_cast<std::byte*>(r.ring.data()) + r.slots * r.P); }
      if (cursor_mode >= 3 && cursor_mode <= 6) {
        a.cursor = r.state.template as<std::uint64_t>();
        a.parity = static_cast<std::uint32_t>(h % 2);
        a.ring = static_cast<std::byte*>(r.ring.data());
        a.ring_bytes = r.slots * r.P;
      }
      r.b.launch(baseline_kernel(v, typename B::tag{}), launch, cs.handle(), a);
    }
  }));
  return c;
}

/// A ferry channel (publish_every = K) capturing the hooks; every delivered entry is checked.
contestant ferry_contestant(per_hook_rig& r, std::string name, std::uint32_t K, fd::head_placement placement,
                            const shape_opts& sh)
{
  contestant c;
  c.name = std::move(name);
  fd::config cfg;
  cfg.ring_bytes = fd::align_up(r.hooks * r.P * 2, 16);
  cfg.staging_bytes = std::min<std::uint64_t>(cfg.ring_bytes, host_mode ? 64 * MiB : 256 * MiB);
  cfg.publish_every = K;
  cfg.placement = placement;
  cfg.fifo_capacity = 4096;
  apply(cfg, sh);
  cfg.timeout = std::chrono::seconds(30);
  auto& R = results();
  const std::uint64_t P = r.P;
  c.ch = std::make_shared<fd::channel<B>>(cfg, r.b, [&R, P](fd::entry_view&& e) {
    R.checked.fetch_add(1);
    if (!e.ok() || e.size() != P || !check_words(e.bytes().data(), P, 7, false)) { R.bad.fetch_add(1); }
  });
  auto plan = std::make_shared<fd::forward_plan>();
  auto* ch = c.ch.get();
  c.g.emplace(fb::graph_exec<B>::capture(r.s.view(), [&](fb::stream_view<B> cs) {
    ch->begin_forward(cs);
    for (std::uint64_t h = 0; h < r.hooks; ++h) { ch->capture(fd::hook_id{static_cast<std::uint32_t>(h)}, r.src.data(), r.P, cs); }
    *plan = ch->end_forward(cs);
  }));
  c.before = [ch, plan] { ch->plan(*plan); };
  if (sh.drain_paused) {  // drain each replay outside the timed region
    const std::uint64_t hooks = r.hooks;
    c.after = [ch, hooks](int done) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (ch->stats().entries_drained < static_cast<std::uint64_t>(done) * hooks &&
             std::chrono::steady_clock::now() < deadline) {
        if (ch->poll() == 0) { std::this_thread::sleep_for(std::chrono::microseconds(20)); }
      }
    };
  }
  return c;
}

/// `rounds` rounds (after 3 warm-up rounds), each replaying every contestant once, in order.
void run_rounds(per_hook_rig& r, const std::vector<contestant*>& cs, int rounds)
{
  fb::event<B> e0{r.b, fb::event_flags::timing}, e1{r.b, fb::event_flags::timing};
  for (int k = 0; k < rounds + 3; ++k) {
    for (contestant* c : cs) {
      c->before();
      e0.record(r.s);
      c->g->launch(r.s);
      e1.record(r.s);
      e1.synchronize();
      c->after(++c->replays);
      if (k >= 3) { c->ms.push_back(e1.elapsed_ms_since(e0)); }
    }
  }
}

/// One contestant alone (the variant sweep).
double per_hook_us(variant v, std::uint64_t P, std::uint32_t K,
                   fd::head_placement placement = fd::head_placement::managed, std::optional<shape_opts> shape = {},
                   std::uint32_t cursor_mode = 0)
{
  const shape_opts sh = shape ? *shape : (v == variant::ferry || v == variant::copy_only || v == variant::ferry_kernel ? shape_opts{} : legacy_shape());
  per_hook_rig r{P};
  contestant c = v == variant::ferry ? ferry_contestant(r, "ferry", K, placement, sh) : copy_contestant(r, name(v), v, sh, cursor_mode);
  run_rounds(r, {&c}, r.rounds());
  if (c.ch) { (void)c.ch->close(); }
  return c.us_per_hook(r.hooks);
}

/// A named contestant, built on the table's rig when the table runs.
using contestant_maker = std::pair<std::string, std::function<contestant(per_hook_rig&)>>;
/// A copy-harness contestant (copy_contestant).
contestant_maker copy_maker(std::string n, variant v, shape_opts sh, std::uint32_t cursor_mode = 0)
{
  return {n, [=](per_hook_rig& r) { return copy_contestant(r, n, v, sh, cursor_mode); }};
}
/// A ferry channel contestant (ferry_contestant).
contestant_maker ferry_maker(std::string n, std::uint32_t K, fd::head_placement placement, shape_opts sh)
{
  return {n, [=](per_hook_rig& r) { return ferry_contestant(r, n, K, placement, sh); }};
}

/// The per-hook table for payload P: the copy-harness baselines are replayed in every round, beside one
/// ferry configuration at a time (one channel per device), so each ferry figure and the baselines' medians
/// come from interleaved replays.
void per_hook_table(std::uint64_t P, const std::vector<contestant_maker>& ferries,
                    const std::vector<contestant_maker>& baselines, std::map<std::string, double>& out)
{
  per_hook_rig r{P};
  std::vector<contestant> base;
  for (auto& [n, make] : baselines) { base.push_back(make(r)); }
  for (const auto& [n, make] : ferries) {
    contestant f = make(r);
    std::vector<contestant*> all;
    for (auto& c : base) { all.push_back(&c); }
    all.push_back(&f);
    run_rounds(r, all, r.rounds());
    (void)f.ch->close();
    out[n] = f.us_per_hook(r.hooks);
  }
  for (auto& c : base) { out[c.name] = c.us_per_hook(r.hooks); }
}

// ---------------------------------------------------------------------------------------------------
// 2. simulated forward
struct baseline_drain {
  // Per-entry D2H after the CPU sees the entry's flag (the old design's consumer), with verification.
  B b;
  std::uint64_t H, bytes;
  const std::byte* ring;  // 3 frames of H entries
  const std::uint64_t* flag;
  fb::stream<B> s;
  fb::pinned_buffer<B> staging;
  std::atomic<std::uint64_t> consumed{0};
  std::atomic<bool> stop{false};
  std::thread t;
  // One staging slot per ring slot (3 frames): the replay loop lets the drain fall up to three forwards
  // behind, so a batch [next, f) may hold entries e and e + H; with one frame of staging they shared a slot
  // and the first was overwritten before it was checked (reported as bad entries of the baseline).
  baseline_drain(B be, std::uint64_t h, std::uint64_t by, const std::byte* r, const std::uint64_t* f)
    : b{be}, H{h}, bytes{by}, ring{r}, flag{f}, s{be}, staging{3 * h * by, be}
  {
    t = std::thread([this] { run(); });
  }
  void run()
  {
    b.set_device(fb::device_id{0});
    auto& R = results();
    std::uint64_t next = 0;
    while (!stop.load()) {
      const std::uint64_t f = fb::host_load_acquire(flag);
      if (f <= next) {
        std::this_thread::yield();
        continue;
      }
      for (std::uint64_t e = next; e < f; ++e) {
        const std::uint64_t frame = (e / H) % 3, h = e % H;
        b.memcpy_async(static_cast<std::byte*>(staging.data()) + (frame * H + h) * bytes, ring + (frame * H + h) * bytes, bytes,
                       fb::memcpy_kind::device_to_host, s.handle());
      }
      s.synchronize();
      for (std::uint64_t e = next; e < f; ++e) {
        R.baseline_checked.fetch_add(1);
        if (!check_words(static_cast<const std::byte*>(staging.data()) + (e % (3 * H)) * bytes, bytes, e, true)) {
          R.baseline_bad.fetch_add(1);
        }
      }
      next = f;
      consumed.store(next);
    }
  }
  ~baseline_drain()
  {
    stop.store(true);
    t.join();
  }
};

/// Forward options for the diagnostic variants: copy layout, K, and `drain_paused` (drain in poll mode,
/// polled only between replays: the replay runs with no D2H traffic and no drain thread, isolating the
/// drain's contention with the forward).
struct fwd_opts {
  std::optional<shape_opts> shape;
  std::uint32_t K{16};
  bool drain_paused{false};
};

double forward_us(variant v, std::uint64_t H, fd::head_placement placement = fd::head_placement::managed,
                  const fwd_opts& o = {})
{
  const shape_opts sh = o.shape ? *o.shape : (v == variant::ferry || v == variant::copy_only || v == variant::ferry_kernel ? shape_opts{} : legacy_shape());
  B b{};
  b.set_device(fb::device_id{0});
  const int sms = b.attributes(fb::device_id{0}).sm_count;
  fb::stream<B> s{b};
  constexpr std::uint64_t layers = 28, bytes = 16 * KiB, spin_ns = 60'000;
  const int replays = host_mode ? 5 : 200;
  fb::device_buffer<B> act{H * bytes, b};
  fb::device_buffer<B> ring{3 * H * bytes, b};
  fb::device_buffer<B> aux{256, b};
  fb::device_buffer<B> state{sizeof(fd::device_state), b};
  fb::mapped_buffer<B> flag{128, b};
  fb::host_store_release(flag.template as<std::uint64_t>(), 0);
  b.memset_async(aux.data(), 0, 256, s.handle());
  b.memset_async(state.data(), 0, sizeof(fd::device_state), s.handle());
  s.synchronize();
  auto* fwd = aux.template as<std::uint64_t>();
  auto* join = reinterpret_cast<unsigned*>(static_cast<std::byte*>(aux.data()) + 64);
  const auto shape = copy_shape(bytes, sms, sh);
  const fb::launch_config layer_shape{{host_mode ? 1U : static_cast<std::uint32_t>(sms)}, {256}, 0};
  auto& R = results();
  std::atomic<std::uint64_t> delivered{0};

  std::optional<fd::channel<B>> ch;
  if (v == variant::ferry) {
    fd::config cfg;
    cfg.ring_bytes = 4 * H * bytes;
    cfg.publish_every = o.K;
    cfg.placement = placement;
    cfg.timeout = std::chrono::seconds(30);
    apply(cfg, sh);
    if (o.drain_paused) { cfg.drain = fd::drain_mode::poll; }
    ch.emplace(cfg, b, [&R, &delivered](fd::entry_view&& e) {
      delivered.fetch_add(1);
      R.checked.fetch_add(1);
      if (!e.ok() || e.size() != bytes || !check_words(e.bytes().data(), bytes, e.seq().value, true)) { R.bad.fetch_add(1); }
    });
  }
  fd::forward_plan plan;
  auto capture_forward = [&](std::uint64_t frame) {
    return fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      if (ch) { ch->begin_forward(cs); }
      for (std::uint64_t l = 0; l < layers; ++l) {
        const std::uint64_t first = l * H / layers, last = (l + 1) * H / layers;
        bk::layer_args la{fwd, H, first, last - first, static_cast<std::byte*>(act.data()), bytes, spin_ns};
        b.launch(bk::layer_kernel(typename B::tag{}), layer_shape, cs.handle(), la);
        for (std::uint64_t h = first; h < last && v != variant::no_capture; ++h) {
          const std::byte* src = static_cast<const std::byte*>(act.data()) + h * bytes;
          if (v == variant::ferry) {
            ch->capture(fd::hook_id{static_cast<std::uint32_t>(h)}, src, bytes, cs);
          } else if (v == variant::ferry_kernel) {
            launch_ferry_kernel(b, cs, shape, ring.data(), 3 * H * bytes, state.data(), h, bytes, vpt_of(sh), src);
          } else {
            bk::copy_args a{static_cast<std::byte*>(ring.data()) + (frame * H + h) * bytes, src, bytes,
                            flag.template device_as<std::uint64_t>(), fwd, H, h, join, vpt_of(sh)};
            b.launch(baseline_kernel(v, typename B::tag{}), shape, cs.handle(), a);
          }
        }
      }
      if (ch) { plan = ch->end_forward(cs); }
      b.launch(bk::next_forward_kernel(typename B::tag{}), fb::launch_config{{1}, {1}, 0}, cs.handle(), fwd);
    });
  };
  const bool framed = v == variant::old_volatile || v == variant::per_entry_release;
  std::vector<fb::graph_exec<B>> graphs;
  for (std::uint64_t f = 0; f < (framed ? 3U : 1U); ++f) { graphs.push_back(capture_forward(f)); }
  std::unique_ptr<baseline_drain> drain;
  if (framed) {
    drain = std::make_unique<baseline_drain>(b, H, bytes, static_cast<const std::byte*>(ring.data()),
                                             flag.template as<std::uint64_t>());
  }
  fb::event<B> e0{b, fb::event_flags::timing}, e1{b, fb::event_flags::timing};
  std::vector<double> ms;
  const int total = replays + 3;
  for (int r = 0; r < total; ++r) {
    if (ch) { ch->plan(plan); }
    if (drain) {  // the frame this replay overwrites was consumed (backpressure, as ferry's plan() gives)
      while (static_cast<std::int64_t>(drain->consumed.load()) < (r - 2) * static_cast<std::int64_t>(H)) {
        std::this_thread::yield();
      }
    }
    e0.record(s);
    graphs[framed ? r % 3 : 0].launch(s);
    e1.record(s);
    e1.synchronize();
    if (r >= 3) { ms.push_back(e1.elapsed_ms_since(e0)); }
    if (ch && o.drain_paused) {  // drain this replay's entries now, outside the timed region
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (delivered.load() < static_cast<std::uint64_t>(r + 1) * H && std::chrono::steady_clock::now() < deadline) {
        if (ch->poll() == 0) { std::this_thread::sleep_for(std::chrono::microseconds(20)); }
      }
    }
  }
  if (drain) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (drain->consumed.load() < static_cast<std::uint64_t>(total) * H && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    drain.reset();
  }
  if (ch) { (void)ch->close(); }
  return median(ms) * 1000.0;
}

// ---------------------------------------------------------------------------------------------------
// 3. drain bandwidth
double drain_gbps()
{
  B b{};
  b.set_device(fb::device_id{0});
  fb::stream<B> s{b};
  constexpr std::uint64_t P = 64 * MiB;
  const std::uint64_t n = host_mode ? 6 : 48;
  fb::device_buffer<B> src{P, b};
  fill_device(b, s, src.data(), P, 7);
  fd::config cfg;
  cfg.ring_bytes = host_mode ? 128 * MiB : 1024 * MiB;
  cfg.staging_bytes = host_mode ? 128 * MiB : 512 * MiB;
  cfg.publish_every = 4;
  cfg.fused_copy_max_bytes = 32 * KiB;
  cfg.timeout = std::chrono::seconds(60);
  auto& R = results();
  std::atomic<std::uint64_t> done{0};
  fd::channel<B> ch{cfg, b, [&](fd::entry_view&& e) {
                      R.checked.fetch_add(1);
                      if (!e.ok() || e.size() != P || !check_words(e.bytes().data(), P, 7, false)) { R.bad.fetch_add(1); }
                      done.fetch_add(1);
                    }};
  const auto t0 = std::chrono::steady_clock::now();
  ch.begin_forward(s);
  for (std::uint64_t i = 0; i < n; ++i) { ch.capture(fd::hook_id{1}, src.data(), P, s); }
  (void)ch.end_forward(s);
  while (done.load() < n) { std::this_thread::sleep_for(std::chrono::microseconds(50)); }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (void)ch.close();
  return static_cast<double>(n * P) / sec / 1e9;
}

double memcpy_gbps()
{
  B b{};
  b.set_device(fb::device_id{0});
  fb::stream<B> s{b};
  constexpr std::uint64_t P = 64 * MiB;
  const int n = host_mode ? 6 : 48;
  fb::device_buffer<B> src{P, b};
  fb::pinned_buffer<B> dst{P, b};
  fb::event<B> e0{b, fb::event_flags::timing}, e1{b, fb::event_flags::timing};
  b.memcpy_async(dst.data(), src.data(), P, fb::memcpy_kind::device_to_host, s.handle());  // warm
  e0.record(s);
  for (int i = 0; i < n; ++i) { b.memcpy_async(dst.data(), src.data(), P, fb::memcpy_kind::device_to_host, s.handle()); }
  e1.record(s);
  e1.synchronize();
  return static_cast<double>(n * P) / (e1.elapsed_ms_since(e0) / 1e3) / 1e9;
}

// ---------------------------------------------------------------------------------------------------
// 4. variant sweep (--benchmark_filter=variants): copy layouts x publication placement, side by side.
//   per hook (graph, K = 16 for ferry): <layout>/copy_only, <layout>/ferry_k16 (the layout's releases:
//   on the branch by default), <layout>/ferry_k16_sep (inline releases, never fused: every entry
//   multi-block and a 1-thread publish kernel every 16 on the compute stream); layouts "single_xV" copy
//   every entry <= 32 KiB with one block. One configuration at a time (not round-robin).
//   forward (341 hooks): which part of ferry's cost over copy-only comes from the layout, the drain
//   running during the forward (drain_paused) or the publications (k_inf: only the forward-end release).
std::vector<shape_opts> variant_shapes()
{
  std::vector<shape_opts> v;
  v.push_back(legacy_shape());
  v.push_back(plain_shape());
  for (std::uint32_t vpt : {2U, 4U}) { v.push_back({"single_x" + std::to_string(vpt), 256, vpt, 32 * KiB, 32 * KiB}); }
  for (auto [t, vpt] : std::vector<std::pair<std::uint32_t, std::uint32_t>>{
         {64, 1}, {128, 1}, {256, 1}, {64, 2}, {128, 2}, {256, 2}, {128, 4}, {256, 4}, {128, 8}}) {
    v.push_back({"s" + std::to_string(t) + "x" + std::to_string(vpt), t, vpt, 0, 32 * KiB});
  }
  return v;
}

/// One measurement registered as a Google Benchmark run (one iteration, manual time in us): `measure` runs
/// it and returns the figure, reported under the counter `counter` ("us_per_hook" / "us_per_forward"), and
/// `record` files it into results() for the JSON summary.
void register_us(const std::string& bench_name, const char* counter, std::function<double()> measure,
                 std::function<void(double)> record)
{
  benchmark::RegisterBenchmark(bench_name.c_str(), [counter, measure, record](benchmark::State& st) {
    for (auto _ : st) {
      const double us = measure();
      st.SetIterationTime(us / 1e6);
      st.counters[counter] = us;
      record(us);
    }
  })->Iterations(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
}
void register_forward(const std::string& key, std::uint64_t H, std::function<double()> measure)
{
  register_us("forward/" + key + "/hooks:" + std::to_string(H), "us_per_forward", std::move(measure),
              [key, H](double us) { results().forward[H][key] = us; });
}
void register_variant(const std::string& name, std::uint64_t P, std::function<double()> fn)
{
  register_us("variants/" + name + "/" + std::to_string(P), "us_per_hook", std::move(fn),
              [name, P](double us) { results().variants[name][P] = us; });
}
void register_fwd_variant(const std::string& name, variant v, fwd_opts o)
{
  register_us("variants/fwd341/" + name, "us_per_forward",
              [v, o] { return forward_us(v, 341, fd::head_placement::managed, o); },
              [name](double us) { results().fwd_variants[name] = us; });
}

void register_variants()
{
  for (std::uint64_t P : {4 * KiB, 16 * KiB, 64 * KiB}) {
    for (const shape_opts& sh : variant_shapes()) {
      register_variant(sh.label + "/copy_only", P, [sh, P] { return per_hook_us(variant::copy_only, P, 0, fd::head_placement::managed, sh); });
      register_variant(sh.label + "/ferry_k16", P, [sh, P] { return per_hook_us(variant::ferry, P, 16, fd::head_placement::managed, sh); });
      if (sh.single_max == 0) {
        shape_opts sep = sh;  // inline releases, never fused: a 1-thread publish kernel every 16
        sep.fused_max = 0;
        sep.branch = false;
        register_variant(sh.label + "/ferry_k16_sep", P, [sep, P] { return per_hook_us(variant::ferry, P, 16, fd::head_placement::managed, sep); });
      }
    }
  }
  // Where ferry's per-entry time over copy-only goes, replayed round-robin (per_hook_table): copy-only
  // with a cursor read / the kernel-to-kernel cursor chain / ferry's two-slot cursor (with and without
  // its placement), ferry's own copy kernel without a channel (with and without the chain), and the
  // channel with K = 16, K = 16 with inline releases, and only the forward-end release (k_inf), drain running
  // or polled between replays. Filed under variants as "diag/<name>".
  for (std::uint64_t P : {4 * KiB, 16 * KiB, 64 * KiB}) {
    register_us("variants/diag/" + std::to_string(P), "us_per_hook",
                [P] {
                  const shape_opts def{}, plain = plain_shape();
                  shape_opts in, paused;
                  in.branch = false;
                  paused.drain_paused = true;
                  const auto managed = fd::head_placement::managed;
                  std::map<std::string, double> out;
                  per_hook_table(P,
                                 {ferry_maker("ferry_k16", 16, managed, def), ferry_maker("ferry_k16_inline", 16, managed, in),
                                  ferry_maker("ferry_k_inf", 1U << 30, managed, def),
                                  ferry_maker("ferry_k_inf_drain_paused", 1U << 30, managed, paused)},
                                 {copy_maker("copy_only", variant::copy_only, def, 0),
                                  copy_maker("copy_only_cursor_read", variant::copy_only, def, 1),
                                  copy_maker("copy_only_cursor_chain", variant::copy_only, def, 2),
                                  copy_maker("copy_only_two_slot", variant::copy_only, def, 3),
                                  copy_maker("copy_only_two_slot_placed", variant::copy_only, def, 4),
                                  copy_maker("copy_only_two_slot_two_lines", variant::copy_only, def, 5),
                                  copy_maker("copy_only_two_slot_8b", variant::copy_only, def, 6),
                                  copy_maker("copy_only_word_in_src", variant::copy_only, def, 7),
                                  copy_maker("copy_only_word_in_ring", variant::copy_only, def, 8),
                                  copy_maker("copy_only_word_block_bcast", variant::copy_only, def, 9),
                                  copy_maker("copy_only_word_ldg", variant::copy_only, def, 10),
                                  copy_maker("copy_only_word_const", variant::copy_only, def, 11),
                                  copy_maker("ferry_kernel", variant::ferry_kernel, def, 0),
                                  copy_maker("ferry_kernel_no_chain", variant::ferry_kernel, def, 1),
                                  copy_maker("copy_only_plain", variant::copy_only, plain, 0),
                                  copy_maker("ferry_kernel_plain", variant::ferry_kernel, plain, 0)},
                                 out);
                  for (const auto& [n, us] : out) { results().variants["diag/" + n][P] = us; }
                  return out["ferry_k16"];
                },
                [](double) {});
  }
  const shape_opts def{};
  shape_opts def_sep = def;  // inline releases, never fused
  def_sep.fused_max = 0;
  def_sep.branch = false;
  register_fwd_variant("no_capture", variant::no_capture, {});
  register_fwd_variant("copy_only/default", variant::copy_only, {def});
  register_fwd_variant("copy_only/legacy", variant::copy_only, {legacy_shape()});
  register_fwd_variant("ferry/legacy", variant::ferry, {legacy_shape()});
  register_fwd_variant("ferry/legacy_drain_paused", variant::ferry, {legacy_shape(), 16, true});
  register_fwd_variant("ferry/default", variant::ferry, {def});
  register_fwd_variant("ferry/default_sep", variant::ferry, {def_sep});
  register_fwd_variant("ferry/default_drain_paused", variant::ferry, {def, 16, true});
  register_fwd_variant("ferry/default_k_inf", variant::ferry, {def, 1U << 30, false});
  register_fwd_variant("ferry/default_k_inf_drain_paused", variant::ferry, {def, 1U << 30, true});
  register_fwd_variant("copy_only/plain", variant::copy_only, {plain_shape()});
  register_fwd_variant("ferry/plain", variant::ferry, {plain_shape()});
  register_fwd_variant("ferry/default_k64", variant::ferry, {def, 64, false});
  register_fwd_variant("ferry_kernel/default", variant::ferry_kernel, {def});
  shape_opts in = def;
  in.branch = false;
  register_fwd_variant("ferry/inline", variant::ferry, {in});
  register_fwd_variant("ferry/inline_k64", variant::ferry, {in, 64, false});
  for (const shape_opts& sh : variant_shapes()) {
    if (sh.label == "s64x1" || sh.label == "s128x1" || sh.label == "s256x2" || sh.label == "s128x4") {
      register_fwd_variant("copy_only/" + sh.label, variant::copy_only, {sh});
      register_fwd_variant("ferry/" + sh.label, variant::ferry, {sh});
    }
  }
}

// ---------------------------------------------------------------------------------------------------
void register_all()
{
  const std::vector<std::uint64_t> sizes = host_mode ? std::vector<std::uint64_t>{4 * KiB, 16 * KiB, 64 * KiB, MiB}
                                                     : std::vector<std::uint64_t>{4 * KiB, 16 * KiB, 64 * KiB, MiB,
                                                                                  16 * MiB, 64 * MiB};
  // Per payload size, one table: the copy-harness baselines replayed in every round beside each ferry
  // configuration in turn (per_hook_table). "_plain": launched without programmatic dependent launch;
  // "_inline": batch releases on the producer stream (config::branch_publish = false; the release fused
  // into the batch-completing copy where it fits); "_pinned": published_head in pinned mapped memory.
  for (auto P : sizes) {
    register_us("per_hook_graph/" + std::to_string(P), "us_per_hook_ferry_k16",
                [P] {
                  const auto managed = fd::head_placement::managed;
                  shape_opts in;
                  in.branch = false;
                  std::vector<contestant_maker> ferries;
                  for (std::uint32_t K : {1U, 4U, 16U, 64U}) { ferries.push_back(ferry_maker("ferry_k" + std::to_string(K), K, managed, {})); }
                  ferries.push_back(ferry_maker("ferry_k16_plain", 16, managed, plain_shape()));
                  ferries.push_back(ferry_maker("ferry_k16_inline", 16, managed, in));
                  ferries.push_back(ferry_maker("ferry_k64_inline", 64, managed, in));
                  ferries.push_back(ferry_maker("ferry_k16_pinned", 16, fd::head_placement::pinned_mapped, {}));
                  std::map<std::string, double> out;
                  per_hook_table(P, ferries,
                                 {copy_maker("copy_only", variant::copy_only, {}),
                                  copy_maker("old_volatile", variant::old_volatile, legacy_shape()),
                                  copy_maker("per_entry_release", variant::per_entry_release, legacy_shape()),
                                  copy_maker("copy_only_plain", variant::copy_only, plain_shape())},
                                 out);
                  for (const auto& [n, us] : out) { results().per_hook[P][n] = us; }
                  return out["ferry_k16"];
                },
                [](double) {});
  }
  for (std::uint64_t H : {28ULL, 341ULL}) {
    for (variant v : {variant::copy_only, variant::ferry}) {
      register_forward(std::string{name(v)} + "_plain", H,
                       [v, H] { return forward_us(v, H, fd::head_placement::managed, {plain_shape()}); });
    }
  }
  for (std::uint64_t H : {28ULL, 341ULL}) {  // batch releases on the producer stream (branch_publish off)
    shape_opts in;
    in.branch = false;
    register_forward("ferry_inline", H, [H, in] { return forward_us(variant::ferry, H, fd::head_placement::managed, {in}); });
  }
  for (std::uint64_t H : {28ULL, 341ULL}) {
    register_forward("ferry_pinned", H, [H] { return forward_us(variant::ferry, H, fd::head_placement::pinned_mapped); });
  }
  for (std::uint64_t H : {28ULL, 341ULL}) {
    for (variant v : {variant::no_capture, variant::copy_only, variant::old_volatile, variant::per_entry_release,
                      variant::ferry}) {
      register_forward(name(v), H, [v, H] { return forward_us(v, H); });
    }
  }
  if (env_or("FERRY_D2H_VARIANTS", "1") != std::string{"0"}) { register_variants(); }
  benchmark::RegisterBenchmark("drain/ferry_64MiB", [](benchmark::State& st) {
    for (auto _ : st) {
      const double g = drain_gbps();
      st.SetIterationTime(1.0 / g);
      st.counters["GBps"] = g;
      results().drain_gbps = g;
    }
  })->Iterations(1)->UseManualTime();
  benchmark::RegisterBenchmark("drain/memcpy_ceiling_64MiB", [](benchmark::State& st) {
    for (auto _ : st) {
      const double g = memcpy_gbps();
      st.SetIterationTime(1.0 / g);
      st.counters["GBps"] = g;
      results().memcpy_gbps = g;
    }
  })->Iterations(1)->UseManualTime();
}

std::string json_num(const std::optional<double>& v)
{
  if (!v) { return "null"; }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", *v);
  return buf;
}
std::optional<double> lookup(const std::map<std::string, double>& m, const std::string& k)
{
  const auto it = m.find(k);
  return it == m.end() ? std::nullopt : std::optional<double>{it->second};
}
std::string json_escape(const std::string& s)
{
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') { o += '\\'; }
    o += c;
  }
  return o;
}

void write_json(const std::string& path)
{
  auto& R = results();
  std::string j = "{\n";
  j += "  \"device\": \"" + json_escape(R.device) + "\",\n";
  j += "  \"commit\": \"" + json_escape(env_or("FERRY_COMMIT", "unknown")) + "\",\n";
  j += "  \"date\": \"" + json_escape(env_or("FERRY_DATE", "unknown")) + "\",\n";
  j += "  \"command\": \"" + json_escape(env_or("FERRY_COMMAND", "ferry_bench_d2h")) + "\",\n";
  j += "  \"backend\": \"" + std::string{B::name()} + "\",\n";
  j += "  \"forward\": {";
  bool first = true;
  for (std::uint64_t H : {28ULL, 341ULL}) {
    const auto& m = R.forward[H];
    j += std::string(first ? "" : ",") + "\n    \"hooks" + std::to_string(H) + "\": {";
    first = false;
    bool f2 = true;
    for (const char* k : {"no_capture", "copy_only", "old_volatile", "per_entry_release", "ferry", "ferry_pinned",
                          "copy_only_plain", "ferry_plain", "ferry_inline"}) {
      j += std::string(f2 ? "" : ", ") + "\"" + k + "_us\": " + json_num(lookup(m, k));
      f2 = false;
    }
    const auto base = lookup(m, "no_capture");
    for (const char* k : {"copy_only", "old_volatile", "per_entry_release", "ferry", "ferry_pinned", "copy_only_plain",
                          "ferry_plain", "ferry_inline"}) {
      const auto x = lookup(m, k);
      j += std::string(", \"") + k + "_overhead_pct\": " +
           json_num(base && x && *base > 0 ? std::optional<double>{(*x / *base - 1.0) * 100.0} : std::nullopt);
    }
    // ferry's time above the copy-only baseline launched the same way, as % of the no-capture forward
    auto over_copy = [&](const char* ferry_key, const char* copy_key) {
      const auto copy = lookup(m, copy_key), fer = lookup(m, ferry_key);
      return json_num(copy && fer && base && *base > 0 ? std::optional<double>{(*fer - *copy) / *base * 100.0}
                                                       : std::nullopt);
    };
    j += ", \"ferry_publication_over_copy_pct\": " + over_copy("ferry", "copy_only");
    j += ", \"ferry_plain_publication_over_copy_plain_pct\": " + over_copy("ferry_plain", "copy_only_plain");
    j += ", \"ferry_inline_publication_over_copy_pct\": " + over_copy("ferry_inline", "copy_only");
    j += "}";
  }
  j += "\n  },\n  \"per_hook_graph_us\": {";
  first = true;
  for (std::uint64_t P : {4 * KiB, 16 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB}) {
    const auto& m = R.per_hook[P];
    j += std::string(first ? "" : ",") + "\n    \"" + std::to_string(P) + "\": {";
    first = false;
    bool f2 = true;
    for (const char* k : {"copy_only", "old_volatile", "per_entry_release", "ferry_k1", "ferry_k4", "ferry_k16", "ferry_k64",
                          "ferry_k16_pinned", "copy_only_plain", "ferry_k16_plain", "ferry_k16_inline", "ferry_k64_inline"}) {
      j += std::string(f2 ? "" : ", ") + "\"" + k + "\": " + json_num(lookup(m, k));
      f2 = false;
    }
    j += "}";
  }
  j += "\n  },\n";
  j += "  \"variants\": {\n    \"per_hook_graph_us\": {";
  first = true;
  for (const auto& [name, m] : R.variants) {
    j += std::string(first ? "" : ",") + "\n      \"" + json_escape(name) + "\": {";
    first = false;
    bool f2 = true;
    for (std::uint64_t P : {4 * KiB, 16 * KiB, 64 * KiB}) {
      const auto it = m.find(P);
      j += std::string(f2 ? "" : ", ") + "\"" + std::to_string(P) + "\": " +
           json_num(it == m.end() ? std::nullopt : std::optional<double>{it->second});
      f2 = false;
    }
    j += "}";
  }
  j += "\n    },\n    \"forward341_us\": {";
  first = true;
  for (const auto& [name, us] : R.fwd_variants) {
    j += std::string(first ? "" : ",") + "\n      \"" + json_escape(name) + "\": " + json_num(us);
    first = false;
  }
  j += "\n    }\n  },\n";
  j += "  \"drain_gbps_64MiB\": " + json_num(R.drain_gbps) + ",\n";
  j += "  \"memcpy_d2h_gbps_64MiB\": " + json_num(R.memcpy_gbps) + ",\n";
  j += "  \"entries_checked\": " + std::to_string(R.checked.load()) + ",\n";
  j += "  \"entries_bad\": " + std::to_string(R.bad.load()) + ",\n";
  j += "  \"baseline_entries_checked\": " + std::to_string(R.baseline_checked.load()) + ",\n";
  j += "  \"baseline_entries_bad\": " + std::to_string(R.baseline_bad.load()) + "\n}\n";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fputs(j.c_str(), f);
    std::fclose(f);
  } else {
    std::fprintf(stderr, "ferry_bench_d2h: cannot write %s\n", path.c_str());
  }
}

}  // namespace

int main(int argc, char** argv)
{
  std::string json_path;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--ferry_json=", 0) == 0) {
      json_path = a.substr(std::strlen("--ferry_json="));
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) { return 2; }
  {
    B b{};
    if (b.device_count() <= 0) {
      std::fprintf(stderr, "ferry_bench_d2h: no %s device\n", std::string{B::name()}.c_str());
      return 3;
    }
    results().device = b.attributes(fb::device_id{0}).name;
  }
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  auto& R = results();
  std::printf("ferry_bench_d2h: entries checked %llu, bad %llu (baseline drains: checked %llu, bad %llu)\n",
              static_cast<unsigned long long>(R.checked.load()), static_cast<unsigned long long>(R.bad.load()),
              static_cast<unsigned long long>(R.baseline_checked.load()),
              static_cast<unsigned long long>(R.baseline_bad.load()));
  for (std::uint64_t H : {28ULL, 341ULL}) {
    const auto& m = R.forward[H];
    const auto base = lookup(m, "no_capture");
    if (!base) { continue; }
    for (const char* k : {"copy_only", "old_volatile", "per_entry_release", "ferry", "ferry_pinned", "copy_only_plain", "ferry_plain"}) {
      if (const auto x = lookup(m, k)) {
        std::printf("forward hooks=%llu %-18s %9.1f us  %+6.2f%% vs no capture\n", static_cast<unsigned long long>(H), k,
                    *x, (*x / *base - 1) * 100);
      }
    }
  }
  if (!R.variants.empty()) {
    std::printf("variants: us/hook in a graph (K = 16 for ferry)\n%-28s %8s %8s %8s\n", "variant", "4K", "16K", "64K");
    for (const auto& [name, m] : R.variants) {
      std::printf("%-28s", name.c_str());
      for (std::uint64_t P : {4 * KiB, 16 * KiB, 64 * KiB}) {
        const auto it = m.find(P);
        if (it == m.end()) {
          std::printf(" %8s", "-");
        } else {
          std::printf(" %8.3f", it->second);
        }
      }
      std::printf("\n");
    }
  }
  if (!R.fwd_variants.empty()) {
    const auto base = lookup(R.fwd_variants, "no_capture");
    const auto copy = lookup(R.fwd_variants, "copy_only/default");
    std::printf("variants: forward, 341 hooks x 16 KiB (us; %% vs no_capture; us/hook over copy_only/default)\n");
    for (const auto& [name, us] : R.fwd_variants) {
      std::printf("%-36s %9.1f us", name.c_str(), us);
      if (base) { std::printf("  %+6.2f%%", (us / *base - 1) * 100); }
      if (copy) { std::printf("  %+6.3f us/hook", (us - *copy) / 341.0); }
      std::printf("\n");
    }
  }
  if (!json_path.empty()) { write_json(json_path); }
  return R.bad.load() > 0 ? 1 : 0;
}
