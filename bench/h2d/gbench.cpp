// SPDX-License-Identifier: Apache-2.0
// Google Benchmark's runs: h2d/<case>/<floor|backend>/<eager|graph> for the anchor cases and, on a GPU, the
// member-count and member-size sweeps (sweep_<n>x<bytes>B); manual time = the GPU span.
#include "common.hpp"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

namespace ferry::bench {

namespace {

void run_bm(benchmark::State& state, std::vector<member> members, variant v, fh::upload_backend k, bool graph)
{
  runner r{members, v, k, graph};
  for (int i = 0; i < 20; ++i) { (void)r.iterate(static_cast<std::uint64_t>(i), i == 0); }
  std::vector<double> gpu, cpu;
  std::uint64_t i = 20;
  for (auto _ : state) {
    auto [g, c] = r.iterate(i++, false);
    state.SetIterationTime(g * 1e-6);
    gpu.push_back(g);
    cpu.push_back(c);
  }
  (void)r.iterate(i, true);
  state.counters["gpu_median_us"] = median(gpu);
  state.counters["cpu_median_us"] = median(cpu);
  state.counters["bytes"] = static_cast<double>(total_bytes(members));
  if (k == fh::upload_backend::automatic && v == variant::upload) { state.SetLabel("auto=" + r.chosen()); }
}

}  // namespace

void register_all()
{
  const int iters = host_demo ? 50 : 300;
  std::vector<named_case> cases = anchor_cases();
  if (host_demo) {
    cases.resize(2);  // the host demo stays small
  } else {
    for (std::size_t n : {1, 2, 8, 16, 128, 256}) { cases.push_back({"", uniform(n, 256)}); }
    for (std::size_t sz : {16, 1024, 4096, 16384, 65536}) { cases.push_back({"", uniform(16, sz)}); }
  }
  for (auto& c : cases) {
    const std::string cname = c.name[0] != '\0' ? std::string{c.name}
                                                : fmt::format("sweep_{}x{}B", c.members.size(), c.members.front().bytes());
    for (bool graph : {false, true}) {
      const std::string mode = graph ? "graph" : "eager";
      benchmark::RegisterBenchmark(fmt::format("h2d/{}/floor/{}", cname, mode).c_str(), run_bm, c.members,
                                   variant::floor, fh::upload_backend::direct, graph)
        ->UseManualTime()
        ->Iterations(iters)
        ->Unit(benchmark::kMicrosecond);
      for (auto k : all_backends) {
        if (graph && k == fh::upload_backend::batch) { continue; }
        benchmark::RegisterBenchmark(fmt::format("h2d/{}/{}/{}", cname, fh::to_string(k), mode).c_str(), run_bm,
                                     c.members, variant::upload, k, graph)
          ->UseManualTime()
          ->Iterations(iters)
          ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace ferry::bench
