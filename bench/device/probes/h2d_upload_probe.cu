// SPDX-License-Identifier: Apache-2.0
// Exploratory probe (not a ferry benchmark): what one H2D upload costs inside a CUDA graph on this machine,
// by size and pinned-allocation kind, next to a zero-copy read of the same bytes. Each cell: GPU span from an
// event before the graph launch to an event after it, median of 400 replays after 20 warm-ups, random data.
//   floor     : graph = [consumer]            (one block per 4 KiB reads the destination)
//   dma_<kind>: graph = [memcpy H2D S bytes -> consumer]
//   zc_<n>    : graph = [n-block kernel copies S bytes from mapped pinned memory -> consumer]
// Build: nvcc -O3 -std=c++17 -arch=sm_90 h2d_upload_probe.cu -o h2d_upload_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

__global__ void consume(const uint4* p, size_t n16, unsigned long long* out)
{
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x123456789ULL) { *out = acc; }
}

__global__ void zc_copy(uint4* dst, const uint4* src, size_t n16)
{
  constexpr int V = 8;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t base = blockIdx.x * (size_t)blockDim.x + threadIdx.x; base < n16; base += stride * V) {
    uint4 r[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const size_t i = base + j * stride;
      if (i < n16) { r[j] = src[i]; }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const size_t i = base + j * stride;
      if (i < n16) { dst[i] = r[j]; }
    }
  }
}

template <class F>
float time_graph(cudaStream_t s, F&& body)
{
  cudaGraph_t g;
  cudaGraphExec_t x;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body(s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&x, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 420; ++i) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(x, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    if (i >= 20) { ms.push_back(t); }
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaGraphExecDestroy(x));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms[ms.size() / 2] * 1000.f;
}

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
