// SPDX-License-Identifier: Apache-2.0
// The storage of H2D publication, allocated once at initialize() and never moved or freed before the
// publisher is destroyed (a DMA or a scatter may still read it, also after a failure):
//   per buffer : the fixed device destination (bound by the caller, or owned here);
//   per slot   : one pinned mapped arena per arena group (producers write their sources into it), its
//                device staging copy (packed), the standalone pinned block (sources homed in no arena),
//                and the completion event that begin() waits for;
//   per group  : the upload backend chosen for it, its device tile table and scatter grid.
#pragma once

#include <ferry/backend/buffer.hpp>
#include <ferry/backend/concepts.hpp>
#include <ferry/backend/event.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/h2d/detail/plan.hpp>
#include <ferry/h2d/types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace ferry::h2d::detail {

/// One runner slot's pinned sources, staging copies and completion event.
template <ferry::backend::backend B>
struct slot_storage {
  std::vector<ferry::backend::mapped_buffer<B>> arenas;   ///< per group (empty when the group has no arena)
  std::vector<ferry::backend::device_buffer<B>> staging;  ///< per group: device copy of the arena (packed)
  ferry::backend::pinned_buffer<B> standalone;            ///< sources of buffers homed in no arena
  std::optional<ferry::backend::event<B>> done;           ///< recorded by finish(), waited for by begin()
};

/// One group's upload choice and fixed scatter table.
template <ferry::backend::backend B>
struct group_runtime {
  upload_backend backend{upload_backend::direct};        ///< publish() with >= 2 active members
  upload_backend graph_backend{upload_backend::direct};  ///< capture_upload()
  std::uint32_t tile_count{0};
  std::uint32_t grid{1};
  std::optional<ferry::backend::device_buffer<B>> tile_table;
  std::vector<double> calibration_us;        ///< automatic: eager medians (direct, batch, packed, zerocopy)
  std::vector<double> calibration_graph_us;  ///< automatic: replayed-graph medians, same order
  // reusable scratch of the batch backend (no allocation per publication)
  std::vector<void*> batch_dst;
  std::vector<const void*> batch_src;
  std::vector<std::size_t> batch_size;
};

/// Copies `bytes` host bytes to device memory now (through a pinned bounce buffer) on `owner`, and waits.
template <ferry::backend::backend B>
void upload_now(B b, void* dst, const void* src, std::size_t bytes, ferry::backend::stream_view<B> owner)
{
  ferry::backend::pinned_buffer<B> tmp{bytes, b};
  std::memcpy(tmp.data(), src, bytes);
  b.memcpy_async(dst, tmp.data(), bytes, ferry::backend::memcpy_kind::host_to_device, owner.handle());
  b.stream_synchronize(owner.handle());
}

/// Everything a queued upload may read, owned for the publisher's lifetime.
template <ferry::backend::backend B>
struct storage {
  std::vector<ferry::backend::device_buffer<B>> owned_dst;  ///< destinations ferry allocated
  std::vector<void*> dst;                                   ///< per buffer: its fixed device destination
  std::vector<slot_storage<B>> slots;
  std::vector<group_runtime<B>> groups;

  /// Every buffer's destination: the bound pointer, or a ferry-allocated one.
  void bind_destinations(B b, const declarations& d)
  {
    dst.clear();
    for (const auto& r : d.buffers) {
      void* p = r.spec.device_ptr;
      if (p == nullptr) {
        owned_dst.emplace_back(arena_align_up(r.cap_bytes), b);
        p = owned_dst.back().data();
      }
      dst.push_back(p);
    }
  }

  /// Per slot: zeroed arenas, zeroed staging copies (speculative scatter loads may read staging bytes past
  /// the DMA'd prefix, never stored), the standalone block and the completion event. Per arena group: the
  /// requested backend until calibration picks one.
  void allocate_slots(B b, const arena_plan& p, std::size_t nslots, upload_backend requested,
                      ferry::backend::stream_view<B> owner)
  {
    groups.resize(p.groups.size());
    for (std::size_t gi = 0; gi < p.groups.size(); ++gi) {
      if (p.groups[gi].arena_bytes == 0) { continue; }
      groups[gi].backend = requested;
      groups[gi].graph_backend = requested;
      const auto n = p.groups[gi].packed_members.size();
      groups[gi].batch_dst.reserve(n);
      groups[gi].batch_src.reserve(n);
      groups[gi].batch_size.reserve(n);
    }
    slots.resize(nslots);
    for (auto& s : slots) {
      s.arenas.resize(p.groups.size());
      s.staging.resize(p.groups.size());
      for (std::size_t gi = 0; gi < p.groups.size(); ++gi) {
        const std::size_t bytes = p.groups[gi].arena_bytes;
        if (bytes == 0) { continue; }
        s.arenas[gi] = ferry::backend::mapped_buffer<B>{bytes, b};
        std::memset(s.arenas[gi].data(), 0, bytes);
        s.staging[gi] = ferry::backend::device_buffer<B>{bytes, b};
        b.memset_async(s.staging[gi].data(), 0, bytes, owner.handle());
      }
      s.standalone = ferry::backend::pinned_buffer<B>{p.standalone_bytes, b};
      s.done.emplace(b, ferry::backend::event_flags::disable_timing);
    }
  }

  /// The fixed device tile table and scatter grid of every arena group (from capacities and destinations).
  void build_tables(B b, const declarations& d, const arena_plan& p, const config& cfg, int sm_count,
                    ferry::backend::stream_view<B> owner)
  {
    for (std::size_t gi = 0; gi < p.groups.size(); ++gi) {
      if (p.groups[gi].arena_bytes == 0) { continue; }
      auto& g = groups[gi];
      std::vector<std::uint64_t> dsts;
      for (auto m : p.groups[gi].packed_members) { dsts.push_back(reinterpret_cast<std::uintptr_t>(dst[m])); }
      const auto tiles = make_tiles(d, p, gi, dsts, cfg.tile_bytes);
      g.tile_count = static_cast<std::uint32_t>(tiles.size());
      g.grid = scatter_grid(tiles.size(), sm_count, cfg.threads_per_tile);
      g.tile_table.emplace(tiles.size() * sizeof(tile_desc), b);
      upload_now(b, g.tile_table->data(), tiles.data(), tiles.size() * sizeof(tile_desc), owner);
    }
  }
};

}  // namespace ferry::h2d::detail
