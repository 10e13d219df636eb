// SPDX-License-Identifier: Apache-2.0
// D2H publication benchmarks (Google Benchmark). Self-checking: every entry ferry delivers is verified
// (every word in the simulated forward, sampled words in the large-payload runs); the binary exits 1 when
// any of ferry's entries is bad.
//
//   per_hook_graph/<bytes>  per_hook.cpp   GPU time per hook of back-to-back hooks in one graph, round-robin
//                                          contestants (copy only, old volatile, per-entry release, ferry K)
//   forward/<v>/hooks:<H>   forward.cpp    the simulated forward (28 layers, 16 KiB per hook), us/forward:
//                                          ferry beside copy only, per-entry release, event per hook, ...
//   drain/...               drain.cpp      drain bandwidth with 64 MiB entries, and the pinned D2H ceiling
//   variants/...            variants.cpp   layouts x placement, diagnostics (FERRY_D2H_VARIANTS=0: none)
//
// Every figure is a user counter of its run: write them with `--benchmark_out=<file>
// --benchmark_out_format=json` and derive the summary (overheads, publication above copies; the keys of
// docs/perf/h200/d2h.json) with `python3 bench/device/reports/run_files.py d2h-summary <file> <summary.json>`.
// Each run also carries the entries it checked (entries_checked, entries_bad, baseline_entries_*); the
// context carries the device and backend, and FERRY_COMMIT / FERRY_DATE / FERRY_COMMAND when set.
#include "common.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv)
{
  namespace fbench = ferry::bench;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) { return 2; }
  {
    fbench::B b{};
    if (b.device_count() <= 0) {
      std::fprintf(stderr, "ferry_bench_d2h: no %s device\n", std::string{fbench::B::name()}.c_str());
      return 3;
    }
    benchmark::AddCustomContext("ferry_device", b.attributes(ferry::backend::device_id{0}).name);
    benchmark::AddCustomContext("ferry_backend", std::string{fbench::B::name()});
    for (const char* k : {"FERRY_COMMIT", "FERRY_DATE", "FERRY_COMMAND"}) {
      if (const char* v = std::getenv(k)) { benchmark::AddCustomContext(k, v); }
    }
  }
  fbench::register_per_hook();
  fbench::register_forward();
  if (const char* v = std::getenv("FERRY_D2H_VARIANTS"); v == nullptr || std::string{v} != "0") { fbench::register_variants(); }
  fbench::register_drain();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  const auto& k = fbench::checks();
  std::printf("ferry_bench_d2h: entries checked %llu, bad %llu (baseline drains: checked %llu, bad %llu)\n",
              static_cast<unsigned long long>(k.checked.load()), static_cast<unsigned long long>(k.bad.load()),
              static_cast<unsigned long long>(k.baseline_checked.load()),
              static_cast<unsigned long long>(k.baseline_bad.load()));
  return k.bad.load() > 0 ? 1 : 0;
}
