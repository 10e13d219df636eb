// SPDX-License-Identifier: Apache-2.0
// A D2H consumer that writes captured tensors to disk as safetensors shards with a Hugging Face style index,
// on its own writer thread (docs/api/sinks.md):
//
//   ferry::sink::safetensors_config sc;
//   sc.directory = "/data/run7";
//   sc.schema.add(fd::hook_id{0}, "layers.0.resid_pre", fd::dtype::bf16, {1024});
//   ferry::sink::safetensors sink{sc};
//   fd::channel<B> ch{cfg, b, sink};              // the drain thread hands each entry_view to the sink
//   ... forwards ...
//   ch.close();                                   // every entry delivered
//   sink.close();                                 // the last shard and index.json (complete); throws its first error
//
// Layout of `directory`: shard-00000.safetensors, shard-00001.safetensors, ... and index.json
// ({"metadata": {...}, "weight_map": {tensor: file}}). Tensor names: "{tag}/{hook name}" (tag: the entry's
// forward tag, entry_view::tag(); a hook's k-th repeat inside one forward, k >= 1: "{tag}/{hook name}#{k}").
// A tensor is [rows, *row_shape] of its hook (hook_schema.hpp).
//
// Forwards: the entries of a forward are consecutive in delivery order; a forward is complete when an entry
// of the next forward arrives, or at flush() / close(). A shard holds whole forwards only, and at most
// shard_bytes of tensor data unless one forward alone is larger (it then gets a shard of its own). Each
// shard is written under a temporary name (.shard-NNNNN.safetensors.tmp) and renamed when complete; then
// index.json is rewritten (temporary name, rename): what the directory's index names is, at any time, a set
// of complete shards.
//
// Memory: the writer queue holds at most max_queue_bytes of entries. Policy `block` queues the entry views
// themselves (zero-copy: a view holds channel staging, so a slow disk slows the drain and, through the ring,
// the producer); when the queue is full the drain thread waits up to block_timeout, then queues the entry
// anyway and records a stall_error (nothing lost). Policy `drop` queues a copy of each admitted entry (its
// staging goes back at once: a slow disk never holds the channel back) and drops the whole forward when the
// queue is full (what the writer already wrote of it is rolled back), counting it. Entries that are not ok
// (size_overflow, selection_error) are counted, not written.
//
// Errors: a failed file operation (ENOSPC mid-shard, EIO) ends the run: that shard is not published (the shards
// sealed before it still are, where their writes succeeded), the error is kept, and every later entry is refused
// and counted. An entry that does not fit the schema, a
// forward that repeats a tag, or an entry of a forward that flush() completed, is refused and counted (the
// first such error is kept). close() throws the first error kept; stats().first_error names it.
//
// A d2h::sink (d2h/sink.hpp): the channel's one-call constructor takes it. The sink's code (its threads, the
// shard files, O_DIRECT, CRC-32) is compiled into ferry::core (src/sink/safetensors*.cpp).
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/sink/detail/handle.hpp>
#include <ferry/sink/errors.hpp>
#include <ferry/sink/policy.hpp>  // queue_policy: what the drain thread does when the writer queue is full

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace ferry::sink {

/// Tuning of a safetensors sink's writes (safetensors_config::tuning): every value is equally correct. The writer
/// copies entries (and their CRC-32) into `write_buffers` page-aligned buffers of `write_bytes`; `io_threads`
/// write full buffers at once (a disk queue serves several faster than one; a file on tmpfs takes one at a time).
/// safetensors_stats' writer_*_seconds tell which side is the limit; bench/sink (`--io-threads`, `--write-mib`,
/// `--write-buffers`) measures the choices.
struct safetensors_tuning {
  std::size_t io_threads{2};
  std::size_t write_buffers{6};
  std::size_t write_bytes{std::size_t{16} << 20};
  /// Entries of at least this many bytes are written from their staging (kept until written, not copied into the
  /// write buffers) where the shard takes unaligned writes: buffered files (no fsync, direct_io off, or a
  /// filesystem without O_DIRECT, such as tmpfs). 0: every entry is copied.
  std::size_t lend_min_bytes{std::size_t{256} << 10};
  /// Shard files written at once, the forwards dealt to them in turn (each shard holds whole forwards; readers
  /// merge them back in forward order: index.json's "order"). 0: two where a file takes one write at a time (tmpfs,
  /// whose files written at once scale), else one.
  std::size_t open_shards{0};
};

struct safetensors_config {
  std::filesystem::path directory;   ///< created if missing; another run's files refused unless overwrite
  d2h::hook_schema schema;           ///< every written hook (another hook's entry is refused); empty: adopt_schema()
  std::uint64_t shard_bytes{std::uint64_t{1} << 30};     ///< tensor data per shard, at most (whole forwards)
  std::uint64_t max_queue_bytes{std::uint64_t{64} << 20};  ///< entry bytes queued for the writer, at most
  queue_policy policy{queue_policy::block};
  std::chrono::milliseconds block_timeout{std::chrono::seconds(5)};  ///< policy block: the drain's wait, at most
  bool fsync{false};      ///< fsync each shard and index.json before its rename, and the directory after it
  bool overwrite{false};  ///< remove another run's files (index.json, shard-*.safetensors, temporaries) first
  /// With fsync: tensor data written with O_DIRECT where the filesystem takes it (the disk's sequential rate,
  /// the page cache left to the engine); buffered otherwise. Either way I/O threads write while the writer
  /// copies the next entries (and their CRC-32).
  bool direct_io{true};
  safetensors_tuning tuning{};  ///< the writes' size, buffers and threads (never what is written)
};

/// A snapshot of the sink's counters (monotonic but for the queue's).
struct safetensors_stats {
  std::uint64_t queue_entries{0};         ///< entries queued for the writer now
  std::uint64_t queue_bytes{0};           ///< their bytes now
  std::uint64_t queue_high_watermark{0};  ///< most bytes queued at once
  double writer_lag_seconds{0.0};         ///< how long the oldest queued entry has waited (0: none queued)
  std::uint64_t forwards_written{0};      ///< forwards in published shards
  std::uint64_t tensors_written{0};
  std::uint64_t bytes_written{0};         ///< tensor data bytes in published shards
  std::uint64_t shards_written{0};
  std::uint64_t stalls{0};                ///< policy block: entries the drain thread waited for
  std::uint64_t stall_timeouts{0};        ///< of those, waits that reached block_timeout
  std::uint64_t dropped_forwards{0};      ///< policy drop
  std::uint64_t dropped_entries{0};
  std::uint64_t dropped_bytes{0};
  std::uint64_t failed_entries{0};        ///< entries delivered not ok (size_overflow, selection_error)
  std::uint64_t refused_entries{0};       ///< entries not written because of an error (schema, tag, failure, closed)
  std::uint64_t lost_forwards{0};         ///< forwards accepted but never published (the shard a failure ended)
  std::uint64_t relocations{0};  ///< data copied inside the writer (a header guess, a forward moved to the next shard)
  std::uint64_t lent_entries{0};  ///< entries written from their staging, not copied (tuning.lend_min_bytes)
  std::uint64_t open_shards{0};   ///< shard files written at once (tuning.open_shards; 0 resolved for the directory)
  double writer_copy_seconds{0.0};  ///< the writer copying entries into write buffers (with their CRC-32)
  double writer_wait_seconds{0.0};  ///< the writer waiting for a buffer the I/O threads still write (medium-bound)
  double writer_idle_seconds{0.0};  ///< the writer waiting for an entry (it keeps up)
  double writer_publish_seconds{0.0};  ///< the writer rolling shards over (sealing, hand-over; see sinks.md)
  bool failed{false};                     ///< a file operation failed: the run ended
  std::string first_error;                ///< the first error kept (empty: none)
};

/// Calls f(name, value) for each counter of `s` (the bindings' field list), in declaration order.
template <class F>
void for_each_stat(const safetensors_stats& s, F&& f)
{
  f("queue_entries", s.queue_entries);
  f("queue_bytes", s.queue_bytes);
  f("queue_high_watermark", s.queue_high_watermark);
  f("writer_lag_seconds", s.writer_lag_seconds);
  f("forwards_written", s.forwards_written);
  f("tensors_written", s.tensors_written);
  f("bytes_written", s.bytes_written);
  f("shards_written", s.shards_written);
  f("stalls", s.stalls);
  f("stall_timeouts", s.stall_timeouts);
  f("dropped_forwards", s.dropped_forwards);
  f("dropped_entries", s.dropped_entries);
  f("dropped_bytes", s.dropped_bytes);
  f("failed_entries", s.failed_entries);
  f("refused_entries", s.refused_entries);
  f("lost_forwards", s.lost_forwards);
  f("relocations", s.relocations);
  f("lent_entries", s.lent_entries);
  f("open_shards", s.open_shards);
  f("writer_copy_seconds", s.writer_copy_seconds);
  f("writer_wait_seconds", s.writer_wait_seconds);
  f("writer_idle_seconds", s.writer_idle_seconds);
  f("writer_publish_seconds", s.writer_publish_seconds);
  f("failed", s.failed);
  f("first_error", s.first_error);
}

namespace detail {
class safetensors_impl;
}
}  // namespace ferry::sink
namespace ferry::testing {
struct sink_access;  // tests/support/ferry/testing/sink_access.hpp (not installed): the sink's test hook
}  // namespace ferry::testing
namespace ferry::sink {

/// The safetensors shard sink (move-only handle; its calls: detail/handle.hpp, and flush()). Construction prepares
/// the directory and writes an empty index (io_error, existing_run_error, schema_error via the config); a writer
/// thread runs until close(), which completes the open forward, publishes the last shard, writes index.json
/// marked complete and stops the writer. A sink without a schema takes its channel's (adopt_schema: index.json
/// rewritten with it; logic_error naming the directory when neither has one, or when entries were delivered
/// already); entries reaching it without one are refused.
class safetensors : public detail::handle<detail::safetensors_impl, safetensors_config, safetensors_stats> {
 public:
  explicit safetensors(safetensors_config cfg);
  /// Completes the open forward and publishes the shard being written (even below shard_bytes) with the index;
  /// returns once done. Call it between forwards (an entry of the completed forward arriving later is
  /// refused). Throws the first error kept.
  void flush();

 private:
  friend struct ferry::testing::sink_access;
};

}  // namespace ferry::sink
