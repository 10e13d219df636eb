// SPDX-License-Identifier: Apache-2.0
// Exploratory probe (not a ferry benchmark): what one H2D upload costs inside a CUDA graph on this machine,
// by size and pinned-allocation kind, next to a zero-copy read of the same bytes. Each cell: GPU span from an
// event before the graph launch to an event after it, median of 400 replays after 20 warm-ups, random data.
//   floor     : graph = [consumer]            (one block per 4 KiB reads the destination)
//   dma_<kind>: graph = [memcpy H2D S bytes -> consumer]
//   zc_<n>    : graph = [n-block kernel copies S bytes from mapped pinned memory -> consumer]
// Run: bash bench/device/drivers/run_all.sh probe=h2d_upload_probe (built as probe_common.cuh says).
#include "probe_common.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

int main()
{
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t maxb = 256 << 10;
  void *h_default, *h_mapped, *h_wc;
  CK(cudaMallocHost(&h_default, maxb));
  CK(cudaHostAlloc(&h_mapped, maxb, cudaHostAllocMapped));
  CK(cudaHostAlloc(&h_wc, maxb, cudaHostAllocMapped | cudaHostAllocWriteCombined));
  std::mt19937_64 rng{42};
  for (void* p : {h_default, h_mapped, h_wc}) {
    auto* w = static_cast<unsigned long long*>(p);
    for (size_t i = 0; i < maxb / 8; ++i) { w[i] = rng() | 1; }
  }
  void *d_dst, *d_out;
  CK(cudaMalloc(&d_dst, maxb));
  CK(cudaMalloc(&d_out, 64));
  void *dm, *dwc;
  CK(cudaHostGetDevicePointer(&dm, h_mapped, 0));
  CK(cudaHostGetDevicePointer(&dwc, h_wc, 0));
  std::printf("%8s %7s %9s %9s %9s %9s %9s %9s %9s %9s\n", "bytes", "floor", "dma_def", "dma_map", "dma_wc", "dma_2x",
              "zc_1", "zc_8", "zc_32", "zc_wc32");
  for (size_t S : {256UL, 1024UL, 2048UL, 4096UL, 8192UL, 16384UL, 32768UL, 65536UL, 81920UL, 131072UL}) {
    const size_t n16 = S / 16;
    const unsigned cblocks = static_cast<unsigned>(std::max<size_t>(1, S / 4096));
    auto consumer = [&](cudaStream_t st) {
      consume<<<cblocks, 256, 0, st>>>(static_cast<const uint4*>(d_dst), n16, static_cast<unsigned long long*>(d_out));
    };
    const float floor = time_graph(s, consumer);
    auto dma = [&](void* h) {
      return time_graph(s, [&](cudaStream_t st) {
        CK(cudaMemcpyAsync(d_dst, h, S, cudaMemcpyHostToDevice, st));
        consumer(st);
      });
    };
    const float dd = dma(h_default), dmp = dma(h_mapped), dwcv = dma(h_wc);
    // two half-size DMAs back to back (is the cost per node or per byte?)
    const float d2 = time_graph(s, [&](cudaStream_t st) {
      CK(cudaMemcpyAsync(d_dst, h_mapped, S / 2, cudaMemcpyHostToDevice, st));
      CK(cudaMemcpyAsync(static_cast<char*>(d_dst) + S / 2, static_cast<char*>(h_mapped) + S / 2, S - S / 2,
                         cudaMemcpyHostToDevice, st));
      consumer(st);
    });
    auto zc = [&](unsigned blocks, void* src) {
      return time_graph(s, [&](cudaStream_t st) {
        zc_copy<<<blocks, 128, 0, st>>>(static_cast<uint4*>(d_dst), static_cast<const uint4*>(src), n16);
        consumer(st);
      });
    };
    std::printf("%8zu %7.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", S, floor, dd, dmp, dwcv, d2, zc(1, dm),
                zc(8, dm), zc(32, dm), zc(32, dwc));
  }
  return 0;
}
