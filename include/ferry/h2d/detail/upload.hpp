// SPDX-License-Identifier: Apache-2.0
// The upload of one validated H2D publication: direct copies, one batch call, or the arena header plus
// (packed) one DMA of the arena prefix and the scatter kernel. Enqueue only: the publisher validated and
// committed the publication before, and owns the failure handling around these calls.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/backend/types.hpp>
#include <ferry/h2d/detail/kernels.hpp>
#include <ferry/h2d/detail/plan.hpp>
#include <ferry/h2d/detail/scatter_params.hpp>
#include <ferry/h2d/detail/storage.hpp>
#include <ferry/h2d/types.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry::h2d::detail {

/// Buffer `m`'s pinned source in slot storage `s` (in its home arena, or in the standalone block).
template <ferry::backend::backend B>
[[nodiscard]] unsigned char* source_ptr(const arena_plan& plan, const slot_storage<B>& s, std::uint32_t m) noexcept
{
  const auto& pl = plan.buffers[m];
  if (pl.home != none) { return s.arenas[pl.home].template as<unsigned char>() + pl.arena_offset; }
  return s.standalone.template as<unsigned char>() + pl.standalone_offset;
}

/// A non-owning view of what an upload reads: the backend, the declarations and plan, the storage and the
/// configuration. Counts are per buffer, in units (a slot's slot_book::counts).
template <ferry::backend::backend B>
struct uploader {
  using stream_view = ferry::backend::stream_view<B>;
  using counts_view = std::span<const std::size_t>;

  B b;
  const declarations& d;
  const arena_plan& plan;
  storage<B>& st;
  const config& cfg;

  [[nodiscard]] std::size_t bytes(std::uint32_t m, counts_view counts) const noexcept
  {
    return counts[m] * d.buffers[m].unit_bytes;
  }

  /// Buffer `m`'s pinned source in slot storage `s`.
  [[nodiscard]] unsigned char* source(std::uint32_t m, const slot_storage<B>& s) const noexcept
  {
    return source_ptr(plan, s, m);
  }

  /// One copy of the first `n` bytes of `m` (one per row for a strided destination); nothing for 0 bytes.
  void copy_direct(std::uint32_t m, const slot_storage<B>& s, std::size_t n, stream_view stream) const
  {
    if (n == 0) { return; }
    const auto& r = d.buffers[m];
    const unsigned char* src = source(m, s);
    if (!r.strided) {
      b.memcpy_async(st.dst[m], src, n, ferry::backend::memcpy_kind::host_to_device, stream.handle());
      return;
    }
    const std::size_t rows = n / r.spec.row_size;
    for (std::size_t i = 0; i < rows; ++i) {
      b.memcpy_async(static_cast<unsigned char*>(st.dst[m]) + i * r.spec.stride, src + i * r.spec.row_size,
                     r.spec.row_size, ferry::backend::memcpy_kind::host_to_device, stream.handle());
    }
  }

  /// Writes arena group `g`'s header in slot storage `s` (CPU stores into pinned memory; no enqueue).
  void header(std::size_t g, slot_storage<B>& s, counts_view counts) const noexcept
  {
    write_header(s.arenas[g].template as<std::int64_t>(), d, plan, g, counts);
  }

  /// packed: one DMA of the arena prefix [0, dma_bytes) then the scatter; zerocopy: the scatter alone,
  /// reading the mapped pinned arena. `eager`: the counts are final (publish, calibration) and travel in the
  /// kernel parameters, so no tile waits for the header; otherwise (capture) the tiles read the header.
  /// `tiles` replaces the group's table (calibration scatters into scratch destinations).
  void scatter(std::size_t g, slot_storage<B>& s, counts_view counts, upload_backend k, std::size_t dma_bytes,
               stream_view stream, bool eager, const tile_desc* tiles = nullptr) const
  {
    const auto& rt = st.groups[g];
    scatter_params p;
    if (k == upload_backend::packed) {
      b.memcpy_async(s.staging[g].data(), s.arenas[g].data(), dma_bytes, ferry::backend::memcpy_kind::host_to_device,
                     stream.handle());
      p.arena = s.staging[g].template as<const unsigned char>();
    } else {
      p.arena = s.arenas[g].template device_as<const unsigned char>();
    }
    p.header = reinterpret_cast<const std::int64_t*>(p.arena);
    p.tiles = tiles != nullptr ? tiles : rt.tile_table->template as<const tile_desc>();
    p.tile_count = rt.tile_count;
    p.tile_bytes = static_cast<std::uint32_t>(cfg.tile_bytes);
    p.spec = static_cast<std::uint32_t>(cfg.speculation >= 0 ? cfg.speculation
                                        : k == upload_backend::packed ? 2
                                                                      : 1);
    const auto& members = plan.groups[g].packed_members;
    p.counts_inline = eager && members.size() <= scatter_params::inline_counts_max ? 1u : 0u;
    if (p.counts_inline != 0) {
      for (std::size_t i = 0; i < members.size(); ++i) {
        p.count[i] = static_cast<std::uint64_t>(bytes(members[i], counts));
      }
    }
    b.launch(scatter_kernel(typename B::tag{}), ferry::backend::launch_config{{rt.grid}, {cfg.threads_per_tile}, 0},
             stream.handle(), p);
  }

  /// Batch: the published ranges of the group's members in one backend call (one cudaMemcpyBatchAsync where
  /// the runtime has it, per-member copies elsewhere: backend::memcpy_batch_h2d_async). `dsts` replaces
  /// the destinations (calibration).
  void batch(std::size_t g, const slot_storage<B>& s, counts_view counts, stream_view stream,
             void* const* dsts = nullptr) const
  {
    auto& rt = st.groups[g];
    rt.batch_dst.clear();
    rt.batch_src.clear();
    rt.batch_size.clear();
    const auto& members = plan.groups[g].packed_members;
    for (std::size_t i = 0; i < members.size(); ++i) {
      const auto m = members[i];
      const std::size_t n = bytes(m, counts);
      if (n == 0) { continue; }
      rt.batch_dst.push_back(dsts != nullptr ? dsts[i] : st.dst[m]);
      rt.batch_src.push_back(source(m, s));
      rt.batch_size.push_back(n);
    }
    b.memcpy_batch_h2d_async(rt.batch_dst.data(), rt.batch_src.data(), rt.batch_size.data(), rt.batch_dst.size(),
                             cfg.device, stream.handle());
  }

  /// The eager upload of group `g` from slot storage `s`: members outside any arena (or the whole group,
  /// for direct and covered groups) one copy each; a single active arena member one plain copy from its
  /// source (no header, no DMA of the arena, no kernel); otherwise the group's backend.
  void publish(std::size_t g, slot_storage<B>& s, counts_view counts, stream_view stream) const
  {
    const auto& gl = plan.groups[g];
    if (gl.arena_bytes == 0) {
      for (auto m : d.groups[g].members) { copy_direct(m, s, bytes(m, counts), stream); }
      return;
    }
    for (auto m : gl.direct_members) { copy_direct(m, s, bytes(m, counts), stream); }
    std::size_t active = 0;
    std::uint32_t last = none;
    for (auto m : gl.packed_members) {
      if (counts[m] != 0) {
        ++active;
        last = m;
      }
    }
    if (active == 0) { return; }
    const upload_backend k = st.groups[g].backend;
    if (active == 1 || k == upload_backend::direct) {
      if (active == 1) {
        copy_direct(last, s, bytes(last, counts), stream);
      } else {
        for (auto m : gl.packed_members) { copy_direct(m, s, bytes(m, counts), stream); }
      }
      return;
    }
    if (k == upload_backend::batch) {
      batch(g, s, counts, stream);
      return;
    }
    header(g, s, counts);
    const std::size_t dma = plan.buffers[last].arena_offset + bytes(last, counts);
    scatter(g, s, counts, k, dma, stream, true);
  }

  /// The captured upload of group `g` with backend `k` (direct, or the group's graph backend): direct
  /// copies of the given counts, or the whole arena's DMA (packed) and the scatter reading the header.
  void capture(std::size_t g, slot_storage<B>& s, counts_view counts, upload_backend k, stream_view stream) const
  {
    if (k == upload_backend::direct) {
      for (auto m : d.groups[g].members) { copy_direct(m, s, bytes(m, counts), stream); }
      return;
    }
    scatter(g, s, counts, k, plan.groups[g].arena_bytes, stream, false);
    for (auto m : plan.groups[g].direct_members) { copy_direct(m, s, bytes(m, counts), stream); }
  }
};

}  // namespace ferry::h2d::detail
