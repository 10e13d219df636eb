// SPDX-License-Identifier: Apache-2.0
// Exploratory probe (not a ferry benchmark): does ferry's copy kernel cost more per hook when the graph
// around it runs many DIFFERENT kernels (as a torch model's graph does: ~1,700 kernels of ~100 kinds per
// Qwen3 decode step) than when it runs one kernel over and over (the simulated forward of bench/d2h)?
// Hypothesis: instruction-cache misses (a copy kernel with a run-time switch over four unrolled vector widths
// and the byte path had ~15 KB of SASS; torch's copy kernels are small). The "ferry" row runs ferry's current
// copy body (copy_commit_vec<2>); results in docs/perf/journal.md.
// Graph per step: 1,680 filler kernels (1 block x 128 threads, 512 dependent FMAs, ~8 KB of code each),
// either ONE filler kernel repeated ("same") or 64 distinct ones in turn ("distinct"), and 28 hooks (one
// per 60 fillers), each one of:
//   none      no hook
//   ferry     ferry's copy kernel body (kernels/d2h/copy/copy_entry.cuh), V=2, 128 threads, 2 KiB entries
//   lean      the same work (cursor load, commit, 2 KiB copy, V=2) in a kernel specialized for V=2 and
//             16-byte aligned sources, 32-bit indices
//   copy      a plain 2 KiB copy to a fixed destination (no cursor)
//   memcpy    cudaMemcpyAsync device to device, 2 KiB
// Each cell: GPU span of one graph launch (events), median of 200 replays after 10 warm-ups; the ring's
// last step is checked against the sources (ferry and lean).
// Run: bash bench/device/drivers/run_all.sh probe=d2h_icache_probe (built as probe_common.cuh says).
#include "d2h/copy/copy_entry.cuh"
#include "probe_common.cuh"

#include <ferry/backend/grid_dependency.hpp>

#include <cuda_runtime.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

namespace {

constexpr int kFillers = 1680;
constexpr int kHooks = 28;
constexpr int kKinds = 64;
constexpr std::size_t kEntry = 2048;

template <int I>
__global__ void filler(float* x)
{
  float v = x[threadIdx.x];
#pragma unroll
  for (int j = 0; j < 512; ++j) { v = fmaf(v, 1.0f + float(I * 512 + j) * 1e-9f, float((j ^ I) & 7) * 1e-6f); }
  x[threadIdx.x] = v;
}

using filler_fn = void (*)(float*);
template <int... I>
constexpr std::array<filler_fn, sizeof...(I)> make_fillers(std::integer_sequence<int, I...>)
{
  return {&filler<I>...};
}

__global__ void ferry_copy(ferry::d2h::detail::copy_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  ferry::backend::grid_dependency_wait();
  ferry::kernels::d2h::copy_commit_vec<2>(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

/// The same work as ferry_copy for a 16-byte aligned source and V=2: one pass per 2*blockDim.x vectors.
__global__ void lean_copy(ferry::d2h::detail::copy_args a)
{
  constexpr unsigned V = 2;
  const auto* s = reinterpret_cast<const ulonglong2*>(a.src);
  const unsigned vecs = static_cast<unsigned>(a.bytes / 16);
  const unsigned nt = blockDim.x;
  ulonglong2 r[V];
  for (unsigned base = blockIdx.x * nt * V + threadIdx.x; base < vecs; base += gridDim.x * nt * V) {
#pragma unroll
    for (unsigned j = 0; j < V; ++j) {
      if (base + j * nt < vecs) { r[j] = s[base + j * nt]; }
    }
    const ferry::d2h::cursor c = a.dst.load();
    if (blockIdx.x == 0 && threadIdx.x == 0 && base == threadIdx.x) { a.dst.commit(c); }
    auto* d = reinterpret_cast<ulonglong2*>(a.dst.ring + a.dst.offset(c));
#pragma unroll
    for (unsigned j = 0; j < V; ++j) {
      if (base + j * nt < vecs) { d[base + j * nt] = r[j]; }
    }
  }
}

__global__ void plain_copy(uint4* dst, const uint4* src, unsigned n16)
{
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += gridDim.x * blockDim.x) { dst[i] = src[i]; }
}

enum class hook { none, ferry, lean, copy, memcpy };
const char* hook_name(hook h)
{
  switch (h) {
    case hook::none: return "none";
    case hook::ferry: return "ferry";
    case hook::lean: return "lean";
    case hook::copy: return "copy";
    case hook::memcpy: return "memcpy";
  }
  return "?";
}

}  // namespace

int main()
{
  const auto fillers = make_fillers(std::make_integer_sequence<int, kKinds>{});
  float* x = nullptr;
  CK(cudaMalloc(&x, 128 * sizeof(float) * kKinds));
  CK(cudaMemset(x, 0, 128 * sizeof(float) * kKinds));
  std::byte* src = nullptr;
  std::byte* ring = nullptr;
  std::byte* fixed = nullptr;
  ferry::d2h::device_state* state = nullptr;
  const std::size_t ring_bytes = 1 << 20;
  CK(cudaMalloc(&src, kEntry * kHooks));
  CK(cudaMalloc(&ring, ring_bytes));
  CK(cudaMalloc(&fixed, kEntry * kHooks));
  CK(cudaMalloc(&state, sizeof(ferry::d2h::device_state)));
  CK(cudaMemset(state, 0, sizeof(ferry::d2h::device_state)));
  std::vector<unsigned char> host(kEntry * kHooks);
  std::mt19937 rng(7);
  for (auto& b : host) { b = static_cast<unsigned char>(rng() | 1U); }
  CK(cudaMemcpy(src, host.data(), host.size(), cudaMemcpyHostToDevice));

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  std::printf("mode      hook      us/step   delta_us  us/hook\n");
  for (int distinct = 0; distinct < 2; ++distinct) {
    float base = 0;
    for (hook h : {hook::none, hook::ferry, hook::lean, hook::copy, hook::memcpy}) {
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      int k = 0;
      for (int i = 0; i < kFillers; ++i) {
        const int kind = distinct ? i % kKinds : 0;
        fillers[kind]<<<1, 128, 0, s>>>(x + 128 * kind);
        if (i % (kFillers / kHooks) == kFillers / kHooks - 1 && k < kHooks && h != hook::none) {
          const auto a = hook_args(state, ring, ring_bytes, src, k, kEntry);
          if (h == hook::ferry) {
            ferry_copy<<<1, 128, 0, s>>>(a);
          } else if (h == hook::lean) {
            lean_copy<<<1, 64, 0, s>>>(a);
          } else if (h == hook::copy) {
            plain_copy<<<1, 128, 0, s>>>(reinterpret_cast<uint4*>(fixed + k * kEntry),
                                         reinterpret_cast<const uint4*>(src + k * kEntry), kEntry / 16);
          } else {
            CK(cudaMemcpyAsync(fixed + k * kEntry, src + k * kEntry, kEntry, cudaMemcpyDeviceToDevice, s));
          }
          ++k;
        }
      }
      captured_graph graph;
      end_capture(s, graph);
      const float med = replay_median(s, graph.x, 10, 200);
      if (h == hook::none) { base = med; }
      std::printf("%-9s %-8s %9.1f %9.1f %8.2f\n", distinct ? "distinct" : "same", hook_name(h), med, med - base,
                  h == hook::none ? 0.0f : (med - base) / kHooks);
      if (h == hook::ferry || h == hook::lean) {  // the last step's entries are the sources, in order
        const bool ok = last_forward_exact(state, ring, ring_bytes, host, kHooks, kEntry);
        std::printf("          %s entries %s\n", hook_name(h), ok ? "exact" : "WRONG (or wrapped: check)");
      }
    }
  }
  return 0;
}
