// SPDX-License-Identifier: Apache-2.0
// Calibration of the `automatic` upload backend: at initialize(), per arena group, time every candidate
// and keep the fastest (eager for publish(), replayed graph for capture_upload()).
#pragma once

#include <ferry/backend/buffer.hpp>
#include <ferry/backend/concepts.hpp>
#include <ferry/backend/event.hpp>
#include <ferry/backend/graph.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/h2d/detail/slots.hpp>
#include <ferry/h2d/detail/upload.hpp>
#include <ferry/h2d/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ferry::h2d::detail {

/// Median of `v` (reorders it); -1 when empty.
[[nodiscard]] inline double median_us(std::vector<double>& v)
{
  if (v.empty()) { return -1.0; }
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// The candidate order of group_info::calibration_us.
inline constexpr upload_backend calibration_candidates[4] = {upload_backend::direct, upload_backend::batch,
                                                             upload_backend::packed, upload_backend::zerocopy};

/// The fastest candidate of medians `v` (< 0: not run); a zero-copy candidate within 3% of the fastest wins
/// the near-tie: one operation, the least CPU enqueue time, and no copy engine.
[[nodiscard]] inline upload_backend pick_fastest(const std::vector<double>& v)
{
  constexpr int nc = 4;
  int best = -1;
  for (int c = 0; c < nc; ++c) {
    if (v[static_cast<std::size_t>(c)] < 0) { continue; }
    if (best < 0 || v[static_cast<std::size_t>(c)] < v[static_cast<std::size_t>(best)]) { best = c; }
  }
  constexpr std::size_t zc = 3;
  if (v[zc] >= 0 && v[zc] <= v[static_cast<std::size_t>(best)] * 1.03) { best = static_cast<int>(zc); }
  return calibration_candidates[best];
}

/// `automatic`: per arena group, time each candidate (full counts, scratch destinations so bound storage is
/// never written) and keep the fastest; the graph choice is the fastest capturable one. Candidates are timed
/// round-robin (one span of each per round), so that clock or load drift during calibration hits them
/// alike; round r uses runner slot r % slots (each slot has its own pinned arena and sources, whose upload
/// times can differ), so every candidate's median covers every slot alike. Leaves every slot's counts at 0
/// and its arena headers zeroed, as initialize() found them.
template <ferry::backend::backend B>
void calibrate(const uploader<B>& up, slot_table& slots, ferry::backend::stream_view<B> owner, int iterations)
{
  using ferry::backend::event_flags;
  B b = up.b;
  auto& st = up.st;
  const std::size_t nslots = slots.size();
  for (std::size_t gi = 0; gi < up.plan.groups.size(); ++gi) {
    const auto& gl = up.plan.groups[gi];
    auto& g = st.groups[gi];
    if (gl.arena_bytes == 0) { continue; }
    ferry::backend::device_buffer<B> scratch{gl.arena_bytes, b};
    std::vector<std::uint64_t> dsts;
    std::vector<void*> dptr;
    for (auto m : gl.packed_members) {
      auto* p = scratch.template as<unsigned char>() + up.plan.buffers[m].arena_offset;
      dsts.push_back(reinterpret_cast<std::uintptr_t>(p));
      dptr.push_back(p);
      for (std::size_t si = 0; si < nslots; ++si) { slots[si].counts[m] = up.d.buffers[m].spec.capacity; }
    }
    const auto tiles = make_tiles(up.d, up.plan, gi, dsts, up.cfg.tile_bytes);
    ferry::backend::device_buffer<B> table{tiles.size() * sizeof(tile_desc), b};
    upload_now(b, table.data(), tiles.data(), tiles.size() * sizeof(tile_desc), owner);
    const auto* tt = table.template as<const tile_desc>();
    for (std::size_t si = 0; si < nslots; ++si) { up.header(gi, st.slots[si], slots[si].counts); }
    ferry::backend::event<B> t0{b, event_flags::timing};
    ferry::backend::event<B> t1{b, event_flags::timing};
    constexpr int nc = 4;
    auto enqueue = [&](upload_backend k, bool eager, std::size_t si) {
      auto& s = st.slots[si];
      const auto& counts = slots[si].counts;
      if (k == upload_backend::direct) {
        for (std::size_t i = 0; i < gl.packed_members.size(); ++i) {
          const auto m = gl.packed_members[i];
          b.memcpy_async(dptr[i], up.source(m, s), up.d.buffers[m].cap_bytes,
                         ferry::backend::memcpy_kind::host_to_device, owner.handle());
        }
      } else if (k == upload_backend::batch) {
        up.batch(gi, s, counts, owner, dptr.data());
      } else {
        up.scatter(gi, s, counts, k, gl.arena_bytes, owner, eager, tt);
      }
    };
    auto span = [&](auto&& body) {
      t0.record(owner);
      body();
      t1.record(owner);
      t1.synchronize();
      return static_cast<double>(t1.elapsed_ms_since(t0)) * 1000.0;
    };
    bool eager_ok[nc]{};
    bool graph_ok[nc]{};
    std::vector<ferry::backend::graph_exec<B>> graphs;  // candidate c, slot si: graphs[graph_index[c] + si]
    int graph_index[nc]{-1, -1, -1, -1};
    for (int c = 0; c < nc; ++c) {
      const auto k = calibration_candidates[c];
      eager_ok[c] = k != upload_backend::batch || B::batch_native();
      graph_ok[c] = k != upload_backend::batch;
      if (graph_ok[c]) {
        graph_index[c] = static_cast<int>(graphs.size());
        for (std::size_t si = 0; si < nslots; ++si) {
          graphs.push_back(ferry::backend::graph_exec<B>::capture(owner, [&](ferry::backend::stream_view<B>) {
            enqueue(k, false, si);
          }));
        }
      }
    }
    // Median of `iters` rounds after 3 warm-up rounds: eager (enqueue included, as publish() runs) and as a
    // replayed graph, each with full counts.
    const int iters = std::max(3, iterations);
    std::vector<double> eager_us[nc];
    std::vector<double> graph_us[nc];
    const int rounds = static_cast<int>(((static_cast<std::size_t>(iters) + nslots - 1) / nslots) * nslots);
    for (int it = 0; it < rounds + 3; ++it) {
      const std::size_t si = static_cast<std::size_t>(it) % nslots;
      for (int c = 0; c < nc; ++c) {
        if (eager_ok[c]) {
          const double v = span([&] { enqueue(calibration_candidates[c], true, si); });
          if (it >= 3) { eager_us[c].push_back(v); }
        }
        if (graph_ok[c]) {
          const double v = span([&] { graphs[static_cast<std::size_t>(graph_index[c]) + si].launch(owner); });
          if (it >= 3) { graph_us[c].push_back(v); }
        }
      }
    }
    g.calibration_us.assign(nc, -1.0);
    g.calibration_graph_us.assign(nc, -1.0);
    for (int c = 0; c < nc; ++c) {
      g.calibration_us[static_cast<std::size_t>(c)] = median_us(eager_us[c]);
      g.calibration_graph_us[static_cast<std::size_t>(c)] = median_us(graph_us[c]);
    }
    g.backend = pick_fastest(g.calibration_us);
    g.graph_backend = pick_fastest(g.calibration_graph_us);
    graphs.clear();
    b.stream_synchronize(owner.handle());
    for (std::size_t si = 0; si < nslots; ++si) {
      for (auto m : gl.packed_members) { slots[si].counts[m] = 0; }
      std::memset(st.slots[si].arenas[gi].data(), 0, gl.header_bytes);
    }
  }
}

}  // namespace ferry::h2d::detail
