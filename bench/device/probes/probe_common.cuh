// SPDX-License-Identifier: Apache-2.0
// The one header of the exploratory probes in this folder (not ferry code): the error check, the probes'
// first consumer, a plain 8-loads-in-flight copy kernel, the graph timer (GPU span from an event before the
// graph launch to an event after it, median of 400 replays after 20 warm-ups) and, for the D2H probes, a
// hook's copy arguments and the check of the last replay's entries.
// Every probe builds the same way (bench/device/drivers/run_all.sh probe=<name>), from the repo root:
//   nvcc -O3 -std=c++20 -arch=sm_90 -I include -I kernels bench/device/probes/<name>.cu
#pragma once

#include <ferry/d2h/detail/kernel_args.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

/// A graph instantiated from the capture that end_capture(s) ends; destroyed with it.
struct captured_graph {
  cudaGraph_t g{};
  cudaGraphExec_t x{};
  captured_graph() = default;
  captured_graph(const captured_graph&) = delete;
  captured_graph& operator=(const captured_graph&) = delete;
  ~captured_graph()
  {
    if (x != nullptr) { cudaGraphExecDestroy(x); }
    if (g != nullptr) { cudaGraphDestroy(g); }
  }
};

inline void end_capture(cudaStream_t s, captured_graph& out)
{
  CK(cudaStreamEndCapture(s, &out.g));
  CK(cudaGraphInstantiate(&out.x, out.g, 0));
}

/// Median span (us) of `reps` replays of `x` on `s` after `warmup` more; before(s) runs ahead of each
/// replay's start event.
template <class F>
float replay_median(cudaStream_t s, cudaGraphExec_t x, int warmup, int reps, F&& before)
{
  timer t;
  std::vector<float> us;
  for (int i = 0; i < warmup + reps; ++i) {
    before(s);
    CK(cudaEventRecord(t.a, s));
    CK(cudaGraphLaunch(x, s));
    CK(cudaEventRecord(t.b, s));
    CK(cudaEventSynchronize(t.b));
    if (i >= warmup) { us.push_back(t.us()); }
  }
  return median(us);
}

inline float replay_median(cudaStream_t s, cudaGraphExec_t x, int warmup, int reps)
{
  return replay_median(s, x, warmup, reps, [](cudaStream_t) {});
}

/// Captures body(stream) into a graph and returns the median span of 400 replays after 20 warm-ups, us.
template <class F>
float time_graph(cudaStream_t s, F&& body)
{
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body(s);
  captured_graph graph;
  end_capture(s, graph);
  return replay_median(s, graph.x, 20, 400);
}

// ---- D2H probes ------------------------------------------------------------------------------------------

/// The copy arguments of hook `k` of a forward: `entry` bytes from src + k * entry into the ring entry that
/// cursor slot k % 2 places (every hook commits once), two 16-byte vectors per thread.
inline ferry::d2h::detail::copy_args hook_args(ferry::d2h::device_state* state, std::byte* ring, std::size_t ring_bytes,
                                               const std::byte* src, int k, std::size_t entry)
{
  ferry::d2h::detail::copy_args a{};
  a.dst.ring = ring;
  a.dst.state = state;
  a.dst.ring_bytes = ring_bytes;
  a.dst.reserved = entry;
  a.dst.parity = static_cast<std::uint32_t>(k % 2);
  a.src = src + static_cast<std::size_t>(k) * entry;
  a.bytes = entry;
  a.vecs_per_thread = 2;
  return a;
}

/// Whether the `hooks` entries of `entry` bytes that end at the cursor slot[0] of `state` (an even number of
/// commits: parity back to 0) hold `host`'s bytes, in order. A cursor at 0 ended exactly at the ring's end.
inline bool last_forward_exact(const ferry::d2h::device_state* state, const std::byte* ring, std::size_t ring_bytes,
                               const std::vector<unsigned char>& host, int hooks, std::size_t entry)
{
  ferry::d2h::device_state st{};
  CK(cudaMemcpy(&st, state, sizeof st, cudaMemcpyDeviceToHost));
  std::vector<unsigned char> got(ring_bytes);
  CK(cudaMemcpy(got.data(), ring, ring_bytes, cudaMemcpyDeviceToHost));
  const std::uint64_t end = st.slot[0].phys == 0 ? ring_bytes : st.slot[0].phys;
  bool ok = end >= entry * hooks;
  for (int j = 0; ok && j < hooks; ++j) {
    ok = std::memcmp(got.data() + end - entry * (hooks - j), host.data() + j * entry, entry) == 0;
  }
  return ok;
}
