// SPDX-License-Identifier: Apache-2.0
// A zero-copy shared-memory stream of captured entries to another process (a trainer), docs/api/sinks.md:
//
//   ferry::sink::shm_stream_config sc;
//   sc.name = "acts";                                     // /dev/shm/ferry-acts
//   ferry::sink::shm_stream stream{sc};
//   fd::channel<B> ch{cfg, b, stream, schema};  // D2H lands in the shared segment; the reader's entries typed
//   ... forwards ...
//   ch.close();      // every entry delivered
//   stream.close();  // end of stream for the reader; throws the first error kept
//
// and in the other process ferry::sink::shm_reader (shm_reader.hpp) or ferry.ShmReader (Python) attaches by
// name and reads each entry's bytes where the D2H put them, typed by the stream's hook schema (the config's, or
// its channel's: adopt_schema) where it declares the hook. The channel's staging IS the segment's staging:
// the stream holds every entry view it published until the reader released it (its release index, written
// back into the segment), so a region is reused only after the reader is done with it.
//
// One reader at a time (a second is refused: stream_busy_error). A reader that dies (its pid gone, checked
// every 10 ms) or detaches ends its session; a new reader can attach. When the reader has no room (the
// descriptor ring full, the staging held) the stream follows its policy:
//   block  the drain thread waits up to `timeout`, then keeps the entry anyway (published when the reader
//          frees a slot) and records a stall_error: nothing lost, and the channel's own backpressure (staging,
//          then the ring, then config::timeout) reaches the producer. A new reader starts at the first entry
//          its predecessor had not released.
//   drop   each forward is admitted or dropped whole at its first entry: admitted while a reader is attached
//          and lags by at most max_lag_entries descriptors and max_lag_bytes of staging; a dropped forward's
//          entries are released at once and counted. A reader that releases nothing for `timeout` while the
//          stream needs room is evicted (reader_detached_error at its next call; its entries released); the
//          forward it was reading is not continued for anyone. A new reader starts at the next entry published.
// Neither policy waits longer than `timeout` in one call. The protocol: docs/design/shm_stream.md.
//
// A d2h::staging_sink (d2h/sink.hpp): the channel's one-call constructor takes it (schema, callback, staging).
// The stream's code (its thread, the segment) is compiled into ferry::core (src/sink/shm_stream*.cpp).
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/d2h/sink.hpp>
#include <ferry/d2h/staging_memory.hpp>
#include <ferry/sink/detail/handle.hpp>
#include <ferry/sink/errors.hpp>
#include <ferry/sink/policy.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ferry::sink {

struct shm_stream_config {
  std::string name;  ///< 1..200 characters [A-Za-z0-9._-]: the segment /dev/shm/ferry-<name>
  std::uint64_t staging_bytes{std::uint64_t{64} << 20};  ///< the channel's staging, in the segment
  std::uint64_t descriptors{4096};  ///< descriptor ring capacity: entries published and not yet released (power of 2)
  queue_policy policy{queue_policy::block};
  std::chrono::milliseconds timeout{
      std::chrono::seconds(5)};  ///< the longest wait of one call; drop: a stalled reader's grace
  std::uint64_t max_lag_entries{
      0};  ///< drop: admit a forward while the reader lags by at most this (0: descriptors / 2)
  std::uint64_t max_lag_bytes{0};    ///< drop: ... and staging in use is at most this (0: staging_bytes / 2)
  std::chrono::microseconds poll_interval{
      100};  ///< the stream thread's period while the reader holds entries (else 1 ms)
  d2h::hook_schema
      schema;  ///< what each hook's bytes are, for the reader (written into the segment); empty: adopt_schema()
  std::uint64_t schema_bytes{
      256 << 10};  ///< the segment's room for a schema adopted later (a config schema: at least its size)
  /// The segment's record region: each forward's attribution (forward_meta: tag, requests, user bytes) for the
  /// reader, held until the reader released the forward's entries; rounded up to pages, at least one. A forward
  /// whose record is larger is published without it (attribution_overflows; the reader's accessors throw
  /// attribution_overflow_error); one that does not fit now waits for room as an entry waits for a descriptor.
  std::uint64_t record_bytes{1 << 20};
};

/// A snapshot of the stream's counters (monotonic but for the "now" ones).
struct shm_stream_stats {
  std::uint64_t entries_published{0};  ///< descriptors published (entries without bytes included)
  std::uint64_t bytes_published{0};    ///< payload bytes of the published entries
  std::uint64_t entries_released{0};   ///< published entries the reader released
  std::uint64_t stalls{0};             ///< entries that found no room (block: waited; drop: an admitted forward waited)
  std::uint64_t stall_timeouts{0};     ///< of those, waits that reached the timeout
  std::uint64_t dropped_forwards{0};   ///< drop: forwards not admitted
  std::uint64_t truncated_forwards{0}; ///< drop: admitted forwards whose reader went away before their end
  std::uint64_t dropped_entries{0};    ///< drop: entries of dropped and truncated forwards (never published)
  std::uint64_t dropped_bytes{0};
  std::uint64_t discarded_entries{0};  ///< drop: published entries released because their reader went away
  std::uint64_t refused_entries{0};    ///< entries not published because of an error (after close, not in the staging)
  std::uint64_t unreleased_at_close{0};  ///< published or pending entries no reader released by close()
  std::uint64_t pending_entries{0};    ///< block, now: entries kept while the ring is full
  std::uint64_t reader_lag_entries{0}; ///< now: published, not released
  std::uint64_t reader_lag_bytes{0};   ///< now: their payload bytes
  std::uint64_t reader_unread{0};      ///< now: published, not yet read by the attached reader
  std::uint64_t readers_attached{0};   ///< reader sessions started
  std::uint64_t readers_left{0};       ///< sessions the reader ended (detach, close)
  std::uint64_t readers_died{0};       ///< sessions ended by the reader's death
  std::uint64_t readers_evicted{0};    ///< drop: sessions ended because the reader stalled
  std::uint64_t reader_pid{0};         ///< now: the attached reader's pid (0: none)
  std::uint64_t attribution_records{0};    ///< forward records written into the record region
  std::uint64_t attribution_overflows{0};  ///< forwards whose record exceeds record_bytes: published without it
  std::string first_error;             ///< the first error kept (empty: none)
};

/// Calls f(name, value) for each counter of `s` (the bindings' field list), in declaration order.
template <class F>
void for_each_stat(const shm_stream_stats& s, F&& f)
{
  f("entries_published", s.entries_published);
  f("bytes_published", s.bytes_published);
  f("entries_released", s.entries_released);
  f("stalls", s.stalls);
  f("stall_timeouts", s.stall_timeouts);
  f("dropped_forwards", s.dropped_forwards);
  f("truncated_forwards", s.truncated_forwards);
  f("dropped_entries", s.dropped_entries);
  f("dropped_bytes", s.dropped_bytes);
  f("discarded_entries", s.discarded_entries);
  f("refused_entries", s.refused_entries);
  f("unreleased_at_close", s.unreleased_at_close);
  f("pending_entries", s.pending_entries);
  f("reader_lag_entries", s.reader_lag_entries);
  f("reader_lag_bytes", s.reader_lag_bytes);
  f("reader_unread", s.reader_unread);
  f("readers_attached", s.readers_attached);
  f("readers_left", s.readers_left);
  f("readers_died", s.readers_died);
  f("readers_evicted", s.readers_evicted);
  f("reader_pid", s.reader_pid);
  f("attribution_records", s.attribution_records);
  f("attribution_overflows", s.attribution_overflows);
  f("first_error", s.first_error);
}

namespace detail {
class shm_stream_impl;
}

/// The producer side of a shared-memory stream (move-only handle; its calls: detail/handle.hpp, and staging()).
/// Construction creates the segment (stream_busy_error: a live producer holds the name; io_error: /dev/shm full)
/// and the stream thread. The callback publishes each entry. adopt_schema: a stream made without a schema of its
/// own takes its channel's and writes it into the segment for the reader (once; an empty one: nothing);
/// logic_error naming the stream when entries were delivered already or after close(), or when the schema does
/// not fit `schema_bytes`. close() publishes what is pending (block), marks the stream closed (the reader reads
/// to its end), waits up to `timeout` for the reader to release everything (block: also for a reader still to
/// attach; drop: only while one is attached), then releases every view and removes the name.
class shm_stream : public detail::handle<detail::shm_stream_impl, shm_stream_config, shm_stream_stats> {
 public:
  explicit shm_stream(shm_stream_config cfg);
  /// The segment's staging, registered with `b` (host_register) for the channel that feeds this stream: the
  /// channel's one-call constructor takes it (or pass it as the constructor's staging). One channel at a time:
  /// unregistered when the channel and its last view let it go, then another channel may take it (logic_error
  /// before).
  template <ferry::backend::backend B>
  [[nodiscard]] d2h::staging_memory staging(B b) const
  {
    return staging(d2h::host_registration::of(std::move(b)));
  }
  [[nodiscard]] d2h::staging_memory staging(const d2h::host_registration& r) const;
};

}  // namespace ferry::sink
