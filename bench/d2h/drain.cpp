// SPDX-License-Identifier: Apache-2.0
// drain/ferry_64MiB: ferry's drain bandwidth with 64 MiB entries (GB/s, wall time from the first capture to
// the last delivery, every entry's sampled words checked); drain/memcpy_ceiling_64MiB: the plain pinned
// D2H cudaMemcpyAsync bandwidth of the same machine (events), the ceiling the drain is held against.
#include "common.hpp"

#include <chrono>
#include <thread>

namespace ferry::bench {

namespace {

constexpr std::uint64_t P = 64 * MiB;
constexpr int copies = host_mode ? 6 : 48;

double drain_gbps()
{
  B b{};
  b.set_device(fb::device_id{0});
  fb::stream<B> s{b};
  fb::device_buffer<B> src{P, b};
  fill_device(b, s, src.data(), P, 7);
  fd::config cfg;
  cfg.ring_bytes = host_mode ? 128 * MiB : 1024 * MiB;
  cfg.staging_bytes = host_mode ? 128 * MiB : 512 * MiB;
  cfg.publish_every = 4;
  cfg.tuning.fused_copy_max_bytes = 32 * KiB;
  cfg.timeout = std::chrono::seconds(60);
  std::atomic<std::uint64_t> done{0};
  fd::channel<B> ch{cfg, b, [&](fd::entry_view&& e) {
                      auto& k = checks();
                      k.checked.fetch_add(1);
                      if (!e.ok() || e.size() != P || !check_words(e.bytes().data(), P, 7, false)) { k.bad.fetch_add(1); }
                      done.fetch_add(1);
                    }};
  const auto t0 = std::chrono::steady_clock::now();
  ch.begin_forward(s);
  for (int i = 0; i < copies; ++i) { ch.capture(fd::hook_id{1}, src.data(), P, s); }
  (void)ch.end_forward(s);
  while (done.load() < static_cast<std::uint64_t>(copies)) { std::this_thread::sleep_for(std::chrono::microseconds(50)); }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (void)ch.close();
  return static_cast<double>(copies * P) / sec / 1e9;
}

double memcpy_gbps()
{
  B b{};
  b.set_device(fb::device_id{0});
  fb::stream<B> s{b};
  fb::device_buffer<B> src{P, b};
  fb::pinned_buffer<B> dst{P, b};
  fb::event<B> e0{b, fb::event_flags::timing}, e1{b, fb::event_flags::timing};
  b.memcpy_async(dst.data(), src.data(), P, fb::memcpy_kind::device_to_host, s.handle());  // warm
  e0.record(s);
  for (int i = 0; i < copies; ++i) { b.memcpy_async(dst.data(), src.data(), P, fb::memcpy_kind::device_to_host, s.handle()); }
  e1.record(s);
  e1.synchronize();
  return static_cast<double>(copies * P) / (e1.elapsed_ms_since(e0) / 1e3) / 1e9;
}

/// A bandwidth run: counter GBps, iteration time = the time of one GB at that rate.
void register_gbps(const std::string& name, double (*fn)())
{
  register_measurement(name, [fn] {
    const double g = fn();
    return measured{1.0 / g, {{"GBps", g}}};
  });
}

}  // namespace

void register_drain()
{
  register_gbps("drain/ferry_64MiB", &drain_gbps);
  register_gbps("drain/memcpy_ceiling_64MiB", &memcpy_gbps);
}

}  // namespace ferry::bench
