// SPDX-License-Identifier: Apache-2.0
// Pure arena planning of H2D publication: the declared buffers and groups in, the layout out (which group
// owns an arena, each member's offset in it, the header size, the standalone sources, the tile table).
// No backend and no allocation: every function here is a plain function of its arguments (unit-tested in
// tests/h2d/plan_test.cpp).
#pragma once

#include <ferry/detail/align.hpp>
#include <ferry/detail/launch_rules.hpp>
#include <ferry/error.hpp>
#include <ferry/h2d/detail/scatter_params.hpp>  // tile_desc
#include <ferry/h2d/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::h2d::detail {

/// "No index" (no home arena, no open producer).
inline constexpr std::uint32_t none = 0xFFFFFFFFu;
/// Every arena offset, payload and standalone source is aligned to this.
inline constexpr std::size_t arena_align = 16;
/// The largest buffer (capacity x unit bytes, or x stride) a declaration may ask for.
inline constexpr std::size_t max_buffer_bytes = std::size_t{1} << 48;
/// `n` rounded up to arena_align (ferry::detail::align_up, the one rounding rule).
[[nodiscard]] constexpr std::size_t arena_align_up(std::size_t n) noexcept
{
  return static_cast<std::size_t>(ferry::detail::align_up(n, arena_align));
}

/// One declared buffer, normalized: row_size defaulted to the element size for rows, a stride equal to
/// the row size cleared (contiguous).
struct buffer_decl {
  buffer_spec spec;
  std::size_t unit_bytes{1};          ///< bytes of one counted unit
  std::size_t cap_bytes{0};           ///< capacity * unit_bytes
  bool strided{false};                ///< rows `stride` bytes apart in the bound destination
  std::vector<std::uint32_t> groups;  ///< group indices, in declaration order
};

/// One group: the buffers published together before one first GPU consumer.
struct group_decl {
  std::string name;
  std::vector<std::uint32_t> members;  ///< buffer indices, in declaration order
};

/// The buffers and groups as declared.
struct declarations {
  std::vector<buffer_decl> buffers;
  std::vector<group_decl> groups;

  /// Validates and normalizes `spec`, creates the groups it names, and returns its handle.
  buffer_handle declare(buffer_spec spec)
  {
    FERRY_EXPECTS(!spec.name.empty(), logic_error, "h2d: a buffer needs a name");
    for (const auto& b : buffers) {
      FERRY_EXPECTS(b.spec.name != spec.name, logic_error, "h2d buffer '{}': declared twice", spec.name);
    }
    FERRY_EXPECTS(!spec.groups.empty(), logic_error, "h2d buffer '{}': expected at least one group, got none",
                  spec.name);
    FERRY_EXPECTS(spec.capacity > 0, logic_error, "h2d buffer '{}': expected a capacity > 0, got 0", spec.name);
    if (spec.unit == count_unit::rows && spec.row_size == 0) { spec.row_size = spec.element_size; }
    FERRY_EXPECTS(spec.element_size > 0, logic_error, "h2d buffer '{}': element size must be > 0", spec.name);
    FERRY_EXPECTS(spec.unit != count_unit::rows || spec.row_size % spec.element_size == 0, logic_error,
                  "h2d buffer '{}': row size {} is not a multiple of the element size {}", spec.name, spec.row_size,
                  spec.element_size);
    if (spec.stride == spec.row_size) { spec.stride = 0; }
    if (spec.stride != 0) {
      FERRY_EXPECTS(spec.unit == count_unit::rows && spec.device_ptr != nullptr, logic_error,
                    "h2d buffer '{}': a stride needs unit rows and a bound device pointer", spec.name);
      FERRY_EXPECTS(spec.stride > spec.row_size, logic_error,
                    "h2d buffer '{}': stride {} is smaller than the row size {}", spec.name, spec.stride,
                    spec.row_size);
    }
    for (std::size_t i = 0; i < spec.groups.size(); ++i) {  // before any group is created: all-or-nothing
      FERRY_EXPECTS(std::find(spec.groups.begin(), spec.groups.begin() + static_cast<std::ptrdiff_t>(i),
                              spec.groups[i]) == spec.groups.begin() + static_cast<std::ptrdiff_t>(i),
                    logic_error, "h2d buffer '{}': group '{}' listed twice", spec.name, spec.groups[i]);
    }
    buffer_decl r;
    r.unit_bytes = spec.unit == count_unit::rows       ? spec.row_size
                   : spec.unit == count_unit::elements ? spec.element_size
                                                       : 1;
    // Every size below is checked before it is computed: a capacity whose bytes do not fit would wrap to a
    // small size and the publication would write past the allocation (2^48 bytes: far above any allocation,
    // so the arena sums of up to 2^16 buffers cannot wrap either).
    FERRY_EXPECTS(spec.capacity <= max_buffer_bytes / r.unit_bytes, logic_error,
                  "h2d buffer '{}': expected capacity x {} bytes per unit of at most 2^48 bytes, got capacity {}",
                  spec.name, r.unit_bytes, spec.capacity);
    FERRY_EXPECTS(spec.stride == 0 || spec.capacity <= max_buffer_bytes / spec.stride, logic_error,
                  "h2d buffer '{}': expected capacity x stride {} of at most 2^48 bytes, got capacity {}", spec.name,
                  spec.stride, spec.capacity);
    r.cap_bytes = spec.capacity * r.unit_bytes;
    r.strided = spec.stride != 0;
    const auto self = static_cast<std::uint32_t>(buffers.size());
    for (const auto& gname : spec.groups) {
      auto it = std::find_if(groups.begin(), groups.end(), [&](const group_decl& g) { return g.name == gname; });
      if (it == groups.end()) {
        groups.emplace_back();
        groups.back().name = gname;
        it = groups.end() - 1;
      }
      it->members.push_back(self);
      r.groups.push_back(static_cast<std::uint32_t>(it - groups.begin()));
    }
    r.spec = std::move(spec);
    buffers.push_back(std::move(r));
    return buffer_handle{self};
  }

  [[nodiscard]] group_handle group_of(std::string_view name) const
  {
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (groups[i].name == name) { return group_handle{static_cast<std::uint32_t>(i)}; }
    }
    FERRY_FAIL(logic_error, "h2d: unknown group '{}'", name);
  }
  [[nodiscard]] const group_decl& group(group_handle g) const
  {
    FERRY_EXPECTS(g.value < groups.size(), logic_error, "h2d: invalid group handle {}", g.value);
    return groups[g.value];
  }
  [[nodiscard]] const buffer_decl& buffer(buffer_handle b) const
  {
    FERRY_EXPECTS(b.value < buffers.size(), logic_error, "h2d: invalid buffer handle {}", b.value);
    return buffers[b.value];
  }
};

/// Where one buffer's pinned source lives in every slot.
struct placement {
  std::uint32_t home{none};          ///< group whose arena holds the source; none: the standalone block
  std::size_t arena_offset{0};       ///< payload offset inside the home arena
  std::size_t standalone_offset{0};  ///< offset inside the standalone block (home == none)
};

/// One group's arena (arena_bytes == 0: the group has none and uses direct copies).
struct group_layout {
  std::vector<std::uint32_t> packed_members;  ///< in arena order (header index)
  std::vector<std::uint32_t> direct_members;  ///< strided members of an arena group (one copy per row)
  bool covered{false};                        ///< every contiguous member lives in one other arena
  std::size_t header_bytes{0};                ///< 16 bytes per packed member, aligned
  std::size_t arena_bytes{0};                 ///< header + aligned payload capacities
};

/// The arena layout of every slot (the same in each).
struct arena_plan {
  std::vector<placement> buffers;
  std::vector<group_layout> groups;
  std::size_t standalone_bytes{arena_align};
};

/// Groups by size (largest first): a group with >= 2 contiguous members whose members are homed nowhere
/// else gets an arena (only when `packing`); one whose contiguous members all live in one arena group is
/// covered and keeps checked direct copies (no duplicate arena); one that shares members without being
/// covered also uses direct copies. Buffers homed in no arena get standalone sources.
[[nodiscard]] inline arena_plan plan_arenas(const declarations& d, bool packing)
{
  arena_plan p;
  p.buffers.resize(d.buffers.size());
  p.groups.resize(d.groups.size());
  std::vector<std::size_t> order(d.groups.size());
  for (std::size_t i = 0; i < order.size(); ++i) { order[i] = i; }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return d.groups[a].members.size() > d.groups[b].members.size();
  });
  for (auto gi : order) {
    auto& g = p.groups[gi];
    std::vector<std::uint32_t> contiguous;
    for (auto m : d.groups[gi].members) {
      if (!d.buffers[m].strided) { contiguous.push_back(m); }
    }
    std::uint32_t home = none;
    bool any_homed = false;
    bool same_home = true;
    for (auto m : contiguous) {
      if (p.buffers[m].home != none) {
        if (home == none) { home = p.buffers[m].home; }
        same_home = same_home && p.buffers[m].home == home;
        any_homed = true;
      } else {
        same_home = false;
      }
    }
    if (any_homed) {
      g.covered = same_home && !contiguous.empty();
      continue;
    }
    if (!packing || contiguous.size() < 2) { continue; }
    g.packed_members = contiguous;
    for (auto m : d.groups[gi].members) {
      if (d.buffers[m].strided) { g.direct_members.push_back(m); }
    }
    g.header_bytes = arena_align_up(16 * contiguous.size());
    std::size_t off = g.header_bytes;
    for (auto m : contiguous) {
      p.buffers[m].home = static_cast<std::uint32_t>(gi);
      p.buffers[m].arena_offset = off;
      off += arena_align_up(d.buffers[m].cap_bytes);
    }
    g.arena_bytes = off;
  }
  std::size_t off = 0;
  for (std::size_t m = 0; m < d.buffers.size(); ++m) {
    if (p.buffers[m].home == none) {
      p.buffers[m].standalone_offset = off;
      off += arena_align_up(d.buffers[m].cap_bytes);
    }
  }
  p.standalone_bytes = std::max<std::size_t>(off, arena_align);
  return p;
}

/// The tile table of arena group `g` for destinations `dsts` (one per packed member): every member's
/// capacity cut into `tile_bytes` tiles, interleaved round-robin across members (tile 0 of every member
/// first) so that a grid smaller than the table still spreads a large member over many blocks.
[[nodiscard]] inline std::vector<tile_desc> make_tiles(const declarations& d, const arena_plan& p, std::size_t g,
                                                       std::span<const std::uint64_t> dsts, std::size_t tile_bytes)
{
  std::vector<tile_desc> tiles;
  const auto& members = p.groups[g].packed_members;
  for (std::uint32_t i = 0; i < members.size(); ++i) {
    const auto cap = d.buffers[members[i]].cap_bytes;
    for (std::size_t start = 0; start < cap; start += tile_bytes) {
      tile_desc t{};
      t.dst = dsts[i] + start;
      t.src = p.buffers[members[i]].arena_offset + start;
      t.start = start;
      t.member = i;
      t.len = static_cast<std::uint32_t>(std::min(tile_bytes, cap - start));
      tiles.push_back(t);
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const tile_desc& a, const tile_desc& b) { return a.start < b.start; });
  return tiles;
}

/// Scatter grid: every tile in one wave (launch_rules::one_wave_blocks: as many resident blocks as the SMs
/// hold), grid-stride beyond.
[[nodiscard]] constexpr std::uint32_t scatter_grid(std::size_t tiles, int sm_count,
                                                   std::uint32_t threads_per_tile) noexcept
{
  return static_cast<std::uint32_t>(
    std::min<std::uint64_t>(tiles, ferry::detail::launch_rules::one_wave_blocks(sm_count, threads_per_tile)));
}

/// Writes arena group `g`'s header at `h`: per packed member {arena offset, published bytes}, the bytes
/// from `counts` (per buffer, in units).
inline void write_header(std::int64_t* h, const declarations& d, const arena_plan& p, std::size_t g,
                         std::span<const std::size_t> counts) noexcept
{
  const auto& members = p.groups[g].packed_members;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto m = members[i];
    h[2 * i] = static_cast<std::int64_t>(p.buffers[m].arena_offset);
    h[2 * i + 1] = static_cast<std::int64_t>(counts[m] * d.buffers[m].unit_bytes);
  }
}

/// Rejects overlapping destination ranges (bound storage; strided extents included) and source ranges
/// (arena or standalone placement), naming both buffers.
inline void check_overlaps(const declarations& d, const arena_plan& p, std::span<void* const> dst)
{
  struct range {
    std::uintptr_t lo, hi;
    std::uint32_t buf;
  };
  auto check = [&](std::vector<range> v, std::string_view what) {
    std::sort(v.begin(), v.end(), [](const range& a, const range& b) { return a.lo < b.lo; });
    for (std::size_t i = 1; i < v.size(); ++i) {
      FERRY_EXPECTS(v[i].lo >= v[i - 1].hi, logic_error,
                    "h2d: {} range of buffer '{}' [{:#x}, {:#x}) overlaps buffer '{}' [{:#x}, {:#x})", what,
                    d.buffers[v[i].buf].spec.name, v[i].lo, v[i].hi, d.buffers[v[i - 1].buf].spec.name, v[i - 1].lo,
                    v[i - 1].hi);
    }
  };
  std::vector<range> dsts;
  std::vector<range> srcs;
  for (std::uint32_t i = 0; i < d.buffers.size(); ++i) {
    const auto& r = d.buffers[i];
    const auto lo = reinterpret_cast<std::uintptr_t>(dst[i]);
    const std::size_t extent = r.strided ? (r.spec.capacity - 1) * r.spec.stride + r.spec.row_size : r.cap_bytes;
    dsts.push_back({lo, lo + extent, i});
    const auto& pl = p.buffers[i];
    const std::uintptr_t s0 = pl.home != none ? (static_cast<std::uintptr_t>(pl.home) << 48) + pl.arena_offset
                                              : (std::uintptr_t{0xFFFF} << 48) + pl.standalone_offset;
    srcs.push_back({s0, s0 + r.cap_bytes, i});
  }
  check(std::move(dsts), "destination");
  check(std::move(srcs), "source");
}

}  // namespace ferry::h2d::detail
