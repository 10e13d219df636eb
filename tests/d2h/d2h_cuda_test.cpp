// SPDX-License-Identifier: Apache-2.0
// The D2H typed suites on the CUDA backend (H200, FERRY_REQUIRE_GPU=1).
#include "d2h/attribution.hpp"
#include "d2h/capacity.hpp"
#include "d2h/consumer.hpp"
#include "d2h/failure.hpp"
#include "d2h/gather.hpp"
#include "d2h/gather_rows.hpp"
#include "d2h/graph.hpp"
#include "d2h/lifecycle.hpp"
#include "d2h/misuse.hpp"
#include "d2h/multi_channel.hpp"
#include "d2h/on_error.hpp"
#include "d2h/ordering.hpp"
#include "d2h/planned_rows.hpp"
#include "d2h/replay_token.hpp"
#include "d2h/reduce_rows.hpp"
#include "d2h/select_rows.hpp"

#include <ferry/backend/cuda/backend.hpp>
#include <ferry/backend/graph.hpp>

#include <cuda_runtime_api.h>

#include <vector>

namespace ferry::test {
using CudaBackends = ::testing::Types<fb::cuda_backend>;
// Instantiation prefix = suite name: ctest names the tests <Suite>.<Test><Backend> (one naming scheme).
INSTANTIATE_TYPED_TEST_SUITE_P(D2hOrdering, D2hOrdering, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hCapacity, D2hCapacity, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hGraph, D2hGraph, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hLifecycle, D2hLifecycle, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hFailure, D2hFailure, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hGather, D2hGather, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hMultiChannel, D2hMultiChannel, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hMisuse, D2hMisuse, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hReplayToken, D2hReplayToken, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hOnError, D2hOnError, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hSelectRows, D2hSelectRows, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hReduceRows, D2hReduceRows, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hAttribution, D2hAttribution, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hConsumer, D2hConsumer, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hGatherRows, D2hGatherRows, CudaBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hPlannedRows, D2hPlannedRows, CudaBackends);

/// In a stream capture, ferry's kernels are launched programmatically only behind one of the channel's own
/// kernels (channel_state::launch_programmatic): an edge from anything else (here memset nodes; in a model, its
/// kernels, which never trigger their dependents early) is a full dependency. Graph: memset, copy A, copy B,
/// memset, copy C, boundary release. Expected edges into kernels: memset -> A full, A -> B programmatic,
/// memset -> C full, C -> release programmatic. Fails when every launch is programmatic (the memset edges) and
/// when none is. Then the graph is replayed: every entry exact.
TEST(D2hCudaCapture, ProgrammaticEdgesOnlyBehindTheChannelsOwnKernels)
{
  using B = fb::cuda_backend;
  B b;
  if (b.device_count() == 0) { GTEST_SKIP() << "no CUDA device"; }
  fb::stream<B> s{b};
  constexpr std::uint64_t size = 2048;
  fb::device_buffer<B> src{3 * size, b};
  fb::device_buffer<B> scratch{256, b};
  fb::pinned_buffer<B> host{3 * size, b};
  auto* h = static_cast<std::uint8_t*>(host.data());
  for (std::uint64_t j = 0; j < 3; ++j) {
    for (std::uint64_t i = 0; i < size; ++i) { h[j * size + i] = ferry::testing::pattern_byte(j, i); }
  }
  b.memcpy_async(src.data(), host.data(), 3 * size, fb::memcpy_kind::host_to_device, s.handle());
  s.synchronize();
  d2h_checker chk;
  fd::config cfg;
  cfg.ring_bytes = 1 << 20;
  cfg.publish_every = 1024;  // no batch release inside the forward: only the boundary's
  cfg.timeout = std::chrono::seconds(10);
  fd::channel<B> ch{cfg, b, chk.callback()};
  if (!ch.programmatic_launch()) { GTEST_SKIP() << "no programmatic dependent launch (needs sm_90+)"; }
  const auto* d = static_cast<const std::byte*>(src.data());
  b.capture_begin(s.handle());
  ch.begin_forward(s);
  b.memset_async(scratch.data(), 0, 256, s.handle());
  ch.capture(fd::hook_id{1}, d, size, s);
  ch.capture(fd::hook_id{2}, d + size, size, s);
  b.memset_async(scratch.data(), 1, 256, s.handle());
  ch.capture(fd::hook_id{3}, d + 2 * size, size, s);
  const fd::forward_plan plan = ch.end_forward(s);
  cudaGraph_t g = b.capture_end(s.handle());

  std::size_t n = 0;
#if CUDART_VERSION >= 13000
  ASSERT_EQ(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  ASSERT_EQ(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n), cudaSuccess);
#else
  ASSERT_EQ(cudaGraphGetEdges_v2(g, nullptr, nullptr, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  ASSERT_EQ(cudaGraphGetEdges_v2(g, from.data(), to.data(), data.data(), &n), cudaSuccess);
#endif
  auto type_of = [](cudaGraphNode_t node) {
    cudaGraphNodeType t{};
    EXPECT_EQ(cudaGraphNodeGetType(node, &t), cudaSuccess);
    return t;
  };
  int from_memset_full = 0, from_memset_programmatic = 0, kernel_programmatic = 0, kernel_full = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (type_of(to[i]) != cudaGraphNodeTypeKernel) { continue; }
    const bool programmatic = data[i].type == cudaGraphDependencyTypeProgrammatic;
    if (type_of(from[i]) == cudaGraphNodeTypeMemset) {
      ++(programmatic ? from_memset_programmatic : from_memset_full);
    } else if (type_of(from[i]) == cudaGraphNodeTypeKernel) {
      ++(programmatic ? kernel_programmatic : kernel_full);
    }
  }
  EXPECT_EQ(from_memset_full, 2) << "copies A and C depend fully on the memset ahead of each";
  EXPECT_EQ(from_memset_programmatic, 0) << "a programmatic edge from a node that is not ferry's kernel";
  EXPECT_EQ(kernel_programmatic, 2) << "copy B behind copy A, the boundary release behind copy C";
  EXPECT_EQ(kernel_full, 0);

  cudaGraphExec_t x = b.graph_instantiate(g);
  constexpr std::uint64_t replays = 4;
  for (std::uint64_t r = 0; r < replays; ++r) {
    for (std::uint64_t j = 0; j < 3; ++j) { chk.expect(r * 3 + j, static_cast<std::uint32_t>(j + 1), size); }
    if (r > 0) {  // replay r's payloads carry the patterns of seqs 3r..3r+2
      for (std::uint64_t j = 0; j < 3; ++j) {
        for (std::uint64_t i = 0; i < size; ++i) { h[j * size + i] = ferry::testing::pattern_byte(r * 3 + j, i); }
      }
      b.memcpy_async(src.data(), host.data(), 3 * size, fb::memcpy_kind::host_to_device, s.handle());
      s.synchronize();
    }
    ch.plan(plan);
    b.graph_launch(x, s.handle());
    s.synchronize();
  }
  EXPECT_TRUE(ch.close().clean());
  b.graph_exec_destroy(x);
  b.graph_destroy(g);
  EXPECT_EQ(chk.got, replays * 3);
  EXPECT_EQ(chk.bad(), 0U) << chk.first_bad;
}

}  // namespace ferry::test
