// SPDX-License-Identifier: Apache-2.0
// The JSON summary (--ferry_json, docs/perf/h200/h2d.json's keys): every anchor case's cells replayed
// round-robin, the bare API's CPU cost, and on a GPU the scatter knob grid (variants.cpp).
#include "common.hpp"

#include <ferry/h2d/detail/kernels.hpp>  // scatter_kernel: the bare-API floor

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>

namespace ferry::bench {

namespace {

/// CPU cost of the bare API calls publish() makes (no validation): packed = one H2D copy of `bytes` from
/// pinned memory + one scatter-sized launch; zerocopy = the launch alone. publish()'s CPU time minus these
/// is ferry's own overhead.
std::string api_floor_json(int iters)
{
  B b{};
  fb::stream<B> st{b};
  const std::size_t bytes = 80 * 1024;
  fb::pinned_buffer<B> host{bytes, b};
  fb::device_buffer<B> dev{bytes, b};
  std::memset(host.data(), 1, bytes);
  ferry::h2d::detail::scatter_params p{};
  p.tile_count = 0;  // launches, copies nothing
  auto k = ferry::h2d::detail::scatter_kernel(B::tag{});
  b.preload(k);
  auto time = [&](bool copy) {
    std::vector<double> v;
    for (int i = 0; i < iters + 50; ++i) {
      const auto c0 = std::chrono::steady_clock::now();
      if (copy) { b.memcpy_async(dev.data(), host.data(), bytes, fb::memcpy_kind::host_to_device, st.handle()); }
      b.launch(k, fb::launch_config{{28}, {128}, 0}, st.handle(), p);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
      st.synchronize();
      if (i >= 50) { v.push_back(us); }
    }
    return median(std::move(v));
  };
  const double both = time(true);
  const double launch = time(false);
  std::fprintf(stderr, "ferry_bench_h2d: bare API CPU: memcpy(80 KiB)+launch %.2f us, launch %.2f us\n", both, launch);
  return fmt::format(",\n  \"api_cpu_us\": {{\"memcpy_plus_launch\": {}, \"launch\": {}}}", json_num(both),
                     json_num(launch));
}

/// One case's cells: floor and floor_graph, then every backend eager and (but batch) in a graph, each
/// cell's median GPU span and CPU time, auto's choices and packed's tile count, as "key": value fields.
std::string case_fields(const named_case& c, int iters)
{
  // Every cell of the case is replayed round-robin (one iteration of each per round, after 50 warm-up
  // rounds), so clock or machine drift during the case hits every backend alike and "auto within 5% of
  // the best fixed backend" compares like with like.
  struct contestant {
    std::string key;
    std::unique_ptr<runner> r;
    std::vector<double> gpu, cpu;
  };
  std::vector<contestant> rs;
  rs.push_back({"floor", std::make_unique<runner>(c.members, variant::floor, fh::upload_backend::direct, false)});
  rs.push_back({"floor_graph", std::make_unique<runner>(c.members, variant::floor, fh::upload_backend::direct, true)});
  for (auto k : all_backends) {
    const std::string kn{fh::to_string(k)};
    rs.push_back({kn, std::make_unique<runner>(c.members, variant::upload, k, false)});
    if (k != fh::upload_backend::batch) {  // cudaMemcpyBatchAsync cannot be captured
      rs.push_back({kn + "_graph", std::make_unique<runner>(c.members, variant::upload, k, true)});
    }
  }
  constexpr int warmup = 50;
  // The order within a round is shuffled every round (fixed seed): in a fixed order each cell always
  // follows the same predecessor, and what ran just before a cell moves its span (auto's graph cell, the
  // same backend as zerocopy_graph, read consistently above it).
  std::vector<std::size_t> order(rs.size());
  for (std::size_t k = 0; k < order.size(); ++k) { order[k] = k; }
  std::mt19937 shuffle_rng{0x5EED};
  for (int i = 0; i < warmup + iters; ++i) {
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (const std::size_t k : order) {
      auto& x = rs[k];
      const bool verify = i == 0 || i == warmup + iters - 1;
      auto [g, cpu] = x.r->iterate(static_cast<std::uint64_t>(i), verify);
      if (i >= warmup) {
        x.gpu.push_back(g);
        x.cpu.push_back(cpu);
      }
    }
  }
  std::map<std::string, std::string> cell;
  cell["batch_graph_us"] = "null";
  for (auto& x : rs) {
    cell[x.key + "_us"] = json_num(median(x.gpu));
    if (x.key.rfind("floor", 0) != 0) { cell[x.key + "_cpu_us"] = json_num(median(x.cpu)); }
    if (x.key == "auto") {
      cell["auto_choice"] = "\"" + x.r->chosen() + "\"";
      cell["auto_graph_choice"] = "\"" + x.r->chosen_graph() + "\"";
    }
    if (x.key == "packed") { cell["tiles"] = fmt::format("{}", x.r->tiles()); }
  }
  std::string fields;
  for (const auto& [key, v] : cell) { fields += fmt::format("{}\"{}\": {}", fields.empty() ? "" : ", ", key, v); }
  return fields;
}

std::string env(const char* n)
{
  const char* v = std::getenv(n);
  return std::string{v != nullptr ? v : ""};
}

}  // namespace

int write_json(const std::string& path)
{
  int iters = host_demo ? 200 : 1000;
  if (const char* e = std::getenv("FERRY_BENCH_ITERS")) { iters = std::max(1, std::atoi(e)); }
  B b{};
  const std::string device = b.attributes(b.current_device()).name;
  std::string out = fmt::format("{{\n  \"device\": \"{}\",\n  \"backend\": \"{}\",\n  \"commit\": \"{}\",\n  \"date\": \"{}\",\n  \"command\": \"{}\",\n  \"iterations\": {},\n  \"cases\": {{",
                                json_escape(device), B::name(), json_escape(env("FERRY_COMMIT")), json_escape(env("FERRY_DATE")),
                                json_escape(env("FERRY_COMMAND")), iters);
  bool first_case = true;
  for (auto& c : anchor_cases()) {
    const std::string fields = case_fields(c, iters);
    out += fmt::format("{}\n    \"{}\": {{\"members\": {}, \"bytes\": {}, {}}}", first_case ? "" : ",", c.name,
                       c.members.size(), total_bytes(c.members), fields);
    first_case = false;
    std::fprintf(stderr, "ferry_bench_h2d: %s done\n", c.name);
  }
  out += "\n  }";
  out += api_floor_json(iters);
  if (env("FERRY_BENCH_VARIANTS") != "0" && !host_demo) { out += variants_json(std::max(1, iters / 2)); }
  out += "\n}\n";
  std::ofstream f{path};
  f << out;
  std::fputs(out.c_str(), stdout);
  return f.good() ? 0 : 1;
}

}  // namespace ferry::bench
