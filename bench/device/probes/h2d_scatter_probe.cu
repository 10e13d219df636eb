// SPDX-License-Identifier: Apache-2.0
// Exploratory probe (not a ferry benchmark): where ferry's zero-copy scatter spends its time in a graph,
// against a plain zero-copy copy of the same bytes. Uses ferry's own scatter body (kernels/h2d/
// scatter/scatter.cuh) on the anchor cases' layouts. Each cell: GPU span from an event before the graph launch
// to an event after it, median of 400 replays after 20 warm-ups; the destinations are checked.
//   floor       : [consumer]
//   plain8      : [8-block copy of the arena's payload bytes, contiguous, no tiles -> consumer]
//   dev_s1/s2   : ferry's scatter, tile table in device memory, counts from the mapped header, spec 1 / 2
//   dev_ci      : tile table in device memory, counts in the kernel parameters (no header read)
//   par_s2      : tile table in the kernel parameters, counts from the header, spec 2
//   par_ci      : tile table and counts in the kernel parameters
//   small_s1    : dev_s1 with a 40-byte parameter block (no inline count array)
//   computed    : uniform layouts only: the tile descriptor computed from blockIdx (no table load)
//   plain_grid  : plain8's contiguous copy launched with ferry's grid (one 128-thread block per tile)
//   warp_tile   : ferry's scatter with one warp per tile (4 tiles per block), spec 1
//   computed_ci : computed descriptor and counts in the parameters: no dependent load at all
//   lean        : dev_s1's inputs with a minimal copy loop (no misaligned path, no partial stores)
// Run: bash bench/device/drivers/run_all.sh probe=h2d_scatter_probe (built as probe_common.cuh says).
#include "h2d/scatter/scatter.cuh"
#include "probe_common.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using ferry::h2d::detail::scatter_params;
using ferry::h2d::detail::tile_desc;

constexpr int max_tiles = 64;
struct inline_tiles {
  scatter_params p;
  tile_desc t[max_tiles];
};

__global__ void scatter_dev(scatter_params p) { ferry::kernels::h2d::scatter_share(p, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x); }

/// The graph path's fields only (no inline counts): is a 560-byte parameter block slower to launch?
struct small_params {
  const std::int64_t* header;
  const unsigned char* arena;
  const tile_desc* tiles;
  std::uint32_t tile_count;
  std::uint32_t spec;
};
__global__ void scatter_small(small_params a)
{
  for (std::uint32_t t = blockIdx.x; t < a.tile_count; t += gridDim.x) {
    const tile_desc td = a.tiles[t];
    scatter_params p;
    p.arena = a.arena;
    const std::int64_t* word = a.header + 2 * td.member + 1;
    ferry::kernels::h2d::scatter_tile(p, td, [word] { return *word; }, a.spec >= 2 || td.start == 0, threadIdx.x,
                                      blockDim.x);
  }
}

/// Uniform layouts only (every member one tile of `bytes`): the tile descriptor computed from blockIdx, no
/// table load at all. Bounds what the dependent tile-table load costs.
__global__ void scatter_computed(scatter_params p, std::uint64_t dst_base, std::uint32_t bytes, std::uint32_t dst_stride,
                                 std::uint32_t n)
{
  for (std::uint32_t t = blockIdx.x; t < p.tile_count; t += gridDim.x) {
    tile_desc td{};
    td.member = t;
    td.start = 0;
    td.len = bytes;
    td.src = 16ull * n + static_cast<std::uint64_t>(t) * ((bytes + 15) / 16 * 16);
    td.dst = dst_base + static_cast<std::uint64_t>(t) * dst_stride;
    if (p.counts_inline != 0) {
      const auto count = static_cast<std::int64_t>(p.count[td.member]);
      ferry::kernels::h2d::scatter_tile(p, td, [count] { return count; }, true, threadIdx.x, blockDim.x);
      continue;
    }
    const std::int64_t* word = p.header + 2 * td.member + 1;
    ferry::kernels::h2d::scatter_tile(p, td, [word] { return *word; }, true, threadIdx.x, blockDim.x);
  }
}

/// One warp per tile (4 tiles per 128-thread block): is ferry's one-block-per-tile grid the cost for many
/// small members?
__global__ void scatter_warp(scatter_params p)
{
  const std::uint32_t warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (std::uint32_t t = blockIdx.x * warps + threadIdx.x / 32; t < p.tile_count; t += gridDim.x * warps) {
    const tile_desc td = p.tiles[t];
    const std::int64_t* word = p.header + 2 * td.member + 1;
    ferry::kernels::h2d::scatter_tile(p, td, [word] { return *word; }, p.spec >= 2 || td.start == 0, lane, 32);
  }
}

/// dev_s1's inputs (tile table, count from the header, speculative first tiles) with a minimal copy loop: no
/// misaligned path, no partial-vector stores (the probe's counts are multiples of 16), nothing else compiled
/// in. Is the scatter's code size (instruction fetch on each SM) what the remaining gap is?
__global__ void scatter_lean(scatter_params p)
{
  for (std::uint32_t t = blockIdx.x; t < p.tile_count; t += gridDim.x) {
    const tile_desc td = p.tiles[t];
    const auto* src = reinterpret_cast<const uint4*>(p.arena + td.src);
    auto* dst = reinterpret_cast<uint4*>(static_cast<std::uintptr_t>(td.dst));
    const std::uint32_t vecs = (td.len + 15u) / 16u;
    const std::int64_t* word = p.header + 2 * td.member + 1;
    for (std::uint32_t base = threadIdx.x; base < vecs; base += blockDim.x * 8) {
      uint4 r[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const std::uint32_t i = base + u * blockDim.x;
        if (i < vecs) { r[u] = src[i]; }
      }
      const std::int64_t c = *word - static_cast<std::int64_t>(td.start);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const std::uint32_t i = base + u * blockDim.x;
        if (i < vecs && static_cast<std::int64_t>(i) * 16 + 16 <= c) { dst[i] = r[u]; }
      }
    }
  }
}

__global__ void scatter_par(const __grid_constant__ inline_tiles a)
{
  const scatter_params& p = a.p;
  for (std::uint32_t t = blockIdx.x; t < p.tile_count; t += gridDim.x) {
    const tile_desc& td = a.t[t];
    if (p.counts_inline != 0) {
      const auto count = static_cast<std::int64_t>(p.count[td.member]);
      if (count <= 0 || static_cast<std::uint64_t>(count) <= td.start) { continue; }
      ferry::kernels::h2d::scatter_tile(p, td, [count] { return count; }, true, threadIdx.x, blockDim.x);
      continue;
    }
    const std::int64_t* word = p.header + 2 * td.member + 1;
    ferry::kernels::h2d::scatter_tile(p, td, [word] { return *word; },
                                      p.spec >= 2 || td.start == 0, threadIdx.x, blockDim.x);
  }
}

void run_case(const char* name, const std::vector<size_t>& sizes, cudaStream_t s, int sms)
{
  constexpr size_t tile_bytes = 8192;
  constexpr unsigned threads = 128;
  const size_t n = sizes.size();
  // arena: header (n x {offset, count}) then payloads, 16-byte aligned; destinations 256-byte aligned
  std::vector<size_t> aoff(n), doff(n);
  size_t a = 16 * n, d = 0;
  for (size_t i = 0; i < n; ++i) {
    aoff[i] = a;
    a += (sizes[i] + 15) / 16 * 16;
    doff[i] = d;
    d += (sizes[i] + 255) / 256 * 256;
  }
  const size_t arena_bytes = a, dst_bytes = d;
  void* h;
  CK(cudaHostAlloc(&h, arena_bytes, cudaHostAllocMapped));
  void* hd;
  CK(cudaHostGetDevicePointer(&hd, h, 0));
  std::mt19937_64 rng{7};
  for (size_t i = 0; i < arena_bytes; ++i) { static_cast<unsigned char*>(h)[i] = static_cast<unsigned char>(rng() | 1); }
  auto* hdr = static_cast<std::int64_t*>(h);
  for (size_t i = 0; i < n; ++i) {
    hdr[2 * i] = static_cast<std::int64_t>(aoff[i]);
    hdr[2 * i + 1] = static_cast<std::int64_t>(sizes[i]);
  }
  unsigned char* dst;
  CK(cudaMalloc(&dst, dst_bytes));
  unsigned long long* out;
  CK(cudaMalloc(&out, 64));
  std::vector<tile_desc> tiles;
  for (std::uint32_t i = 0; i < n; ++i) {
    for (size_t st = 0; st < sizes[i]; st += tile_bytes) {
      tile_desc t{};
      t.dst = reinterpret_cast<std::uintptr_t>(dst) + doff[i] + st;
      t.src = aoff[i] + st;
      t.start = st;
      t.member = i;
      t.len = static_cast<std::uint32_t>(std::min(tile_bytes, sizes[i] - st));
      tiles.push_back(t);
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const tile_desc& x, const tile_desc& y) { return x.start < y.start; });
  tile_desc* dtiles;
  CK(cudaMalloc(&dtiles, tiles.size() * sizeof(tile_desc)));
  CK(cudaMemcpy(dtiles, tiles.data(), tiles.size() * sizeof(tile_desc), cudaMemcpyHostToDevice));
  const unsigned grid = static_cast<unsigned>(std::min<size_t>(tiles.size(), static_cast<size_t>(sms) * (2048 / threads)));
  auto params = [&](int spec, bool ci) {
    scatter_params p{};
    p.header = static_cast<const std::int64_t*>(hd);
    p.arena = static_cast<const unsigned char*>(hd);
    p.tiles = dtiles;
    p.tile_count = static_cast<std::uint32_t>(tiles.size());
    p.tile_bytes = tile_bytes;
    p.spec = static_cast<std::uint32_t>(spec);
    p.counts_inline = ci ? 1u : 0u;
    if (ci) {
      for (size_t i = 0; i < n; ++i) { p.count[i] = sizes[i]; }
    }
    return p;
  };
  const size_t c16 = dst_bytes / 16;
  const unsigned cblocks = static_cast<unsigned>(std::max<size_t>(1, dst_bytes / 4096));
  auto consumer = [&](cudaStream_t st) { consume<<<cblocks, 256, 0, st>>>(reinterpret_cast<const uint4*>(dst), c16, out); };
  auto check = [&](const char* what) {
    std::vector<unsigned char> back(dst_bytes);
    CK(cudaMemcpy(back.data(), dst, dst_bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) {
      if (std::memcmp(back.data() + doff[i], static_cast<unsigned char*>(h) + aoff[i], sizes[i]) != 0) {
        std::printf("  %s: member %zu WRONG\n", what, i);
        return;
      }
    }
  };
  // One cell: clear the destinations, time [launch(stream) -> consumer] in a graph, check every member.
  auto cell = [&](const char* what, auto&& launch) {
    CK(cudaMemset(dst, 0, dst_bytes));
    const float us = time_graph(s, [&](cudaStream_t st) {
      launch(st);
      consumer(st);
    });
    check(what);
    return us;
  };
  auto dev = [&](int spec, bool ci, const char* what) {
    const scatter_params p = params(spec, ci);
    return cell(what, [&](cudaStream_t st) { scatter_dev<<<grid, threads, 0, st>>>(p); });
  };
  auto par = [&](int spec, bool ci, const char* what) {
    if (tiles.size() > max_tiles) { return -1.f; }
    inline_tiles it{};
    it.p = params(spec, ci);
    std::copy(tiles.begin(), tiles.end(), it.t);
    return cell(what, [&](cudaStream_t st) { scatter_par<<<grid, threads, 0, st>>>(it); });
  };
  const size_t pay16 = std::min((arena_bytes - 16 * n) / 16, c16);
  const auto* payload = reinterpret_cast<const uint4*>(static_cast<char*>(hd) + 16 * n);
  auto plain_copy = [&](unsigned blocks) {  // contiguous: no check (the destinations are 256-byte aligned)
    return time_graph(s, [&](cudaStream_t st) {
      zc_copy<<<blocks, threads, 0, st>>>(reinterpret_cast<uint4*>(dst), payload, pay16);
      consumer(st);
    });
  };
  const float floor = time_graph(s, consumer);
  const float plain = plain_copy(8);
  const float s1 = dev(1, false, "dev_s1"), s2 = dev(2, false, "dev_s2"), ci = dev(1, true, "dev_ci");
  const float p2 = par(2, false, "par_s2"), pci = par(1, true, "par_ci");
  const scatter_params p1 = params(1, false), p1ci = params(1, true);
  const small_params sp{p1.header, p1.arena, p1.tiles, p1.tile_count, p1.spec};
  const float sm1 = cell("small_s1", [&](cudaStream_t st) { scatter_small<<<grid, threads, 0, st>>>(sp); });
  const float plain_grid = plain_copy(grid);
  const auto wgrid = static_cast<unsigned>((tiles.size() + 3) / 4);
  const float warp_tile = cell("warp_tile", [&](cudaStream_t st) { scatter_warp<<<wgrid, 128, 0, st>>>(p1); });
  const float lean = cell("lean", [&](cudaStream_t st) { scatter_lean<<<grid, threads, 0, st>>>(p1); });
  float comp = -1.f, comp_ci = -1.f;
  if (std::all_of(sizes.begin(), sizes.end(), [&](size_t x) { return x == sizes[0] && x <= tile_bytes; })) {
    const auto b = static_cast<std::uint32_t>(sizes[0]);
    const auto stride = static_cast<std::uint32_t>((sizes[0] + 255) / 256 * 256);
    const auto base = reinterpret_cast<std::uintptr_t>(dst);
    const auto nn = static_cast<std::uint32_t>(n);
    comp_ci = cell("computed_ci", [&](cudaStream_t st) { scatter_computed<<<grid, threads, 0, st>>>(p1ci, base, b, stride, nn); });
    comp = cell("computed", [&](cudaStream_t st) { scatter_computed<<<grid, threads, 0, st>>>(p1, base, b, stride, nn); });
  }
  std::printf("%-10s %5zu %6zu %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %8.2f %8.2f %10.2f %9.2f %11.2f %6.2f\n", name,
              tiles.size(), arena_bytes, floor, plain, s1, s2, ci, p2, pci, sm1, comp, plain_grid, warp_tile, comp_ci, lean);
  CK(cudaFreeHost(h));
  CK(cudaFree(dst));
  CK(cudaFree(out));
  CK(cudaFree(dtiles));
}

int main()
{
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("%-10s %5s %6s %7s %7s %7s %7s %7s %7s %7s %8s %8s %10s %9s %11s %6s\n", "case", "tiles", "arena", "floor", "plain8", "dev_s1",
              "dev_s2", "dev_ci", "par_s2", "par_ci", "small_s1", "computed", "plain_grid", "warp_tile", "computed_ci", "lean");
  run_case("tiny4", std::vector<size_t>(4, 64), s, sms);
  run_case("small32", std::vector<size_t>(32, 256), s, sms);
  run_case("small64", std::vector<size_t>(64, 512), s, sms);
  run_case("decode256", {1024, 2048, 1024, 2048, 65536, 1028, 1024, 1024, 1024, 1024, 2048, 1024}, s, sms);
  return 0;
}
