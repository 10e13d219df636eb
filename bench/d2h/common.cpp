// SPDX-License-Identifier: Apache-2.0
// Shared setup of the D2H benchmarks: reporting, the entry check, copy layouts and launches (common.hpp).
#include "common.hpp"

#include <ferry/testing/pattern.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>

namespace ferry::bench {

entry_checks& checks()
{
  static entry_checks c;
  return c;
}

void register_measurement(const std::string& name, std::function<measured()> measure)
{
  benchmark::RegisterBenchmark(name.c_str(), [measure](benchmark::State& st) {
    for (auto _ : st) {
      auto& c = checks();
      const std::uint64_t c0 = c.checked.load(), b0 = c.bad.load();
      const std::uint64_t bc0 = c.baseline_checked.load(), bb0 = c.baseline_bad.load();
      const measured m = measure();
      st.SetIterationTime(m.seconds);
      for (const auto& [k, v] : m.counters) { st.counters[k] = v; }
      st.counters["entries_checked"] = static_cast<double>(c.checked.load() - c0);
      st.counters["entries_bad"] = static_cast<double>(c.bad.load() - b0);
      st.counters["baseline_entries_checked"] = static_cast<double>(c.baseline_checked.load() - bc0);
      st.counters["baseline_entries_bad"] = static_cast<double>(c.baseline_bad.load() - bb0);
    }
  })->Iterations(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void register_us(const std::string& name, const std::string& counter, std::function<double()> measure)
{
  register_measurement(name, [counter, measure] {
    const double us = measure();
    return measured{us / 1e6, {{counter, us}}};
  });
}

double median(std::vector<double> v)
{
  if (v.empty()) { return 0; }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

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

shape_opts legacy_shape() { return {"legacy", 256, 1, 32 * KiB, 32 * KiB, false}; }
shape_opts plain_shape()
{
  shape_opts o;
  o.label = "plain";
  o.programmatic = false;
  return o;
}
shape_opts inline_shape()
{
  shape_opts o;
  o.label = "inline";
  o.branch = false;
  return o;
}

void apply(fd::config& cfg, const shape_opts& o)
{
  cfg.tuning.copy_block_threads = o.threads;
  cfg.tuning.copy_vecs_per_thread = o.vpt;
  cfg.tuning.single_block_copy_max_bytes = o.single_max;
  cfg.tuning.fused_copy_max_bytes = o.fused_max;
  cfg.tuning.programmatic_launch = o.programmatic;
  cfg.tuning.branch_publish = o.branch;
  if (o.drain_paused) { cfg.drain = fd::drain_mode::poll; }
}

namespace {
/// Whether the copy-only baseline may be launched programmatically: the same rule as ferry's channel
/// (device sm_90+ and the loaded code contains griddepcontrol.wait).
bool programmatic_ok()
{
  static const bool ok = [] {
    B b{};
    const auto a = b.attributes(fb::device_id{0});
    int arch = b.preload(bench_copy_kernel(typename B::tag{}));
    for (const auto f : {fd::detail::copy_form::v1, fd::detail::copy_form::v2, fd::detail::copy_form::v4,
                         fd::detail::copy_form::v8}) {
      arch = std::min(arch, b.preload(bench_copy_plain_kernel(typename B::tag{}, f)));
    }
    return fb::programmatic_launch_ok(a.compute_capability_major, arch);
  }();
  return ok;
}
}  // namespace

fb::launch_config copy_shape(std::uint64_t bytes, int sms, const shape_opts& o)
{
  fd::config cfg;
  apply(cfg, o);
  const bool one_block = fd::detail::one_block_copy(cfg, fd::align_up(bytes, fd::entry_alignment), false);
  const auto s = fd::detail::copy_launch_shape(cfg, bytes, one_block, sms);
  return {{s.blocks}, {s.threads}, 0, o.programmatic && programmatic_ok()};
}

std::uint32_t vpt_of(const shape_opts& o)
{
  fd::config cfg;
  apply(cfg, o);
  return fd::detail::vecs_per_thread(cfg);
}

const char* name(variant v)
{
  switch (v) {
    case variant::no_capture: return "no_capture";
    case variant::copy_only: return "copy_only";
    case variant::old_volatile: return "old_volatile";
    case variant::per_entry_release: return "per_entry_release";
    case variant::ferry: return "ferry";
    case variant::ferry_kernel: return "ferry_kernel";
    case variant::event_per_hook: return "event_per_hook";
  }
  return "?";
}

shape_opts default_shape(variant v)
{
  if (v == variant::event_per_hook) { return plain_shape(); }
  return v == variant::ferry || v == variant::copy_only || v == variant::ferry_kernel ? shape_opts{} : legacy_shape();
}

void launch_baseline(B b, variant v, const fb::launch_config& lc, fb::stream_view<B> s, const copy_args& a)
{
  const auto tag = typename B::tag{};
  if (v == variant::old_volatile) {
    b.launch(baseline_volatile_kernel(tag), lc, s.handle(), a);
  } else if (v == variant::per_entry_release) {
    b.launch(baseline_sysflag_kernel(tag), lc, s.handle(), a);
  } else if (a.cursor_mode == 0) {  // the copy-only baseline proper: the small kernel of its copy form
    const bool aligned = ((reinterpret_cast<std::uintptr_t>(a.src) | reinterpret_cast<std::uintptr_t>(a.dst)) & 15U) == 0;
    const auto f = aligned ? fd::detail::vec_form(a.vecs_per_thread) : fd::detail::copy_form::bytes;
    b.launch(bench_copy_plain_kernel(tag, f), lc, s.handle(), a);
  } else {
    b.launch(bench_copy_kernel(tag), lc, s.handle(), a);
  }
}

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
  b.launch(fd::detail::copy_entry_kernel(typename B::tag{}, fd::detail::copy_form_of(src, vpt)), launch, cs.handle(), a);
}

}  // namespace ferry::bench
