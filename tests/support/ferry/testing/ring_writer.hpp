// SPDX-License-Identifier: Apache-2.0
// A user-style D2H writer kernel for the tests (begin_write / end_write entries): block 0 writes
// pattern_byte(seq, i) for i < min(bytes, ref.capacity()) at ref.data(), joins, then one thread calls
// ref.commit(bytes) only when `commit` is nonzero (a dynamic entry commits `bytes` as its actual size).
// With `commit == 0` it is the writer that forgets ring_ref::commit(), the misuse the channel's commit
// check detects (D2hFailure.MissingCommit*). Launch with one block (other blocks do nothing).
// Defined in kernels/testing/ring_writer.cu (CUDA, HIP) and tests/support/src/ring_writer_host.cpp (host);
// body in kernels/testing/detail/ring_writer.cuh; link ferry::testing. No fmt / error headers here.
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/d2h/ring_ref.hpp>

#include <cstdint>

namespace ferry::testing {

/// (ref, seq, bytes, commit)
ferry::backend::host_kernel<ferry::d2h::ring_ref, std::uint64_t, std::uint64_t, std::uint64_t>
ring_writer_kernel(ferry::backend::host_tag);
ferry::backend::cuda_kernel<ferry::d2h::ring_ref, std::uint64_t, std::uint64_t, std::uint64_t>
ring_writer_kernel(ferry::backend::cuda_tag);
ferry::backend::hip_kernel<ferry::d2h::ring_ref, std::uint64_t, std::uint64_t, std::uint64_t>
ring_writer_kernel(ferry::backend::hip_tag);

}  // namespace ferry::testing
