// SPDX-License-Identifier: Apache-2.0
// Vocabulary of the D2H side: strong ids, the configuration, the counters.
// Free of fmt / error headers so device code (kernels, user kernels) may include it.
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/d2h/tuning.hpp>

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

/// A channel's configuration (fixed at construction): what its user chooses. Everything else (launch shape,
/// release placement, drain internals, platform overrides) is in `tuning` (tuning.hpp), whose defaults are
/// the fast, safe choice. Which knob matters for which workload: docs/api/d2h.md, "Configuration".
struct config {
  std::size_t ring_bytes{std::size_t{64} << 20};  ///< payload ring (device memory); multiple of 16
  std::size_t staging_bytes{0};                   ///< pinned host staging; 0 = ring_bytes
  /// K: one system-scope release per K entries (and one per forward): how soon the drain may start on a
  /// forward's entries. Deferred entries are gathered tuning::gather_batch at a time whatever K.
  std::uint32_t publish_every{16};
  full_policy on_full{full_policy::block_with_timeout};
  std::chrono::milliseconds timeout{std::chrono::seconds(5)};  ///< block_with_timeout's limit
  drain_mode drain{drain_mode::thread};
  /// Outstanding entries (reserved, not yet delivered); also the derived size ring (tuning::size_slots).
  std::uint32_t fifo_capacity{8192};
  error_policy on_error{error_policy::raise};  ///< raise, or disable capture and keep serving
  d2h::tuning tuning{};                        ///< performance knobs and platform overrides (tuning.hpp)
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
