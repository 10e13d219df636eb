// SPDX-License-Identifier: Apache-2.0
// Exploratory probe (not a ferry benchmark): is the cursor load what makes ferry's copy kernel cost ~2 us
// per hook inside a model's graph (docs/perf/journal.md), while a plain copy of the same tensor costs ~0.8?
// Hypothesis: between two hooks a decoder layer streams ~30 MB of weights through L2, so the cursor slot
// that the previous hook's kernel wrote is evicted and the next copy kernel's cursor load goes to DRAM on its
// critical path (the hooked tensor itself was just written: an L2 hit).
// Graph per step: 1,680 filler kernels and 28 hooks (one per 60 fillers). Fillers: "cold" = each streams
// 1 MiB of a 512 MiB buffer (132 blocks; 60 of them between two hooks move 60 MiB, more than L2), "warm" =
// the same kernel over 1 KiB (nothing evicted). Hooks (2 KiB entries, one block of 64 threads, V = 2):
//   none        no hook
//   ferry       ferry's copy kernel body (copy_commit_vec<2>): cursor load, commit, copy
//   baked       the same with the cursor value in the kernel parameters (no cursor load; NOT graph-safe
//               across replays: a probe only), still committing
//   evict_last  the cursor loaded and committed with an L2 cache-policy hint (createpolicy ... L2::evict_last)
//   persist     ferry's body, launched with an access-policy window (hitProp persisting) over the state
//               block, after cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 MiB)
//   copy        a plain 2 KiB copy to a fixed destination (no cursor)
// Each cell: GPU span of one graph launch (events), median of 100 replays after 5 warm-ups; ferry / baked /
// evict_last / persist entries of the last replay are checked against the sources.
// Run: bash bench/device/drivers/run_all.sh probe=d2h_cursor_probe (built as probe_common.cuh says).
#include "d2h/copy/copy_entry.cuh"
#include "probe_common.cuh"

#include <ferry/backend/grid_dependency.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kFillers = 1680;
constexpr int kHooks = 28;
constexpr std::size_t kEntry = 2048;
constexpr std::size_t kBig = std::size_t{512} << 20;

/// Streams `n16` vectors starting at `p` (grid-stride), keeping the sum live.
__global__ void filler(const uint4* p, std::size_t n16, unsigned long long* sink)
{
  unsigned long long acc = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n16; i += std::size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    acc += v.x ^ v.w;
  }
  if (acc == 0x1234567ULL) { *sink = acc; }
}

__global__ void ferry_copy(ferry::d2h::detail::copy_args a)
{
  ferry::backend::grid_dependency_launch_dependents();
  ferry::backend::grid_dependency_wait();
  ferry::kernels::d2h::copy_commit_vec<2>(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

/// The one-pass, V = 2 copy of the hand-written variants below: the source loads (before the cursor), then
/// the stores to where the cursor placed the entry.
struct two_vecs {
  ulonglong2 r[2];
  unsigned vecs, t, nt;
  __device__ explicit two_vecs(const ferry::d2h::detail::copy_args& a)
    : vecs{static_cast<unsigned>(a.bytes / 16)}, t{threadIdx.x}, nt{blockDim.x}
  {
    const auto* s = reinterpret_cast<const ulonglong2*>(a.src);
    if (t < vecs) { r[0] = s[t]; }
    if (t + nt < vecs) { r[1] = s[t + nt]; }
  }
  __device__ void store(std::byte* dst) const
  {
    auto* d = reinterpret_cast<ulonglong2*>(dst);
    if (t < vecs) { d[t] = r[0]; }
    if (t + nt < vecs) { d[t + nt] = r[1]; }
  }
};

/// ferry's body with the cursor value given (`c`): the copy and the commit, no cursor load.
__global__ void baked_copy(ferry::d2h::detail::copy_args a, ferry::d2h::cursor c)
{
  const two_vecs v{a};
  if (v.t == 0) { a.dst.commit(c); }
  v.store(a.dst.ring + a.dst.offset(c));
}

/// ferry's body with the cursor load and commit carrying an L2::evict_last hint.
__global__ void evict_last_copy(ferry::d2h::detail::copy_args a)
{
  const two_vecs v{a};
  ferry::d2h::cursor c;
  const ferry::d2h::cursor* slot = &a.dst.state->slot[a.dst.parity];
  std::uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("ld.global.L2::cache_hint.v2.u64 {%0, %1}, [%2], %3;" : "=l"(c.phys), "=l"(c.dyn_slot) : "l"(slot), "l"(pol));
  const std::uint64_t off = a.dst.offset(c);
  if (v.t == 0) {
    const std::uint64_t end = off + a.dst.reserved;
    ferry::d2h::cursor* next = &a.dst.state->slot[a.dst.parity ^ 1U];
    const std::uint64_t phys = end == a.dst.ring_bytes ? 0 : end;
    const std::uint64_t dyn = c.dyn_slot + (std::uint64_t{1} << 32);
    asm volatile("st.global.L2::cache_hint.v2.u64 [%0], {%1, %2}, %3;" ::"l"(next), "l"(phys), "l"(dyn), "l"(pol) : "memory");
  }
  v.store(a.dst.ring + off);
}

__global__ void plain_copy(uint4* dst, const uint4* src, unsigned n16)
{
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += gridDim.x * blockDim.x) { dst[i] = src[i]; }
}

enum class hook { none, ferry, baked, evict_last, persist, copy };
const char* hook_name(hook h)
{
  switch (h) {
    case hook::none: return "none";
    case hook::ferry: return "ferry";
    case hook::baked: return "baked";
    case hook::evict_last: return "evict_last";
    case hook::persist: return "persist";
    case hook::copy: return "copy";
  }
  return "?";
}

}  // namespace

int main()
{
  std::byte* big = nullptr;
  unsigned long long* sink = nullptr;
  std::byte* src = nullptr;
  std::byte* ring = nullptr;
  std::byte* fixed = nullptr;
  ferry::d2h::device_state* state = nullptr;
  const std::size_t ring_bytes = 1 << 20;
  CK(cudaMalloc(&big, kBig));
  CK(cudaMemset(big, 1, kBig));
  CK(cudaMalloc(&sink, 8));
  CK(cudaMalloc(&src, kEntry * kHooks));
  CK(cudaMalloc(&ring, ring_bytes));
  CK(cudaMalloc(&fixed, kEntry * kHooks));
  CK(cudaMalloc(&state, sizeof(ferry::d2h::device_state)));
  std::vector<unsigned char> host(kEntry * kHooks);
  std::mt19937 rng(11);
  for (auto& b : host) { b = static_cast<unsigned char>(rng() | 1U); }
  CK(cudaMemcpy(src, host.data(), host.size(), cudaMemcpyHostToDevice));
  int persist_max = 0;
  CK(cudaDeviceGetAttribute(&persist_max, cudaDevAttrMaxPersistingL2CacheSize, 0));
  std::printf("max persisting L2 %d bytes\n", persist_max);

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("fillers  hook        us/step   delta_us  us/hook  entries\n");
  for (int cold = 0; cold < 2; ++cold) {
    float base = 0;
    for (hook h : {hook::none, hook::ferry, hook::baked, hook::evict_last, hook::persist, hook::copy}) {
      CK(cudaMemset(state, 0, sizeof(ferry::d2h::device_state)));
      if (const cudaError_t e = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, h == hook::persist ? std::size_t{1} << 20 : 0);
          e != cudaSuccess) {
        std::printf("%-8s %-11s cudaDeviceSetLimit(persisting L2): %s, skipped\n", cold ? "cold" : "warm", hook_name(h),
                    cudaGetErrorString(e));
        (void)cudaGetLastError();
        continue;
      }
      CK(cudaDeviceSynchronize());
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      int k = 0;
      std::uint64_t phys = 0;  // the baked cursor: this replay's placement from 0 (slots reset per replay)
      for (int i = 0; i < kFillers; ++i) {
        const std::size_t chunk = cold ? (std::size_t{1} << 20) : 1024;
        const std::size_t at = cold ? (static_cast<std::size_t>(i) * chunk) % kBig : 0;
        filler<<<cold ? 132 : 1, 256, 0, s>>>(reinterpret_cast<const uint4*>(big + at), chunk / 16, sink);
        if (i % (kFillers / kHooks) != kFillers / kHooks - 1 || k >= kHooks || h == hook::none) { continue; }
        const auto a = hook_args(state, ring, ring_bytes, src, k, kEntry);
        if (h == hook::ferry) {
          ferry_copy<<<1, 64, 0, s>>>(a);
        } else if (h == hook::baked) {
          baked_copy<<<1, 64, 0, s>>>(a, ferry::d2h::cursor{phys, std::uint64_t(k) << 32});
        } else if (h == hook::evict_last) {
          evict_last_copy<<<1, 64, 0, s>>>(a);
        } else if (h == hook::persist) {
          cudaLaunchConfig_t lc{};
          lc.gridDim = dim3(1);
          lc.blockDim = dim3(64);
          lc.stream = s;
          cudaLaunchAttribute attr{};
          attr.id = cudaLaunchAttributeAccessPolicyWindow;
          attr.val.accessPolicyWindow.base_ptr = state;
          attr.val.accessPolicyWindow.num_bytes = sizeof(ferry::d2h::device_state);
          attr.val.accessPolicyWindow.hitRatio = 1.0f;
          attr.val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
          attr.val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
          lc.attrs = &attr;
          lc.numAttrs = 1;
          CK(cudaLaunchKernelEx(&lc, ferry_copy, a));
        } else {
          plain_copy<<<1, 64, 0, s>>>(reinterpret_cast<uint4*>(fixed + k * kEntry),
                                      reinterpret_cast<const uint4*>(src + k * kEntry), kEntry / 16);
        }
        phys += kEntry;
        ++k;
      }
      captured_graph graph;
      end_capture(s, graph);
      const float med = replay_median(s, graph.x, 5, 100, [&](cudaStream_t st) {
        if (h == hook::baked) { CK(cudaMemsetAsync(state, 0, sizeof(ferry::d2h::device_state), st)); }
      });
      if (h == hook::none) { base = med; }
      const char* verdict = "-";
      if (h != hook::none && h != hook::copy) {  // the last replay's 28 entries end at slot[0] (even count)
        const bool ok = last_forward_exact(state, ring, ring_bytes, host, kHooks, kEntry);
        verdict = ok ? "exact" : "WRONG (or wrapped)";
      }
      std::printf("%-8s %-11s %9.1f %9.1f %8.2f  %s\n", cold ? "cold" : "warm", hook_name(h), med, med - base,
                  h == hook::none ? 0.0f : (med - base) / kHooks, verdict);
    }
  }
  (void)cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
  return 0;
}
