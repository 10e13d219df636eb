// SPDX-License-Identifier: Apache-2.0
// H2D metadata publication benchmark (Google Benchmark + a JSON summary for docs/perf).
//
// Built twice: ferry_bench_h2d (CUDA backend, FERRY_BENCH_CUDA) and ferry_bench_h2d_host (host backend,
// a demo that runs anywhere). Measured like shared/anchors-h200.md:
//   GPU span : event before the first upload operation -> end of a first-consumer kernel that reads every
//              published byte (checksum kernel: one block of 256 threads per 4 KiB chunk of a member, one
//              16-byte load per thread, chunk descriptors in the kernel parameters: a realistic cheap first
//              consumer, the same for every variant), median of many iterations after a warm-up;
//   floor    : the same span with no upload (event, consumer, event);
//   CPU      : wall time of publish() (eager: validation + arena header + enqueue) or stage() (graph).
// Eager spans include the CPU's enqueue latency (the GPU is idle when the first event runs), as in the
// reference figures. Data are random and non-zero; every variant verifies the published bytes on its first
// and last iteration, and the process exits non-zero on a mismatch.
//
//   runner.cpp    one publisher configuration, its consumer, one timed iteration, the check
//   summary.cpp   the JSON summary: the anchor cases' cells round-robin, the bare API's CPU cost
//   variants.cpp  the summary's scatter knob grid
//   gbench.cpp    Google Benchmark's runs h2d/<case>/<backend>/<mode>
//
//   --ferry_json=PATH  write {"device","commit","date","command","cases":{...}} (stripped before gbench)
//   FERRY_BENCH_ITERS  iterations per JSON cell (default 1000; 200 on the host backend); the "variants"
//                      grid (scatter tile bytes x threads x speculation, graph, decode256 and small64) uses
//                      half as many
//   FERRY_BENCH_VARIANTS=0  skip the variants grid
#include "common.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

int main(int argc, char** argv)
{
  namespace fbench = ferry::bench;
  std::string json_path;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a{argv[i]};
    if (a.rfind("--ferry_json=", 0) == 0) {
      json_path = std::string{a.substr(13)};
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  if (fbench::B{}.device_count() <= 0) {
    std::fprintf(stderr, "ferry_bench_h2d: no %s device\n", std::string{fbench::B::name()}.c_str());
    return 2;
  }
  int rc = 0;
  try {
    if (!json_path.empty()) { rc = fbench::write_json(json_path); }
    benchmark::Initialize(&n, args.data());
    fbench::register_all();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry_bench_h2d: %s\n", e.what());
    return 1;
  }
  if (fbench::mismatch_seen()) {
    std::fprintf(stderr, "ferry_bench_h2d: published bytes did not match their sources\n");
    return 3;
  }
  return rc;
}
