// SPDX-License-Identifier: Apache-2.0
// forward/<variant>/hooks:<28|341>: a simulated forward (28 layers of a ~60 us spin kernel, 16 KiB per
// hook, graph replay, the drain running, every word of every entry checked): no capture, copy only, old
// volatile, per-entry release, event per hook (the classic design: copy only, an event recorded after each
// hook, a CPU thread polling the events and copying each completed entry D2H), ferry (K = 16), ferry_gather
// (deferred capture, one gather per K = 16, the defaults: the batch release on the branch;
// ferry_gather_fused: the release in the gather's last block), and ferry's launch/placement variants;
// forward/<variant>/vllm_full_b1: the same forward with 341 hooks of DMI's vllm-full sizes at B = 1
// (forward_sizes). The figure is the median us per forward; overheads are derived by
// bench/device/reports/run_files.py (d2h-summary).
#include "baseline_drain.hpp"
#include "common.hpp"

#include <ferry/testing/pattern.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace ferry::bench {

namespace {

/// Every byte of an entry of `bytes` carries pattern(seq): whole words (check_words), then the tail bytes.
bool check_entry(const std::byte* p, std::uint64_t bytes, std::uint64_t seq)
{
  if (!check_words(p, bytes, seq, true)) { return false; }
  const std::uint64_t tail = bytes % 8;
  if (tail == 0) { return true; }
  const std::uint64_t w = ferry::testing::pattern_word(seq, bytes / 8);
  return std::memcmp(p + bytes - tail, &w, tail) == 0;
}

}  // namespace

std::vector<std::uint64_t> forward_sizes(std::uint64_t H, bool vllm_mix)
{
  std::vector<std::uint64_t> v(H, 16 * KiB);
  if (!vllm_mix || H == 0) { return v; }
  for (std::uint64_t h = 0; h < H; ++h) { v[h] = (2 + h % 5) * KiB; }  // 2, 3, 4, 5, 6 KiB per layer hook
  v[0] = 4;                                                          // token ids
  v[H - 1] = 297 * KiB;                                              // logits
  return v;
}

double forward_us(variant v, std::uint64_t H, fd::head_memory placement, const fwd_opts& o)
{
  const shape_opts sh = o.shape ? *o.shape : default_shape(v);
  B b{};
  b.set_device(fb::device_id{0});
  const int sms = b.attributes(fb::device_id{0}).sm_count;
  fb::stream<B> s{b};
  constexpr std::uint64_t layers = 28, bytes = 16 * KiB, spin_ns = 60'000;
  const int replays = host_mode ? 25 : 200;  // host: enough for a median the emulation's noise does not swamp
  // Hook h: sizes[h] bytes at act + off[h] (uniform: h * bytes; a baseline's frame f at ring + f * span).
  const std::vector<std::uint64_t> sizes = forward_sizes(H, o.vllm_mix);
  std::vector<std::uint64_t> off(H);
  std::uint64_t span = 0;  // bytes of one forward's sources (and of one baseline ring frame)
  for (std::uint64_t h = 0; h < H; ++h) {
    off[h] = span;
    span += fd::align_up(sizes[h], 256);
  }
  fb::device_buffer<B> act{span, b};
  fb::device_buffer<B> ring{3 * span, b};
  fb::device_buffer<B> mix_dev{2 * H * 8, b};  // hook_off then hook_bytes (vllm_mix only)
  if (o.vllm_mix) {
    fb::pinned_buffer<B> host{2 * H * 8, b};
    std::memcpy(host.data(), off.data(), H * 8);
    std::memcpy(static_cast<std::byte*>(host.data()) + H * 8, sizes.data(), H * 8);
    b.memcpy_async(mix_dev.data(), host.data(), 2 * H * 8, fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
  }
  const std::uint64_t* hook_off = o.vllm_mix ? mix_dev.template as<std::uint64_t>() : nullptr;
  const std::uint64_t* hook_bytes = o.vllm_mix ? mix_dev.template as<std::uint64_t>() + H : nullptr;
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
  std::vector<fb::launch_config> hook_shape(H);
  for (std::uint64_t h = 0; h < H; ++h) { hook_shape[h] = copy_shape(sizes[h], sms, sh); }
  const fb::launch_config layer_shape{{host_mode ? 1U : static_cast<std::uint32_t>(sms)}, {256}, 0};
  std::atomic<std::uint64_t> delivered{0};

  std::optional<fd::channel<B>> ch;
  if (v == variant::ferry) {
    fd::config cfg;
    cfg.ring_bytes = 4 * span;
    cfg.publish_every = o.K;
    cfg.tuning.gather_batch = o.K;  // one gather per K hooks, as this benchmark measures
    cfg.tuning.head_memory = placement;
    cfg.timeout = std::chrono::seconds(30);
    apply(cfg, sh);
    cfg.tuning.gather_branch_publish = !o.gather_fused;
    if (o.drain_paused) { cfg.drain = fd::drain_mode::poll; }
    ch.emplace(cfg, b, [&delivered, &sizes](fd::entry_view&& e) {
      auto& k = checks();
      delivered.fetch_add(1);
      k.checked.fetch_add(1);
      const std::uint64_t n = sizes[e.hook().value];
      if (!e.ok() || e.size() != n || !check_entry(e.bytes().data(), n, e.seq().value)) { k.bad.fetch_add(1); }
    });
  }
  // Event per hook and the flag designs: 3 ring frames, one graph per frame (replay r uses frame r % 3).
  const bool framed = v == variant::old_volatile || v == variant::per_entry_release || v == variant::event_per_hook;
  std::vector<fb::event<B>> events;  // event per hook: one per ring slot, events[frame * H + h]
  if (v == variant::event_per_hook) {
    events.reserve(3 * H);
    for (std::uint64_t i = 0; i < 3 * H; ++i) { events.emplace_back(b); }
  }
  fd::forward_plan plan;
  auto capture_forward = [&](std::uint64_t frame) {
    return fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      if (ch) { ch->begin_forward(cs); }
      for (std::uint64_t l = 0; l < layers; ++l) {
        const std::uint64_t first = l * H / layers, last = (l + 1) * H / layers;
        layer_args la{fwd,   H,       first,    last - first, static_cast<std::byte*>(act.data()),
                      bytes, spin_ns, hook_off, hook_bytes};
        b.launch(layer_kernel(typename B::tag{}), layer_shape, cs.handle(), la);
        for (std::uint64_t h = first; h < last && v != variant::no_capture; ++h) {
          const std::byte* src = static_cast<const std::byte*>(act.data()) + off[h];
          if (v == variant::ferry && o.gather) {
            ch->capture_deferred(fd::hook_id{static_cast<std::uint32_t>(h)}, src, sizes[h], cs);
          } else if (v == variant::ferry) {
            ch->capture(fd::hook_id{static_cast<std::uint32_t>(h)}, src, sizes[h], cs);
          } else if (v == variant::ferry_kernel) {
            launch_ferry_kernel(b, cs, shape, ring.data(), 3 * H * bytes, state.data(), h, bytes, vpt_of(sh), src);
          } else {
            copy_args a{static_cast<std::byte*>(ring.data()) + frame * span + off[h], src, sizes[h],
                        flag.template device_as<std::uint64_t>(), fwd, H, h, join, vpt_of(sh)};
            launch_baseline(b, v, hook_shape[h], cs, a);
            if (v == variant::event_per_hook) { events[frame * H + h].record_external(cs); }
          }
        }
      }
      if (ch) { plan = ch->end_forward(cs); }
      b.launch(next_forward_kernel(typename B::tag{}), fb::launch_config{{1}, {1}, 0}, cs.handle(), fwd);
    });
  };
  std::vector<fb::graph_exec<B>> graphs;
  for (std::uint64_t f = 0; f < (framed ? 3U : 1U); ++f) { graphs.push_back(capture_forward(f)); }
  std::atomic<std::uint64_t> launched{0};  // replays launched (event per hook: whose events are recorded)
  std::unique_ptr<baseline_drain> drain;
  if (v == variant::event_per_hook) {
    // Entry e is ready once its hook's event, recorded by replay e / H (already launched), completed.
    drain = std::make_unique<baseline_drain>(b, H, bytes, static_cast<const std::byte*>(ring.data()),
                                             [&events, &launched, H](std::uint64_t next) {
                                               const std::uint64_t limit = launched.load() * H;
                                               std::uint64_t e = next;
                                               while (e < limit && events[e % (3 * H)].query()) { ++e; }
                                               return e;
                                             });
  } else if (framed) {
    const std::uint64_t* f = flag.template as<std::uint64_t>();
    drain = std::make_unique<baseline_drain>(b, H, bytes, static_cast<const std::byte*>(ring.data()),
                                             [f](std::uint64_t) { return fb::host_load_acquire(f); });
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
    launched.store(static_cast<std::uint64_t>(r) + 1);
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
    if (const std::uint64_t got = drain->consumed.load(); got < static_cast<std::uint64_t>(total) * H) {
      std::fprintf(stderr, "forward/%s/hooks:%llu: the baseline drain checked %llu of %llu entries within 30 s\n", name(v),
                   static_cast<unsigned long long>(H), static_cast<unsigned long long>(got),
                   static_cast<unsigned long long>(total) * H);
    }
    drain.reset();
  }
  if (ch) { (void)ch->close(); }
  return median(ms) * 1000.0;
}

/// The producer thread's CPU cost per capture call (us) in an eager forward of H hooks of DMI's vllm-full
/// sizes: checks, placement, the copy launch (immediate) or the record plus every K-th gather launch
/// (deferred), end_forward included; the GPU copies run behind. Every delivered entry is checked.
double capture_cpu_us(bool deferred, std::uint64_t H)
{
  B b{};
  b.set_device(fb::device_id{0});
  fb::stream<B> s{b};
  const std::vector<std::uint64_t> sizes = forward_sizes(H, true);
  std::vector<std::uint64_t> off(H);
  std::uint64_t span = 0;
  for (std::uint64_t h = 0; h < H; ++h) {
    off[h] = span;
    span += fd::align_up(sizes[h], 256);
  }
  fb::device_buffer<B> act{span, b};
  fd::config cfg;
  cfg.ring_bytes = 8 * span;
  cfg.timeout = std::chrono::seconds(30);
  fd::channel<B> ch{cfg, b, [](fd::entry_view&& e) {
    auto& k = checks();
    k.checked.fetch_add(1);
    if (!e.ok()) { k.bad.fetch_add(1); }
  }};
  const int reps = host_mode ? 5 : 200;
  std::vector<double> us;
  for (int r = 0; r < reps + 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ch.begin_forward(s);
    for (std::uint64_t h = 0; h < H; ++h) {
      const std::byte* src = static_cast<const std::byte*>(act.data()) + off[h];
      if (deferred) {
        ch.capture_deferred(fd::hook_id{static_cast<std::uint32_t>(h)}, src, sizes[h], s);
      } else {
        ch.capture(fd::hook_id{static_cast<std::uint32_t>(h)}, src, sizes[h], s);
      }
    }
    (void)ch.end_forward(s);
    const auto t1 = std::chrono::steady_clock::now();
    s.synchronize();
    if (r >= 3) { us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(H)); }
  }
  (void)ch.close();
  return median(us);
}

void register_forward()
{
  for (bool deferred : {false, true}) {  // target: <= 1.0 us per deferred capture
    register_us(std::string{"capture_cpu/"} + (deferred ? "deferred" : "immediate") + "/vllm_full_b1", "us_per_capture",
                [deferred] { return capture_cpu_us(deferred, 341); });
  }
  auto add = [](const std::string& key, std::uint64_t H, std::function<double()> fn) {
    register_us("forward/" + key + "/hooks:" + std::to_string(H), "us_per_forward", std::move(fn));
  };
  constexpr auto managed = fd::head_memory::managed;
  for (std::uint64_t H : {28ULL, 341ULL}) {
    for (variant v : {variant::copy_only, variant::ferry}) {
      add(std::string{name(v)} + "_plain", H, [v, H] { return forward_us(v, H, managed, {plain_shape()}); });
    }
  }
  for (std::uint64_t H : {28ULL, 341ULL}) {  // batch releases on the producer stream (branch_publish off)
    add("ferry_inline", H, [H] { return forward_us(variant::ferry, H, managed, {inline_shape()}); });
  }
  for (std::uint64_t H : {28ULL, 341ULL}) {
    add("ferry_pinned", H, [H] { return forward_us(variant::ferry, H, fd::head_memory::pinned_mapped); });
  }
  for (std::uint64_t H : {28ULL, 341ULL}) {
    for (variant v : {variant::no_capture, variant::copy_only, variant::old_volatile, variant::per_entry_release,
                      variant::event_per_hook, variant::ferry}) {
      add(name(v), H, [v, H] { return forward_us(v, H); });
    }
  }
  // Deferred capture: one gather launch per K = 16 hooks (capture_deferred), beside the same forward's rows:
  // ferry_gather with the defaults (each batch's release on the branch), ferry_gather_fused with the release in
  // the gather's last block (gather_branch_publish off).
  for (std::uint64_t H : {28ULL, 341ULL}) {
    add("ferry_gather", H, [H] { return forward_us(variant::ferry, H, managed, {.gather = true}); });
    add("ferry_gather_fused", H,
        [H] { return forward_us(variant::ferry, H, managed, {.gather = true, .gather_fused = true}); });
  }
  // DMI's vllm-full size mix at decode B = 1 (341 hooks: forward_sizes): forward/<variant>/vllm_full_b1.
  auto add_mix = [](const std::string& key, std::function<double()> fn) {
    register_us("forward/" + key + "/vllm_full_b1", "us_per_forward", std::move(fn));
  };
  for (variant v : {variant::no_capture, variant::copy_only, variant::ferry}) {
    add_mix(name(v), [v] { return forward_us(v, 341, managed, {.vllm_mix = true}); });
  }
  add_mix("ferry_gather", [] { return forward_us(variant::ferry, 341, managed, {.gather = true, .vllm_mix = true}); });
  add_mix("ferry_gather_fused", [] {
    return forward_us(variant::ferry, 341, managed, {.gather = true, .gather_fused = true, .vllm_mix = true});
  });
  add_mix("ferry_gather_k32", [] {
    return forward_us(variant::ferry, 341, managed, {.K = 32, .gather = true, .vllm_mix = true});
  });
}

}  // namespace ferry::bench
