// SPDX-License-Identifier: Apache-2.0
// Probe kernels of the backend contract tests (and of anyone checking a new backend). Test instrumentation:
// not installed; reached through the CMake target ferry::testing.
//   probe_publish: every thread writes its share of `payload` (pattern_word(seq, i)); after the block
//                  joins, one thread store_release_system(flag, seq). A CPU thread that acquire-loads
//                  `flag == seq` must then read the whole payload.
//   probe_consume: one thread spins load_acquire_system(flag) until >= seq, the block joins, then every
//                  thread copies src -> dst (the CPU wrote src, then host_store_release(flag, seq)).
//   late_fill:     lets the next kernel on the stream be scheduled at once (griddepcontrol.launch_dependents,
//                  as a PDL-aware producer does), then after ~`delay_ns` writes pattern_word(seq, i) into
//                  dst: a consumer launched programmatically behind it sees the data only if it waits
//                  (griddepcontrol.wait) for this kernel to complete.
// One block each (the join is the block barrier). Defined in kernels/testing/probe.cu (CUDA, HIP) and
// tests/support/src/probe_host.cpp (host); bodies in kernels/testing/detail/probe.cuh.
#pragma once

#include <ferry/backend/types.hpp>

#include <cstdint>

namespace ferry::testing::probe {

using ferry::backend::cuda_kernel;
using ferry::backend::cuda_tag;
using ferry::backend::hip_kernel;
using ferry::backend::hip_tag;
using ferry::backend::host_kernel;
using ferry::backend::host_tag;

/// (payload, words, flag, seq)
host_kernel<std::uint64_t*, std::uint64_t, std::uint64_t*, std::uint64_t> publish_kernel(host_tag);
cuda_kernel<std::uint64_t*, std::uint64_t, std::uint64_t*, std::uint64_t> publish_kernel(cuda_tag);
hip_kernel<std::uint64_t*, std::uint64_t, std::uint64_t*, std::uint64_t> publish_kernel(hip_tag);

/// (flag, seq, src, dst, words)
host_kernel<const std::uint64_t*, std::uint64_t, const std::uint64_t*, std::uint64_t*, std::uint64_t>
consume_kernel(host_tag);
cuda_kernel<const std::uint64_t*, std::uint64_t, const std::uint64_t*, std::uint64_t*, std::uint64_t>
consume_kernel(cuda_tag);
hip_kernel<const std::uint64_t*, std::uint64_t, const std::uint64_t*, std::uint64_t*, std::uint64_t>
consume_kernel(hip_tag);

/// (dst, words, seq, delay_ns)
host_kernel<std::uint64_t*, std::uint64_t, std::uint64_t, std::uint64_t> late_fill_kernel(host_tag);
cuda_kernel<std::uint64_t*, std::uint64_t, std::uint64_t, std::uint64_t> late_fill_kernel(cuda_tag);
hip_kernel<std::uint64_t*, std::uint64_t, std::uint64_t, std::uint64_t> late_fill_kernel(hip_tag);

}  // namespace ferry::testing::probe
