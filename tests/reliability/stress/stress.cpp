// SPDX-License-Identifier: Apache-2.0
// Stress on the host backend (issue item 3), meant for ThreadSanitizer and AddressSanitizer builds.
//
// D2H: rounds of two channels at once (emulated devices 0 and 1, each driven by a thread whose current
// device is the channel's), random ring sizes, K, entry sizes, size-ring widths, dynamic entries (some
// overflowing), head placements, drain thread or poll, drain delays (host_backend::set_jitter and
// ferry::testing::d2h_access::set_copy_delay). Every payload word is pattern_word(seq, i); every delivered
// entry is checked (order, hook, size, bytes) and every produced entry must be delivered.
// H2D: random declarations (units, capacities, group membership), slot counts, upload backends; random
// counts per step, slot rotation, late resume + rewrite (republish); device bytes checked after each step.
//
//   ferry_rel_stress [--quick] [--entries N] [--seed S]
//     default: CI mode, >= 10^6 D2H entries;  --quick: 10^5 (ctest);  FERRY_STRESS_NIGHTLY=1: 10^8
// Prints "stress: N entries checked, M failures"; exits 1 on failures.
#include "common.hpp"

#include <ferry/testing/d2h_access.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

namespace ferry::rel {
namespace {

using HB = fb::host_backend;
using namespace std::chrono_literals;

struct d2h_round_result {
  std::uint64_t produced{0}, checked{0};
};

/// One channel on device `dev`, driven by the calling thread: `n` entries in random forwards.
d2h_round_result d2h_channel_run(int dev, std::uint64_t n, std::uint64_t seed, tally& t)
{
  d2h_round_result res;
  std::mt19937_64 rng{seed};
  HB b;
  b.set_device(fb::device_id{dev});
  fd::config cfg;
  const std::uint64_t ring_choices[] = {4096, 8192, 24576, 65536, 262144};
  cfg.ring_bytes = ring_choices[rng() % 5];
  cfg.publish_every = static_cast<std::uint32_t>(1 + rng() % 24);
  cfg.tuning.size_slots = rng() % 3 == 0 ? 0 : static_cast<std::uint32_t>(4 + rng() % 60);
  cfg.tuning.head_memory = rng() % 2 ? fd::head_memory::managed : fd::head_memory::pinned_mapped;
  cfg.drain = rng() % 3 == 0 ? fd::drain_mode::poll : fd::drain_mode::thread;
  cfg.staging_bytes = rng() % 2 ? 0 : cfg.ring_bytes * 2;
  cfg.tuning.max_copies_in_flight = static_cast<std::uint32_t>(1 + rng() % 16);
  cfg.fifo_capacity = static_cast<std::uint32_t>(64 + rng() % 512);
  cfg.tuning.fused_copy_max_bytes = rng() % 2 ? 0 : 1024;
  cfg.timeout = 30s;
  const auto copy_delay = std::chrono::microseconds{rng() % 8 == 0 ? rng() % 20 : 0};  // test hook, set below
  const std::uint64_t max_size = std::min<std::uint64_t>(cfg.ring_bytes / 4, 1 + rng() % 2048);
  const std::uint64_t stride = (max_size + 15) / 16 * 16;
  constexpr std::uint64_t batch = 64;
  const std::string tag = "d2h dev " + std::to_string(dev) + " seed " + std::to_string(seed);

  fb::stream<HB> s{b};
  sources<HB> src{b, batch, stride};
  fb::device_buffer<HB> actual_dev{batch * 8, b};
  fb::pinned_buffer<HB> actual_host{batch * 8, b};
  d2h_checker chk;
  try {
    fd::channel<HB> ch{cfg, b, chk.callback()};
    ferry::testing::d2h_access::set_copy_delay(ch, copy_delay);
    std::uint64_t seq = 0;
    while (seq < n) {
      // New batch of sources: the previous batch's copy kernels have read theirs (stream synchronized).
      s.synchronize();
      src.fill(seq, s.handle());
      auto* act = actual_host.as<std::uint64_t>();
      const std::uint64_t first = seq;
      std::vector<std::uint64_t> sizes(batch);
      std::vector<bool> dyn(batch), over(batch);
      for (std::uint64_t k = 0; k < batch; ++k) {
        sizes[k] = 1 + rng() % max_size;
        dyn[k] = rng() % 6 == 0;  // size_slots 0: derived (one per FIFO slot)
        act[k] = sizes[k];
        if (dyn[k]) {
          over[k] = rng() % 40 == 0;
          act[k] = over[k] ? (sizes[k] + 15) / 16 * 16 + 1 + rng() % 64 : 1 + rng() % sizes[k];
        }
      }
      b.memcpy_async(actual_dev.data(), actual_host.data(), batch * 8, fb::memcpy_kind::host_to_device, s.handle());
      std::uint64_t k = 0;
      while (k < batch && seq < n) {
        ch.begin_forward(s);
        const std::uint64_t in_fwd = 1 + rng() % 40;
        for (std::uint64_t j = 0; j < in_fwd && k < batch && seq < n; ++j, ++k, ++seq) {
          const auto hook = static_cast<std::uint32_t>(j);
          if (dyn[k]) {
            chk.expect(seq, hook, act[k], over[k]);
            ch.capture_dynamic(fd::hook_id{hook}, src.at(k), sizes[k],
                               actual_dev.as<std::uint64_t>() + k, s);
          } else {
            chk.expect(seq, hook, sizes[k]);
            ch.capture(fd::hook_id{hook}, src.at(k), sizes[k], s);
          }
        }
        (void)ch.end_forward(s);
        if (cfg.drain == fd::drain_mode::poll) { (void)ch.poll(); }
      }
      (void)first;
    }
    if (cfg.drain == fd::drain_mode::poll) {
      s.synchronize();
      while (ch.stats().entries_drained < seq) {
        if (ch.poll() == 0) { std::this_thread::yield(); }
      }
    }
    const auto rep = ch.close();
    t.expect(rep.clean() && rep.delivered == seq, tag + ": close not clean or delivered " + std::to_string(rep.delivered));
    const auto st = ch.stats();
    t.expect(st.entries_drained == seq && st.entries_published == seq, tag + ": stats drained/published mismatch");
    t.expect(st.high_watermark <= cfg.ring_bytes, tag + ": high watermark above the ring");
    res.produced = seq;
  } catch (const std::exception& e) {
    t.fail(tag + ": " + e.what());
  }
  std::lock_guard lock{chk.m};
  if (chk.bad() > 0) { t.fail(tag + ": " + std::to_string(chk.bad()) + " bad entries, first: " + chk.first_bad); }
  if (!chk.expected.empty()) { t.fail(tag + ": " + std::to_string(chk.expected.size()) + " entries never delivered"); }
  res.checked = chk.got;
  return res;
}

// ---------------------------------------------------------------------------------------------------------

std::uint64_t h2d_run(std::uint64_t steps, std::uint64_t seed, tally& t)
{
  std::mt19937_64 rng{seed};
  HB b;
  b.set_device(fb::device_id{0});
  const fh::upload_backend kinds[] = {fh::upload_backend::packed, fh::upload_backend::zerocopy,
                                      fh::upload_backend::direct, fh::upload_backend::batch};
  const auto kind = kinds[rng() % 4];
  const std::string tag = "h2d seed " + std::to_string(seed) + " " + std::string{fh::to_string(kind)};
  std::uint64_t checked = 0;
  try {
    fb::stream<HB> owner{b};
    fh::publisher<HB> pub{b};
    struct buf {
      fh::buffer_handle h;
      std::size_t cap_units, unit_bytes;
      std::vector<std::string> groups;
    };
    const std::vector<std::string> group_names{"g0", "g1", "g2"};
    std::vector<buf> bufs;
    const std::size_t nbuf = 2 + rng() % 5;
    for (std::size_t i = 0; i < nbuf; ++i) {
      buf x;
      const int u = static_cast<int>(rng() % 3);
      fh::buffer_spec sp;
      sp.name = "buf" + std::to_string(i);
      x.cap_units = 1 + rng() % 200;
      for (const auto& g : group_names) {
        if (rng() % 2) { x.groups.push_back(g); }
      }
      if (x.groups.empty()) { x.groups.push_back(group_names[i % 3]); }
      for (const auto& g : x.groups) { sp.groups.push_back(g); }
      sp.capacity = x.cap_units;
      if (u == 0) {
        sp.unit = fh::count_unit::bytes;
        sp.element_size = 1;
        x.unit_bytes = 1;
      } else if (u == 1) {
        sp.unit = fh::count_unit::elements;
        sp.element_size = 1U << (rng() % 4);
        x.unit_bytes = sp.element_size;
      } else {
        sp.unit = fh::count_unit::rows;
        sp.element_size = 4;
        sp.row_size = 4 * (1 + rng() % 9);
        x.unit_bytes = sp.row_size;
      }
      x.h = pub.declare(sp);
      bufs.push_back(x);
    }
    fh::config c;
    c.slots = 2 + rng() % 3;
    c.backend = kind;
    c.device = b.current_device();
    c.calibration_iterations = 2;
    pub.initialize(c, owner.view());
    auto members = [&](const std::string& g) {
      std::vector<std::size_t> v;
      for (std::size_t i = 0; i < bufs.size(); ++i) {
        for (const auto& x : bufs[i].groups) {
          if (x == g) { v.push_back(i); }
        }
      }
      return v;
    };
    auto produce = [&](const std::string& g, bool rewrite, std::uint64_t key,
                       std::map<std::size_t, std::vector<std::uint8_t>>& want) {
      auto p = rewrite ? pub.rewrite(g, "stress republish") : pub.producer(g);
      for (auto i : members(g)) {
        const std::size_t n = rng() % 5 == 0 ? 0 : rng() % (bufs[i].cap_units + 1);
        auto src = p.template source<std::uint8_t>(bufs[i].h);
        auto& w = want[i];
        w.assign(n * bufs[i].unit_bytes, 0);
        for (std::size_t j = 0; j < w.size(); ++j) { w[j] = src[j] = ferry::testing::pattern_byte(key * 7 + i, j); }
        p.set_count(bufs[i].h, n);
      }
    };
    auto verify = [&](const std::map<std::size_t, std::vector<std::uint8_t>>& want, std::uint64_t step) {
      owner.synchronize();
      for (const auto& [i, w] : want) {
        if (w.empty()) { continue; }
        const auto got = read_back(b, pub.device_pointer(bufs[i].h), w.size());
        t.expect(got == w, tag + ": step " + std::to_string(step) + " buffer " + std::to_string(i) + " wrong bytes");
        ++checked;
      }
    };
    for (std::uint64_t step = 0; step < steps; ++step) {
      const std::size_t slot = step % c.slots;
      const std::string g = group_names[rng() % 3];
      if (members(g).empty()) { continue; }
      std::map<std::size_t, std::vector<std::uint8_t>> want;
      {
        auto sg = pub.begin(slot);
        produce(g, false, step * 2, want);
        pub.publish(g, owner.view());
        sg.finish();
      }
      if (rng() % 4 == 0) {  // late preparation: resume the epoch and republish the group deliberately
        auto rg = pub.resume(slot);
        produce(g, true, step * 2 + 1, want);
        pub.publish(g, owner.view());
        rg.finish();
      }
      if (rng() % 3 == 0 || step + 1 == steps) { verify(want, step); }
    }
    owner.synchronize();
  } catch (const std::exception& e) {
    t.fail(tag + ": " + e.what());
  }
  return checked;
}

}  // namespace
}  // namespace ferry::rel

int main(int argc, char** argv)
{
  using namespace ferry::rel;
  std::uint64_t target = 1'000'000;
  std::uint64_t seed = 20240601;
  if (const char* e = std::getenv("FERRY_STRESS_NIGHTLY"); e != nullptr && std::string_view{e} == "1") {
    target = 100'000'000;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") { target = 100'000; }
    if (a == "--entries" && i + 1 < argc) { target = std::strtoull(argv[++i], nullptr, 10); }
    if (a == "--seed" && i + 1 < argc) { seed = std::strtoull(argv[++i], nullptr, 10); }
  }
  tally t;
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t d2h_checked = 0, d2h_produced = 0, rounds = 0;
  std::mt19937_64 rng{seed};
  while (d2h_produced < target) {
    // One round: both devices at once, each with its own random configuration.
    const std::uint64_t per = std::min<std::uint64_t>(std::max<std::uint64_t>((target - d2h_produced) / 2, 1),
                                                      20'000 + rng() % 80'000);
    const bool jitter = rounds % 5 == 4;
    ferry::backend::host_backend::set_jitter(std::chrono::microseconds{jitter ? 1 + rng() % 3 : 0});
    const std::uint64_t n = jitter ? std::max<std::uint64_t>(per / 20, 1) : per;
    d2h_round_result r[2];
    const std::uint64_t s0 = rng(), s1 = rng();
    std::thread t1{[&] { r[1] = d2h_channel_run(1, n, s1, t); }};
    r[0] = d2h_channel_run(0, n, s0, t);
    t1.join();
    for (auto& x : r) {
      d2h_checked += x.checked;
      d2h_produced += std::max(x.produced, n);  // a failed round still advances (its failure is counted)
    }
    ++rounds;
  }
  ferry::backend::host_backend::set_jitter(std::chrono::microseconds{0});
  const double d2h_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::uint64_t h2d_checked = 0;
  const std::uint64_t h2d_runs = target >= 1'000'000 ? 12 : 4;
  for (std::uint64_t i = 0; i < h2d_runs; ++i) { h2d_checked += h2d_run(target >= 1'000'000 ? 400 : 150, seed + i, t); }
  const double all_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("stress: d2h %llu entries checked in %llu rounds (2 channels each), %.1f s; h2d %llu buffer images "
              "checked in %llu runs, %.1f s\n",
              static_cast<unsigned long long>(d2h_checked), static_cast<unsigned long long>(rounds), d2h_s,
              static_cast<unsigned long long>(h2d_checked), static_cast<unsigned long long>(h2d_runs), all_s - d2h_s);
  std::printf("stress: %llu entries checked, %llu failures\n",
              static_cast<unsigned long long>(d2h_checked + h2d_checked), static_cast<unsigned long long>(t.failures));
  return t.failures == 0 ? 0 : 1;
}
