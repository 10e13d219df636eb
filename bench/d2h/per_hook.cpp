// SPDX-License-Identifier: Apache-2.0
// per_hook_graph/<bytes>: GPU time per hook of `hooks` back-to-back hooks captured in one graph (events
// around a replay, median over replays, divided by the hooks). Contestants are replayed round-robin and
// each one's median replay time is taken: slow drifts (clocks, the machine) hit every contestant alike,
// so their differences are what the design costs.
#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace ferry::bench {

namespace {
std::uint64_t ring_cap() { return host_mode ? 64 * MiB : 1024 * MiB; }
}  // namespace

per_hook_rig::per_hook_rig(std::uint64_t p)
  : P{p}, hooks{std::max<std::uint64_t>(1, std::min<std::uint64_t>(host_mode ? 64 : 512, ring_cap() / p / 2))},
    slots{std::max<std::uint64_t>(1, std::min<std::uint64_t>(hooks, ring_cap() / p))},
    sms{b.attributes(fb::device_id{0}).sm_count}, src{p + 256, b}, ring{slots * p + 256, b}, aux{256, b},
    state{256, b}, flag{128, b}
{
  fill_device(b, s, src.data(), P, 7);
  // A zero word past the payload and past the ring's last slot (diagnostic cursor_modes 7 and 8).
  b.memset_async(static_cast<std::byte*>(src.data()) + P, 0, 256, s.handle());
  b.memset_async(static_cast<std::byte*>(ring.data()) + slots * P, 0, 256, s.handle());
  b.memset_async(aux.data(), 0, 256, s.handle());    // [0] forward counter (u64), [64] join counter (u32)
  b.memset_async(state.data(), 0, 256, s.handle());  // a device_state, or cursor_mode 5's two lines
  s.synchronize();
}

double contestant::us_per_hook(std::uint64_t hooks) const
{
  return median(ms) * 1000.0 / static_cast<double>(hooks);
}

namespace {

/// A contestant of the copy harness: copy only / old volatile / per-entry release (bench kernels), or
/// ferry's own copy kernel without a channel (variant::ferry_kernel). `cursor_mode` as in copy_args.
contestant copy_contestant(per_hook_rig& r, std::string name, variant v, const shape_opts& sh, std::uint32_t cursor_mode)
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
      copy_args a{static_cast<std::byte*>(r.ring.data()) + (h % r.slots) * r.P,
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
      launch_baseline(r.b, v, launch, cs, a);
    }
  }));
  return c;
}

contestant ferry_contestant(per_hook_rig& r, std::string name, std::uint32_t K, fd::head_memory placement,
                            const shape_opts& sh)
{
  contestant c;
  c.name = std::move(name);
  fd::config cfg;
  cfg.ring_bytes = fd::align_up(r.hooks * r.P * 2, 16);
  cfg.staging_bytes = std::min<std::uint64_t>(cfg.ring_bytes, host_mode ? 64 * MiB : 256 * MiB);
  cfg.publish_every = K;
  cfg.tuning.head_memory = placement;
  cfg.fifo_capacity = 4096;
  apply(cfg, sh);
  cfg.timeout = std::chrono::seconds(30);
  const std::uint64_t P = r.P;
  c.ch = std::make_shared<fd::channel<B>>(cfg, r.b, [P](fd::entry_view&& e) {
    auto& k = checks();
    k.checked.fetch_add(1);
    if (!e.ok() || e.size() != P || !check_words(e.bytes().data(), P, 7, false)) { k.bad.fetch_add(1); }
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

}  // namespace

contestant_maker copy_maker(std::string n, variant v, shape_opts sh, std::uint32_t cursor_mode)
{
  return {n, [=](per_hook_rig& r) { return copy_contestant(r, n, v, sh, cursor_mode); }};
}

contestant_maker ferry_maker(std::string n, std::uint32_t K, fd::head_memory placement, shape_opts sh)
{
  return {n, [=](per_hook_rig& r) { return ferry_contestant(r, n, K, placement, sh); }};
}

figures per_hook_table(std::uint64_t P, const std::vector<contestant_maker>& ferries,
                       const std::vector<contestant_maker>& baselines)
{
  figures out;
  per_hook_rig r{P};
  std::vector<contestant> base;
  for (const auto& [n, make] : baselines) { base.push_back(make(r)); }
  for (const auto& [n, make] : ferries) {
    contestant f = make(r);
    std::vector<contestant*> all;
    for (auto& c : base) { all.push_back(&c); }
    all.push_back(&f);
    run_rounds(r, all, r.rounds());
    (void)f.ch->close();
    out[n] = f.us_per_hook(r.hooks);
  }
  for (const auto& c : base) { out[c.name] = c.us_per_hook(r.hooks); }
  return out;
}

double per_hook_us(variant v, std::uint64_t P, const shape_opts& sh, std::uint32_t K)
{
  per_hook_rig r{P};
  contestant c = v == variant::ferry ? ferry_contestant(r, "ferry", K, fd::head_memory::managed, sh)
                                     : copy_contestant(r, name(v), v, sh, 0);
  run_rounds(r, {&c}, r.rounds());
  if (c.ch) { (void)c.ch->close(); }
  return c.us_per_hook(r.hooks);
}

void register_per_hook()
{
  const std::vector<std::uint64_t> sizes = host_mode ? std::vector<std::uint64_t>{4 * KiB, 16 * KiB, 64 * KiB, MiB}
                                                     : std::vector<std::uint64_t>{4 * KiB, 16 * KiB, 64 * KiB, MiB,
                                                                                  16 * MiB, 64 * MiB};
  // Per payload size, one table: the copy-harness baselines replayed in every round beside each ferry
  // configuration in turn. "_plain": launched without programmatic dependent launch; "_inline": batch
  // releases on the producer stream (tuning::branch_publish = false; the release fused into the
  // batch-completing copy where it fits); "_pinned": published_head in pinned mapped memory.
  // Counters: us/hook per contestant; the run's time is ferry_k16's us/hook (as a time in us).
  for (auto P : sizes) {
    register_measurement("per_hook_graph/" + std::to_string(P), [P] {
      const auto managed = fd::head_memory::managed;
      std::vector<contestant_maker> ferries;
      for (std::uint32_t K : {1U, 4U, 16U, 64U}) { ferries.push_back(ferry_maker("ferry_k" + std::to_string(K), K, managed, {})); }
      ferries.push_back(ferry_maker("ferry_k16_plain", 16, managed, plain_shape()));
      ferries.push_back(ferry_maker("ferry_k16_inline", 16, managed, inline_shape()));
      ferries.push_back(ferry_maker("ferry_k64_inline", 64, managed, inline_shape()));
      ferries.push_back(ferry_maker("ferry_k16_pinned", 16, fd::head_memory::pinned_mapped, {}));
      figures out = per_hook_table(P, ferries,
                                   {copy_maker("copy_only", variant::copy_only, {}),
                                    copy_maker("old_volatile", variant::old_volatile, legacy_shape()),
                                    copy_maker("per_entry_release", variant::per_entry_release, legacy_shape()),
                                    copy_maker("copy_only_plain", variant::copy_only, plain_shape())});
      return measured{out["ferry_k16"] / 1e6, out};
    });
  }
}

}  // namespace ferry::bench
