// SPDX-License-Identifier: Apache-2.0
// Vocabulary of the D2H side: strong ids, the configuration, the counters.
// Free of fmt / error headers so device code (kernels, user kernels) may include it.
#pragma once

#include <ferry/backend/types.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ferry::d2h {

/// Which hook produced an entry (a strong type: an int is not silently a hook).
struct hook_id {
  std::uint32_t value{0};
  friend constexpr bool operator==(hook_id, hook_id) = default;
};

/// Position of an entry in the channel's publication order (0, 1, 2, ...). published_head counts entries,
/// so entry `seq` is published once published_head > seq.value.
struct entry_seq {
  std::uint64_t value{0};
  friend constexpr auto operator<=>(entry_seq, entry_seq) = default;
};

/// Where the CPU-polled published_head lives.
enum class head_memory {
  managed,        ///< managed memory, preferred location CPU, accessed by the GPU; needs concurrentManagedAccess
  pinned_mapped,  ///< pinned host memory mapped into the device (store-release / load-acquire only)
};

/// What a producer call does when the payload ring (or the size ring, or the FIFO) has no room.
enum class full_policy {
  block_with_timeout,  ///< wait for the drain to reclaim space, up to config::timeout, then timeout_error
  fail_fast,           ///< throw out_of_memory at once (the try_* calls return false instead)
};

/// What a producer call does when it fails (a backend failure, a full ring past its timeout, a misuse) or
/// the consumer callback throws (channel::recover, docs/api/d2h.md "Capture that never takes the engine down").
enum class error_policy {
  raise,    ///< the call throws its typed error (the default)
  disable,  ///< the error is kept (counters::capture_errors, channel::capture_error(), close()'s report); the
            ///< open forward is closed as abort_forward closes it (what it launched is published) and every
            ///< producer call is a cheap no-op until recover() at a forward boundary; graph replays keep
            ///< running and write nothing (their replay token is a quiet one)
};

/// Who runs the drain.
enum class drain_mode {
  thread,  ///< a thread owned by the channel
  poll,    ///< the caller drives it with channel::poll() (and producer calls drive it while they wait)
};

/// A channel's configuration (fixed at construction).
struct config {
  std::size_t ring_bytes{std::size_t{64} << 20};  ///< payload ring (device memory); multiple of 16
  std::size_t staging_bytes{0};                   ///< pinned host staging; 0 = ring_bytes
  std::uint32_t publish_every{16};                ///< K: one system-scope release per K hooks (and per forward)
  d2h::head_memory head_memory{d2h::head_memory::managed};  ///< where published_head lives
  full_policy on_full{full_policy::block_with_timeout};
  std::chrono::milliseconds timeout{std::chrono::seconds(5)};  ///< block_with_timeout's limit
  std::uint32_t size_slots{0};     ///< size ring slots (0 = no dynamic entries)
  drain_mode drain{drain_mode::thread};
  std::uint32_t fifo_capacity{8192};       ///< outstanding entries (reserved, not yet delivered)
  std::uint32_t max_copies_in_flight{64};  ///< coalesced D2H copies queued on the drain stream
  // Copy-kernel launch shape (capture()). Performance knobs only: every choice is equally correct (writers
  // are joined by a block barrier inside a one-block kernel, or by stream order before a 1-thread publish
  // kernel; never by a grid join). bench/d2h `--benchmark_filter=variants` measures the alternatives.
  //   * an entry is copied by ceil(vecs / (copy_block_threads * copy_vecs_per_thread)) blocks (at most
  //     enough to fill every SM), each thread moving copy_vecs_per_thread 16-byte vectors per pass with
  //     all its loads issued before its stores;
  //   * the entry that completes a batch of K (publish_every) is, when <= fused_copy_max_bytes, copied by
  //     ONE block with the release fused after its block barrier; otherwise a 1-thread publish kernel follows;
  //   * entries <= single_block_copy_max_bytes always use the one-block kernel (the layout before these
  //     knobs was single_block_copy_max_bytes = fused_copy_max_bytes = 32 KiB, copy_vecs_per_thread = 1).
  std::size_t fused_copy_max_bytes{32 << 10};       ///< batch-completing entries up to this size: one block, fused release
  std::size_t single_block_copy_max_bytes{0};       ///< every entry up to this size: one block
  std::uint32_t copy_block_threads{128};            ///< threads per block of the multi-block copy (32..1024, multiple of 32)
  std::uint32_t copy_vecs_per_thread{2};            ///< 16-byte vectors per thread per pass: 1, 2, 4 or 8
  /// An entry that its grid copies in one pass, of a static size that is a multiple of 16 from a 16-byte
  /// aligned source, uses a lean kernel (no pass loop, no byte tail, no size load); false: the general one.
  bool lean_copy_kernel{true};
  /// Launch ferry's copy and publish kernels as programmatic dependent launches where the device and the
  /// loaded code support it (CUDA, sm_90+): a kernel is scheduled while the one ahead of it on the stream
  /// still runs and waits in griddepcontrol.wait for its completion (the same join as stream order; see
  /// backend/grid_dependency.hpp), which hides most of the launch gap between back-to-back hooks. Inside a
  /// stream capture only where the kernel ahead is one of the channel's own (the capture's dependency node,
  /// read at each launch): behind a kernel that never triggers its dependents early (a model's) a programmatic
  /// edge only adds latency. A performance knob only. A user kernel launched
  /// programmatically right after one of ferry's kernels must itself wait (cudaGridDependencySynchronize)
  /// before reading what came earlier, as PDL requires.
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
  /// system-scope release), which keeps the release and the block join off the producer stream's path. A
  /// performance knob only.
  bool gather_branch_publish{true};
  /// Bounce capture (0: off): capture() of a static entry up to this many bytes copies the source
  /// at once into a channel-owned device bounce slot (the backend's device-to-device copy: a memcpy node in a
  /// graph) and joins the deferred batch with that slot as its source, so the batch's ONE gather moves it into
  /// the ring. The source may change right after capture() returns (stream order), as with the copy kernel; the
  /// entry is placed, counted and published with its batch. Bounce slots: the batch limit x this size, rounded up
  /// to 16 bytes, of device memory. Off by default: it pays where the forward has many hooks and no mid-forward
  /// release (publish_every above the hook count), as one gather replaces a copy kernel per hook.
  std::size_t bounce_capture_max_bytes{0};
  std::chrono::microseconds drain_idle_sleep{20};  ///< drain thread sleep when idle
  error_policy on_error{error_policy::raise};      ///< raise, or disable capture and keep serving
};

/// A channel's open forward (channel::open_forward): its stream and whether it is being captured.
template <class B>
struct open_forward_state {
  typename B::stream_type stream{};
  bool capturing{false};
};

/// Monotonic counters, readable at any time from any thread (a snapshot).
struct counters {
  std::uint64_t entries_reserved{0};   ///< entries placed by the producer
  std::uint64_t entries_published{0};  ///< highest published_head the drain acquired
  std::uint64_t entries_drained{0};    ///< entries whose D2H completed (delivered to the consumer)
  std::uint64_t bytes_drained{0};      ///< payload bytes of the entries delivered (size() of each ok entry)
  std::uint64_t bytes_copied{0};       ///< bytes the coalesced D2H copies moved (payloads and the padding between them)
  std::uint64_t copies{0};             ///< coalesced D2H copies issued
  std::uint64_t stalls{0};             ///< producer calls that found the ring / FIFO / size ring full
  std::uint64_t high_watermark{0};     ///< most ring bytes in use at once
  std::uint64_t size_overflows{0};     ///< dynamic entries whose actual size exceeded the reservation
  std::uint64_t callback_errors{0};    ///< exceptions thrown by the consumer callback (caught)
  /// Release operations of published_head the CPU enqueued or captured (fused or kernels). A release captured
  /// into a graph counts once, when it is captured; replays do not add to it (the GPU runs them unseen).
  std::uint64_t publishes{0};
  /// Errors that disabled capture (config::on_error = disable): failed producer calls and consumer callback
  /// exceptions, each counted once per disabling (calls while disabled are no-ops, not errors).
  std::uint64_t capture_errors{0};
  std::uint64_t selection_errors{0};  ///< row-selected entries whose selection the kernel refused (capture_rows)
};

}  // namespace ferry::d2h
