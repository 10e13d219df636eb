// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the exploratory probes in this folder (not ferry code): the error check, the probes'
// first consumer, a plain 8-loads-in-flight copy kernel, and the graph timer (GPU span from an event
// before the graph launch to an event after it, median of 400 replays after 20 warm-ups).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

/// The first consumer: reads n16 16-byte vectors (grid stride) and keeps the result live.
__global__ void consume(const uint4* p, size_t n16, unsigned long long* out)
{
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x123456789ULL) { *out = acc; }
}

/// Plain contiguous copy, 8 loads in flight per thread before the stores (a zero-copy read when `src` is a
/// mapped pinned pointer).
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

inline float median(std::vector<float> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Two timing events; us() is the span between them.
struct timer {
  cudaEvent_t a, b;
  timer()
  {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  ~timer()
  {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  timer(const timer&) = delete;
  timer& operator=(const timer&) = delete;
  [[nodiscard]] float us() const
  {
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    return t * 1000.f;
  }
};

/// Captures body(stream) into a graph and returns the median span of its replays, us.
template <class F>
float time_graph(cudaStream_t s, F&& body)
{
  cudaGraph_t g;
  cudaGraphExec_t x;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body(s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&x, g, 0));
  timer t;
  std::vector<float> us;
  for (int i = 0; i < 420; ++i) {
    CK(cudaEventRecord(t.a, s));
    CK(cudaGraphLaunch(x, s));
    CK(cudaEventRecord(t.b, s));
    CK(cudaEventSynchronize(t.b));
    if (i >= 20) { us.push_back(t.us()); }
  }
  CK(cudaGraphExecDestroy(x));
  CK(cudaGraphDestroy(g));
  return median(us);
}
