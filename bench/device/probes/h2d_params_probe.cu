// SPDX-License-Identifier: Apache-2.0
// Exploratory probe (not a ferry benchmark): can small per-step metadata travel IN the scatter kernel's
// parameters (no DMA, no zero-copy read after the start event)? In a graph the CPU rewrites the kernel
// node's parameters before each replay (cudaGraphExecKernelNodeSetParams: it applies to the next launch,
// not to launches in flight). Each cell: GPU span from an event before the launch to an event after the
// consumer, median of 400 after 20 warm-ups, random data changed every iteration and checked afterwards.
//   floor    : [consumer]
//   param_g  : graph [params kernel -> consumer], node parameters rewritten before every replay
//   param_e  : eager params kernel + consumer
//   zc8_g    : graph [8-block kernel reads the bytes from mapped pinned memory -> consumer]
//   dma_g    : graph [memcpy H2D -> consumer]
// plus the CPU cost of one node-parameter rewrite (set_us) and of one eager launch (launch_us).
// Run: bash bench/device/drivers/run_all.sh probe=h2d_params_probe (built as probe_common.cuh says).
#include "probe_common.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

template <size_t N>
struct payload {
  uint4* dst;
  uint4 v[N / 16];
};

template <size_t N>
__global__ void from_params(const __grid_constant__ payload<N> p)
{
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < N / 16; i += (size_t)gridDim.x * blockDim.x) {
    p.dst[i] = p.v[i];
  }
}

template <size_t N>
void row(cudaStream_t s, void* h_mapped, void* d_mapped, uint4* d_dst, unsigned long long* d_out, std::mt19937_64& rng)
{
  const size_t n16 = N / 16;
  const unsigned cblocks = static_cast<unsigned>(std::max<size_t>(1, N / 4096));
  const unsigned pblocks = static_cast<unsigned>(std::max<size_t>(1, N / 4096));
  auto consumer = [&](cudaStream_t st) { consume<<<cblocks, 256, 0, st>>>(d_dst, n16, d_out); };
  const float floor = time_graph(s, consumer);
  const float zc8 = time_graph(s, [&](cudaStream_t st) {
    zc_copy<<<8, 128, 0, st>>>(d_dst, static_cast<const uint4*>(d_mapped), n16);
    consumer(st);
  });
  const float dma = time_graph(s, [&](cudaStream_t st) {
    CK(cudaMemcpyAsync(d_dst, h_mapped, N, cudaMemcpyHostToDevice, st));
    consumer(st);
  });

  auto* p = new payload<N>{};
  p->dst = d_dst;
  void* args[] = {p};
  // graph [params kernel -> consumer], built explicitly so the kernel node is at hand
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(&from_params<N>);
  kp.gridDim = dim3(pblocks);
  kp.blockDim = dim3(256);
  kp.kernelParams = args;
  cudaGraphNode_t kn, cn;
  CK(cudaGraphAddKernelNode(&kn, g, nullptr, 0, &kp));
  const uint4* cdst = d_dst;
  void* cargs[] = {&cdst, const_cast<size_t*>(&n16), &d_out};
  cudaKernelNodeParams cp{};
  cp.func = reinterpret_cast<void*>(&consume);
  cp.gridDim = dim3(cblocks);
  cp.blockDim = dim3(256);
  cp.kernelParams = cargs;
  CK(cudaGraphAddKernelNode(&cn, g, &kn, 1, &cp));
  cudaGraphExec_t x;
  CK(cudaGraphInstantiate(&x, g, 0));
  timer t;
  std::vector<float> gus, eus, set_us, launch_us;
  std::vector<uint4> back(n16);
  long bad = 0;
  auto fill = [&] {
    auto* w = reinterpret_cast<unsigned long long*>(p->v);
    for (size_t i = 0; i < N / 8; ++i) { w[i] = rng() | 1; }
  };
  auto check = [&] {
    CK(cudaMemcpy(back.data(), d_dst, N, cudaMemcpyDeviceToHost));
    if (std::memcmp(back.data(), p->v, N) != 0) { ++bad; }
  };
  // One measured loop: fill() fresh data (untimed), then op() -- the CPU operation whose time is the second
  // series -- before the start event (graph: the node rewrite) or inside the span (eager: the launch that
  // carries the payload), then body() and the end event; 20 warm-ups, 400 kept, destination checked.
  auto measure = [&](std::vector<float>& gpu, std::vector<float>& cpu, auto&& op, auto&& body, bool op_inside) {
    for (int i = 0; i < 420; ++i) {
      fill();
      if (!op_inside) {
        const auto c0 = std::chrono::steady_clock::now();
        op();
        cpu.push_back(std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - c0).count());
      }
      CK(cudaEventRecord(t.a, s));
      if (op_inside) {
        const auto c0 = std::chrono::steady_clock::now();
        op();
        cpu.push_back(std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - c0).count());
      }
      body();
      CK(cudaEventRecord(t.b, s));
      CK(cudaEventSynchronize(t.b));
      if (i >= 20) { gpu.push_back(t.us()); }
      if (i % 8 == 0) { check(); }
    }
    cpu.erase(cpu.begin(), cpu.begin() + 20);
  };
  measure(gus, set_us, [&] { CK(cudaGraphExecKernelNodeSetParams(x, kn, &kp)); }, [&] { CK(cudaGraphLaunch(x, s)); }, false);
  measure(eus, launch_us, [&] { from_params<N><<<pblocks, 256, 0, s>>>(*p); }, [&] { consumer(s); }, true);
  // eager floor: consumer alone
  std::vector<float> efl;
  for (int i = 0; i < 420; ++i) {
    CK(cudaEventRecord(t.a, s));
    consumer(s);
    CK(cudaEventRecord(t.b, s));
    CK(cudaEventSynchronize(t.b));
    if (i >= 20) { efl.push_back(t.us()); }
  }
  std::printf("%8zu %7.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %5ld\n", N, floor, median(gus), zc8, dma,
              median(efl), median(eus), median(set_us), median(launch_us), bad);
  CK(cudaGraphExecDestroy(x));
  CK(cudaGraphDestroy(g));
  delete p;
}

int main()
{
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t maxb = 64 << 10;
  void* h_mapped;
  CK(cudaHostAlloc(&h_mapped, maxb, cudaHostAllocMapped));
  std::mt19937_64 rng{42};
  auto* w = static_cast<unsigned long long*>(h_mapped);
  for (size_t i = 0; i < maxb / 8; ++i) { w[i] = rng() | 1; }
  void *d_dst, *d_out, *dm;
  CK(cudaMalloc(&d_dst, maxb));
  CK(cudaMalloc(&d_out, 64));
  CK(cudaHostGetDevicePointer(&dm, h_mapped, 0));
  std::printf("%8s %7s %8s %8s %8s %8s %8s %8s %9s %5s\n", "bytes", "floor_g", "param_g", "zc8_g", "dma_g", "floor_e",
              "param_e", "set_us", "launch_us", "bad");
  auto* dst = static_cast<uint4*>(d_dst);
  auto* out = static_cast<unsigned long long*>(d_out);
  row<256>(s, h_mapped, dm, dst, out, rng);
  row<1024>(s, h_mapped, dm, dst, out, rng);
  row<4096>(s, h_mapped, dm, dst, out, rng);
  row<8192>(s, h_mapped, dm, dst, out, rng);
  row<16384>(s, h_mapped, dm, dst, out, rng);
  row<32000>(s, h_mapped, dm, dst, out, rng);
  return 0;
}
