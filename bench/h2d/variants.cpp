// SPDX-License-Identifier: Apache-2.0
// The scatter knob grid of the JSON summary ("variants"; CUDA only, FERRY_BENCH_VARIANTS=0 leaves it out):
// decode256 and small64, graph and eager, at half the summary's iterations.
#include "common.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <string_view>

namespace ferry::bench {

/// Tile bytes x threads per tile, packed and zerocopy (graph: speculation 1 and 2 for zerocopy), plus
/// speculation 0 at the default tile.
std::string variants_json(int iters)
{
  struct row {
    std::string backend;
    std::size_t tile;
    std::uint32_t threads;
    int spec;
    bool graph;
    double us;
  };
  std::string out = ",\n  \"variants\": {";
  bool first_case = true;
  for (auto& c : anchor_cases()) {
    if (std::string_view{c.name} != "decode256" && std::string_view{c.name} != "small64") { continue; }
    std::vector<row> rows;
    auto run = [&](fh::upload_backend k, std::size_t tile, std::uint32_t th, int spec, bool graph) {
      runner r{c.members, variant::upload, k, graph, knobs{tile, th, spec}};
      rows.push_back({std::string{fh::to_string(k)}, tile, th, spec, graph, r.measure(iters).gpu_us});
    };
    for (std::size_t tile : {1024, 2048, 4096, 8192, 16384, 32768}) {
      for (std::uint32_t th : {64u, 128u, 256u}) {
        run(fh::upload_backend::packed, tile, th, -1, true);
        run(fh::upload_backend::zerocopy, tile, th, 1, true);
        run(fh::upload_backend::zerocopy, tile, th, 2, true);
        run(fh::upload_backend::packed, tile, th, -1, false);
        run(fh::upload_backend::zerocopy, tile, th, -1, false);
      }
    }
    run(fh::upload_backend::packed, 4096, 128, 0, true);
    run(fh::upload_backend::zerocopy, 4096, 128, 0, true);
    std::fprintf(stderr, "\nvariants %s (us, median of %d): tile threads | graph: packed zc(spec1) zc(spec2) | eager: packed zc\n",
                 c.name, iters);
    for (std::size_t i = 0; i + 5 <= rows.size() - 2; i += 5) {
      std::fprintf(stderr, "  %5zu %4u | %7.2f %7.2f %7.2f | %7.2f %7.2f\n", rows[i].tile, rows[i].threads, rows[i].us,
                   rows[i + 1].us, rows[i + 2].us, rows[i + 3].us, rows[i + 4].us);
    }
    std::fprintf(stderr, "  spec0 at 4096/128 graph: packed %.2f zc %.2f\n", rows[rows.size() - 2].us, rows.back().us);
    out += fmt::format("{}\n    \"{}\": [", first_case ? "" : ",", c.name);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      out += fmt::format("{}\n      {{\"backend\": \"{}\", \"tile_bytes\": {}, \"threads\": {}, \"speculation\": {}, "
                         "\"graph\": {}, \"us\": {}}}",
                         i == 0 ? "" : ",", r.backend, r.tile, r.threads, r.spec, r.graph ? "true" : "false", json_num(r.us));
    }
    out += "\n    ]";
    first_case = false;
  }
  out += "\n  }";
  return out;
}

}  // namespace ferry::bench
