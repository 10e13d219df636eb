// SPDX-License-Identifier: Apache-2.0
// The runner (common.hpp): one publisher over a case's members, its first-consumer kernel, one timed
// iteration (eager: event, publish, consumer, event; graph: stage, event, graph launch, event) and the check
// of the published bytes against their sources.
#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

namespace ferry::bench {

runner::runner(const std::vector<member>& members, variant v, fh::upload_backend k, bool graph, knobs kn)
  : members_{members}, variant_{v}, backend_{k}, graph_{graph}
{
  stream_.emplace(b_);
  t0_.emplace(b_, fb::event_flags::timing);
  t1_.emplace(b_, fb::event_flags::timing);
  pub_ = std::make_unique<fh::publisher<B>>(b_);
  for (const auto& m : members_) {
    handles_.push_back(pub_->declare({.name = m.name, .groups = {"meta"}, .unit = m.unit, .element_size = m.element_size,
                                      .row_size = m.row_size, .capacity = m.count}));
  }
  fh::config c;
  c.slots = 2;
  c.backend = k;
  c.device = b_.current_device();
  c.calibration_iterations = 25;
  if (kn.tile_bytes != 0) { c.tile_bytes = kn.tile_bytes; }
  if (kn.threads != 0) { c.threads_per_tile = kn.threads; }
  c.speculation = kn.speculation;
  pub_->initialize(c, stream_->view());
  // Consumer chunks: every member's published bytes, cut into consumer_chunk pieces (one block each).
  std::vector<ferry::testing::checksum_chunk> chunks;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    const auto base = reinterpret_cast<std::uintptr_t>(pub_->device_pointer(handles_[i]));
    const std::size_t n = members_[i].bytes();
    for (std::size_t off = 0; off < n; off += consumer_chunk) {
      chunks.push_back({base + off, std::min(consumer_chunk, n - off)});
    }
  }
  constexpr std::size_t inl = ferry::testing::checksum_params::inline_max;
  consumer_.count = static_cast<std::uint32_t>(chunks.size());
  for (std::size_t i = 0; i < chunks.size() && i < inl; ++i) { consumer_.chunk[i] = chunks[i]; }
  if (chunks.size() > inl) {
    const std::size_t extra = (chunks.size() - inl) * sizeof(chunks[0]);
    more_.emplace(extra, b_);
    upload(more_->data(), chunks.data() + inl, extra);
    consumer_.more = more_->template as<const ferry::testing::checksum_chunk>();
  }
  out_.emplace(8 * consumer_threads * chunks.size(), b_);
  consumer_.out = out_->template as<std::uint64_t>();
  // Random non-zero data in both slots' sources; the stamp word changes every iteration.
  std::mt19937_64 rng{0xF3EE + members_.size()};
  for (std::size_t slot = 0; slot < 2; ++slot) {
    auto s = pub_->begin(slot);
    auto p = pub_->producer("meta");
    for (std::size_t i = 0; i < members_.size(); ++i) {
      auto span = p.source<std::uint8_t>(handles_[i]);
      for (auto& x : span) { x = static_cast<std::uint8_t>(rng() | 1u); }
      p.set_count(handles_[i], members_[i].count);
    }
    if (graph_) {
      graphs_.push_back(fb::graph_exec<B>::capture(stream_->view(), [&](fb::stream_view<B> sv) {
        if (variant_ == variant::upload) { pub_->capture_upload("meta", slot, sv); }
        consume(sv);
      }));
    }
    s.finish();  // counts set, nothing published: the next epoch of this slot starts clean
  }
  stream_->synchronize();
}

std::pair<double, double> runner::iterate(std::uint64_t i, bool verify)
{
  const std::size_t slot = i % 2;
  auto s = pub_->begin(slot);
  double cpu_us = 0;
  if (variant_ == variant::upload) {
    {
      auto p = pub_->producer("meta");
      for (std::size_t m = 0; m < members_.size(); ++m) {
        auto span = p.source<std::uint8_t>(handles_[m]);
        const std::uint64_t stamp = (i << 8) | 0x80u | m;
        std::memcpy(span.data(), &stamp, std::min<std::size_t>(8, span.size()));
        p.set_count(handles_[m], members_[m].count);
      }
    }
    if (graph_) {
      const auto c0 = std::chrono::steady_clock::now();
      pub_->stage("meta");
      cpu_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
      t0_->record(*stream_);
      graphs_[slot].launch(*stream_);
    } else {
      t0_->record(*stream_);
      const auto c0 = std::chrono::steady_clock::now();
      pub_->publish("meta", stream_->view());
      cpu_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
      consume(stream_->view());
    }
  } else {
    t0_->record(*stream_);
    if (graph_) {
      graphs_[slot].launch(*stream_);
    } else {
      consume(stream_->view());
    }
  }
  t1_->record(*stream_);
  s.finish();
  t1_->synchronize();
  const double gpu_us = static_cast<double>(t1_->elapsed_ms_since(*t0_)) * 1000.0;
  if (verify && variant_ == variant::upload) { check(slot); }
  return {gpu_us, cpu_us};
}

runner::stats runner::measure(int iters, int warmup)
{
  std::vector<double> gpu, cpu;
  for (int i = 0; i < warmup + iters; ++i) {
    const bool verify = i == 0 || i == warmup + iters - 1;
    auto [g, c] = iterate(static_cast<std::uint64_t>(i), verify);
    if (i >= warmup) {
      gpu.push_back(g);
      cpu.push_back(c);
    }
  }
  return {median(gpu), median(cpu)};
}

void runner::consume(fb::stream_view<B> s)
{
  b_.launch(ferry::testing::checksum_kernel(B::tag{}), fb::launch_config{{consumer_.count}, {consumer_threads}, 0},
            s.handle(), consumer_);
}

void runner::upload(void* dst, const void* src, std::size_t n)
{
  fb::pinned_buffer<B> tmp{n, b_};
  std::memcpy(tmp.data(), src, n);
  b_.memcpy_async(dst, tmp.data(), n, fb::memcpy_kind::host_to_device, stream_->handle());
  stream_->synchronize();
}

/// Published bytes == the slot's sources (read through a fresh producer of the next epoch of the slot
/// would rewrite them; read them before, through the device copy and a host copy of the arena).
void runner::check(std::size_t slot)
{
  stream_->synchronize();
  auto s = pub_->begin(slot);  // waits for the slot; the sources still hold what was published
  auto p = pub_->producer("meta");
  for (std::size_t m = 0; m < members_.size(); ++m) {
    auto span = p.source<std::uint8_t>(handles_[m]);
    const std::size_t n = members_[m].bytes();
    fb::pinned_buffer<B> tmp{n, b_};
    b_.memcpy_async(tmp.data(), pub_->device_pointer(handles_[m]), n, fb::memcpy_kind::device_to_host,
                    stream_->handle());
    stream_->synchronize();
    if (std::memcmp(tmp.data(), span.data(), n) != 0) {
      std::fprintf(stderr, "ferry_bench_h2d: MISMATCH in member '%s' (%s%s)\n", members_[m].name.c_str(),
                   std::string{fh::to_string(backend_)}.c_str(), graph_ ? ", graph" : "");
      note_mismatch();
    }
    p.set_count(handles_[m], members_[m].count);
  }
  // Leave the epoch unpublished (sources unchanged).
}

}  // namespace ferry::bench
