// SPDX-License-Identifier: Apache-2.0
// d2h::tuning: the knobs a channel's user does not choose (config::tuning). Every value is equally correct;
// they trade launch shape, release placement and drain internals for speed, or override what the platform
// decides (head_memory) or what the channel derives (size_slots), for tests and benchmarks. The defaults are
// the fast, safe choice measured by bench/d2h (`--benchmark_filter=variants`) and bench/torch. Like types.hpp,
// free of fmt / error headers so device code may include it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ferry::d2h {

/// Where the CPU-polled published_head (and the size ring of dynamic entries) lives.
enum class head_memory {
  platform,       ///< chosen at construction: managed where the device has concurrentManagedAccess, else pinned_mapped
  managed,        ///< managed memory, preferred location CPU, accessed by the GPU; needs concurrentManagedAccess
  pinned_mapped,  ///< pinned host memory mapped into the device (store-release / load-acquire only)
};

/// Tuning of a channel (config::tuning), fixed at construction. Nothing here changes what is delivered.
struct tuning {
  /// Override of the platform's choice (tests, benchmarks); `platform`: managed with concurrentManagedAccess,
  /// pinned_mapped without it. An explicit `managed` on a device without it is refused at construction.
  d2h::head_memory head_memory{d2h::head_memory::platform};
  /// Size ring slots (one 8-byte actual size per outstanding dynamic entry: capture_rows, capture_rows_deferred,
  /// capture_dynamic, begin_write(dynamic)). 0 (the default): derived, one slot per FIFO slot
  /// (config::fifo_capacity), so the size ring is never what a dynamic entry waits for. N > 0: exactly N slots,
  /// at most 2^30 (fewer slots than outstanding dynamic entries makes their producer calls wait, as a full ring
  /// does; tests of slot reuse).
  std::uint32_t size_slots{0};
  /// Entries per gather (deferred capture, bounce capture): a recorded batch is copied by ONE gather launch when
  /// it holds this many entries (at most 128, the gather's descriptor table, and at most config::fifo_capacity),
  /// or earlier at a flush point (end_forward, flush(), an immediate capture). Apart from publish_every: a gather
  /// releases published_head when the entries since the last release reach publish_every (one release for
  /// several batches of K, or none for a partial one; docs/design/d2h.md, "Gather publication"), so the release
  /// cadence does not multiply the gathers. 128: a vllm-full forward (341 hooks) is 3 gathers whatever K.
  std::uint32_t gather_batch{128};
  std::uint32_t max_copies_in_flight{64};  ///< coalesced D2H copies queued on the drain stream (>= 1)
  // Copy-kernel launch shape (capture()). Every choice is equally correct (writers are joined by a block
  // barrier inside a one-block kernel, or by stream order before a 1-thread publish kernel; never by a grid
  // join). bench/d2h `--benchmark_filter=variants` measures the alternatives.
  //   * an entry is copied by ceil(vecs / (copy_block_threads * copy_vecs_per_thread)) blocks (at most
  //     enough to fill every SM), each thread moving copy_vecs_per_thread 16-byte vectors per pass with
  //     all its loads issued before its stores;
  //   * the entry that completes a batch of K (publish_every) is, when <= fused_copy_max_bytes, copied by
  //     ONE block with the release fused after its block barrier; otherwise a 1-thread publish kernel follows;
  //   * entries <= single_block_copy_max_bytes always use the one-block kernel (the layout before these
  //     knobs was single_block_copy_max_bytes = fused_copy_max_bytes = 32 KiB, copy_vecs_per_thread = 1).
  std::size_t fused_copy_max_bytes{32 << 10};  ///< batch-completing entries up to this size: one block, fused release
  std::size_t single_block_copy_max_bytes{0};  ///< every entry up to this size: one block
  std::uint32_t copy_block_threads{128};       ///< threads per block of the multi-block copy (32..1024, multiple of 32)
  std::uint32_t copy_vecs_per_thread{2};       ///< 16-byte vectors per thread per pass: 1, 2, 4 or 8
  /// An entry that its grid copies in one pass, of a static size that is a multiple of 16 from a 16-byte
  /// aligned source, uses a lean kernel (no pass loop, no byte tail, no size load); false: the general one.
  bool lean_copy_kernel{true};
  /// Launch ferry's copy and publish kernels as programmatic dependent launches where the device and the
  /// loaded code support it (CUDA, sm_90+): a kernel is scheduled while the one ahead of it on the stream
  /// still runs and waits in griddepcontrol.wait for its completion (the same join as stream order; see
  /// backend/grid_dependency.hpp), which hides most of the launch gap between back-to-back hooks. Inside a
  /// stream capture only where the kernel ahead is one of the channel's own (the capture's dependency node,
  /// read at each launch): behind a kernel that never triggers its dependents early (a model's) a programmatic
  /// edge only adds latency. A user kernel launched programmatically right after one of ferry's kernels must
  /// itself wait (cudaGridDependencySynchronize) before reading what came earlier, as PDL requires.
  bool programmatic_launch{true};
  /// Issue the batch releases (every K hooks) on a branch: a channel-owned stream forked from the producer
  /// stream by an event recorded after the batch's last writer, so the copies after it do not wait for the
  /// release (in a captured graph the fork and join are graph edges). The forward-boundary release, and any
  /// release the producer stream issues itself, first joins the branch back (one event wait), so releases
  /// stay ordered and published_head stays monotonic. With it, no copy kernel fuses a release (the
  /// fused_copy_max_bytes knob applies only when this is off).
  bool branch_publish{true};
  /// With branch_publish: a gather (deferred capture) that completes a batch of K releases it on the branch
  /// as well (the 1-thread publish kernel behind a fork event recorded after the gather: the kernel boundary
  /// joins the gather's blocks), instead of in its own last block (block barrier, acq_rel join counter,
  /// system-scope release), which keeps the release and the block join off the producer stream's path.
  bool gather_branch_publish{true};
  /// Bounce capture (0: off): capture() of a static entry up to this many bytes copies the source
  /// at once into a channel-owned device bounce slot (the backend's device-to-device copy: a memcpy node in a
  /// graph) and joins the deferred batch with that slot as its source, so the batch's ONE gather moves it into
  /// the ring. The source may change right after capture() returns (stream order), as with the copy kernel; the
  /// entry is placed, counted and published with its batch. Bounce slots: the gather batch limit x this size,
  /// rounded up to 16 bytes, of device memory. Off by default: it pays where the forward has many hooks and no
  /// mid-forward release (publish_every above the hook count), as one gather replaces a copy kernel per hook.
  std::size_t bounce_capture_max_bytes{0};
  std::chrono::microseconds drain_idle_sleep{20};  ///< drain thread sleep when idle
};

}  // namespace ferry::d2h
