// SPDX-License-Identifier: Apache-2.0
// GPU wrappers of the D2H kernels (bodies in detail/d2h_kernels.cuh; getters in ferry/d2h/detail/kernels.hpp).
// Kernels that publish have "publish" in their name: tests/ptx/check_ptx.cmake asserts they contain
// st.release.sys and no __threadfence / volatile store.
#include "detail/d2h_kernels.cuh"
#include "detail/gpu_kernel.cuh"

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/kernels.hpp>

namespace ferry::kernels::d2h {

// Every kernel here may be launched programmatically (launch_config::programmatic): each thread first lets
// the next kernel on the stream be scheduled, then waits until the kernel ahead of it has completed and
// its writes are visible (backend/grid_dependency.hpp) -- the same join as a kernel boundary -- before
// touching the cursor, the source or the ring. Without the launch attribute both are no-ops.
using ferry::backend::grid_dependency_launch_dependents;
using ferry::backend::grid_dependency_wait;

/// One block. Copy, join the block, then (if head_n > 0) thread 0 publishes. No grid join is needed:
/// the block barrier joins every writer of this entry, and earlier entries' writers are joined by the
/// kernel boundaries (or grid_dependency_wait) before this kernel touched anything (stream order).
/// `Copy` is one of the copy forms below (copy_form: V vectors per thread from an aligned source, or bytes).
template <class Copy>
__device__ __forceinline__ void copy_entry_publish_body(const copy_args& a, Copy copy)
{
  grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { grid_dependency_wait(); }
  copy(a, 0U, 1U, threadIdx.x, blockDim.x);
  if (a.head_n != 0) {
    __syncthreads();  // the writer join: every payload store of the block happens-before thread 0's release
    if (threadIdx.x == 0) { publish_phase(a.dst.state, a.head, a.head_n); }
  }
}

/// Any grid; copy only. The publication that covers this entry is a later kernel on the same stream.
template <class Copy>
__device__ __forceinline__ void copy_entry_body(const copy_args& a, Copy copy)
{
  grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { grid_dependency_wait(); }
  copy(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

template <int V>
struct vec_copy {
  __device__ void operator()(const copy_args& a, std::uint32_t blk, std::uint32_t nblk, std::uint32_t t,
                             std::uint32_t nt) const
  {
    copy_commit_vec<V>(a, blk, nblk, t, nt);
  }
};
struct byte_copy {
  __device__ void operator()(const copy_args& a, std::uint32_t blk, std::uint32_t nblk, std::uint32_t t,
                             std::uint32_t nt) const
  {
    copy_commit_bytes(a, blk, nblk, t, nt);
  }
};

/// The one-pass form (copy_form::vN_once; launch_shape.hpp once_form): an entry of a static size, a multiple of
/// 16 bytes, from a 16-byte aligned source, that one pass of the grid covers. copy_commit's order with the
/// least code: the thread's V loads, the cursor load, the commit by the grid's thread (0, 0), V stores. No pass
/// loop, no byte tail, no size load, 32-bit indices (one pass of any launch shape is far below 2^32 vectors).
template <int V>
__device__ __forceinline__ void copy_entry_once_body(const copy_args& a)
{
  grid_dependency_launch_dependents();
  if (a.test_skip_wait == 0) { grid_dependency_wait(); }
  const auto vecs = static_cast<std::uint32_t>(a.bytes >> 4U);
  const std::uint32_t nt = blockDim.x;
  const std::uint32_t base = blockIdx.x * nt * V + threadIdx.x;
  const auto* s = reinterpret_cast<const ulonglong2*>(a.src);
  ulonglong2 r[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (base + j * nt < vecs) { r[j] = s[base + j * nt]; }
  }
  const ferry::d2h::cursor c = a.dst.load();
  if ((blockIdx.x | threadIdx.x) == 0) { a.dst.commit(c); }
  auto* d = reinterpret_cast<ulonglong2*>(a.dst.ring + a.dst.offset(c));
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (base + j * nt < vecs) { d[base + j * nt] = r[j]; }
  }
}

// One small kernel per copy form (kernels.hpp, copy_form): no run-time dispatch on V or on the alignment.
template <int V>
__global__ void copy_entry_publish_v(copy_args a) { copy_entry_publish_body(a, vec_copy<V>{}); }
__global__ void copy_entry_publish_bytes(copy_args a) { copy_entry_publish_body(a, byte_copy{}); }
template <int V>
__global__ void copy_entry_v(copy_args a) { copy_entry_body(a, vec_copy<V>{}); }
__global__ void copy_entry_bytes(copy_args a) { copy_entry_body(a, byte_copy{}); }
template <int V>
__global__ void copy_entry_once_v(copy_args a) { copy_entry_once_body<V>(a); }

/// One thread. Stream order (the kernel boundary, or grid_dependency_wait under a programmatic launch) is
/// the join: every kernel enqueued before it on the stream has completed, and its writes happen-before
/// this thread's release.
__global__ void publish_head(head_args a)
{
  grid_dependency_launch_dependents();
  grid_dependency_wait();
  if (threadIdx.x == 0 && blockIdx.x == 0) { publish_head_body(a); }
}

__global__ void commit_check(ferry::d2h::detail::commit_check_args a)
{
  grid_dependency_wait();  // launched plainly (a no-op then); every D2H kernel carries the join (tests/ptx)
  if (threadIdx.x == 0 && blockIdx.x == 0) { commit_check_body(a); }
}

}  // namespace ferry::kernels::d2h

namespace ferry::d2h::detail {

FERRY_KERNEL_HANDLE<copy_args> copy_entry_publish_kernel(FERRY_KERNEL_TAG, copy_form f)
{
  namespace k = ferry::kernels::d2h;
  switch (f) {
    case copy_form::v1: return {reinterpret_cast<const void*>(&k::copy_entry_publish_v<1>), "d2h_copy_entry_publish_v1"};
    case copy_form::v2: return {reinterpret_cast<const void*>(&k::copy_entry_publish_v<2>), "d2h_copy_entry_publish_v2"};
    case copy_form::v4: return {reinterpret_cast<const void*>(&k::copy_entry_publish_v<4>), "d2h_copy_entry_publish_v4"};
    case copy_form::v8: return {reinterpret_cast<const void*>(&k::copy_entry_publish_v<8>), "d2h_copy_entry_publish_v8"};
    case copy_form::bytes:
    case copy_form::v1_once:  // copy_entry_kernel's forms only
    case copy_form::v2_once:
    case copy_form::v4_once:
    case copy_form::v8_once: break;
  }
  return {reinterpret_cast<const void*>(&k::copy_entry_publish_bytes), "d2h_copy_entry_publish_bytes"};
}
FERRY_KERNEL_HANDLE<copy_args> copy_entry_kernel(FERRY_KERNEL_TAG, copy_form f)
{
  namespace k = ferry::kernels::d2h;
  switch (f) {
    case copy_form::v1: return {reinterpret_cast<const void*>(&k::copy_entry_v<1>), "d2h_copy_entry_v1"};
    case copy_form::v2: return {reinterpret_cast<const void*>(&k::copy_entry_v<2>), "d2h_copy_entry_v2"};
    case copy_form::v4: return {reinterpret_cast<const void*>(&k::copy_entry_v<4>), "d2h_copy_entry_v4"};
    case copy_form::v8: return {reinterpret_cast<const void*>(&k::copy_entry_v<8>), "d2h_copy_entry_v8"};
    case copy_form::v1_once: return {reinterpret_cast<const void*>(&k::copy_entry_once_v<1>), "d2h_copy_entry_once_v1"};
    case copy_form::v2_once: return {reinterpret_cast<const void*>(&k::copy_entry_once_v<2>), "d2h_copy_entry_once_v2"};
    case copy_form::v4_once: return {reinterpret_cast<const void*>(&k::copy_entry_once_v<4>), "d2h_copy_entry_once_v4"};
    case copy_form::v8_once: return {reinterpret_cast<const void*>(&k::copy_entry_once_v<8>), "d2h_copy_entry_once_v8"};
    case copy_form::bytes: break;
  }
  return {reinterpret_cast<const void*>(&k::copy_entry_bytes), "d2h_copy_entry_bytes"};
}
FERRY_KERNEL_HANDLE<head_args> publish_head_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::publish_head), "d2h_publish_head"};
}

FERRY_KERNEL_HANDLE<commit_check_args> commit_check_kernel(FERRY_KERNEL_TAG)
{
  return {reinterpret_cast<const void*>(&ferry::kernels::d2h::commit_check), "d2h_commit_check"};
}

}  // namespace ferry::d2h::detail
