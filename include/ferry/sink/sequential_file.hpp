// SPDX-License-Identifier: Apache-2.0
// sink::sequential_file: a file written front to back through the safetensors sink's writer (src/sink's
// write_pipeline and data_stream: page-aligned buffers filled on the caller's thread, I/O threads writing full ones,
// O_DIRECT where the filesystem allows it when durable), so that a writer of another format (ferry.arrow's shards,
// ferry.engine's Arrow samples: pyarrow's IPC stream into a Python file object) writes at the medium's rate as the
// safetensors shards do. A thin handle over detail::sequential_file_impl (src/sink/sequential_file.cpp).
//   sequential_file f{path, durable};   creates (or truncates) path
//   f.write(bytes);                     appends (copied before it returns); the first io_error of a write in flight
//                                       is thrown by the next write() or close()
//   f.close();                          every byte in the file (fsync when durable); the size is size()
//   f.times();                          where write() spent its time: copying, waiting for a buffer
//   file_writer w{tuning};              the buffers and I/O threads (write_tuning: every value equally correct),
//   sequential_file g{path, durable, w};  shared by the files given it: a run's files (ferry.arrow's shards) reuse
//                                       warm buffers and threads
// The destructor of a file not closed waits for its writes in flight and drops their errors: the caller removes a
// file it gave up.
#pragma once

#include <ferry/sink/errors.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>

namespace ferry::sink {

namespace detail {
struct sequential_file_impl;
struct file_writer_state;
}  // namespace detail

/// Where a sequential_file's write() calls spent their time: copying into the writer's buffers, and waiting for a
/// buffer the I/O threads had not given back yet (the medium is then the limit).
struct sequential_file_times {
  double copy_seconds{0};
  double wait_seconds{0};
};

/// Tuning of a file_writer (never what is written): `write_buffers` page-aligned buffers of `write_bytes` (256 MiB
/// by default, allocated on first use), filled on the caller's thread, and `io_threads` writing full ones at once:
/// the more bytes in flight, the closer a disk queue comes to its sequential rate (more than the safetensors
/// sink's 2 x 16 MiB of 6 buffers: the Arrow shards' measurements are in docs/perf/journal.md). The ranges are the
/// safetensors sink's (write_pipeline::check_shape); sequential_file_times tells which side is the limit, and
/// bench/torch/arrow_writer_ab.py measures the choices against the medium.
struct write_tuning {
  std::size_t io_threads{2};                       ///< [1, 64]
  std::size_t write_buffers{4};                    ///< (io_threads, 256]
  std::size_t write_bytes{std::size_t{64} << 20};  ///< [4 KiB, 1 GiB], rounded up to 4 KiB
};

/// The page-aligned buffers (allocated on first use) and the I/O threads that sequential_files write through
/// (write_tuning). A file made without one has its own, of the default tuning; the files of a run given one writer
/// (ferry.arrow's shards) reuse its buffers and threads, already warm, and one file may be closed on another thread
/// while the next is written. The first write error of any of its files ends the writer: every later write() or
/// close() of its files throws it (a run of shards ends there). At most write_buffers - 1 of its files are open at
/// once (each may hold a buffer it fills): one more is a logic_error, nothing created. Copies share its state: it
/// lives while a copy or one of its files does.
class file_writer {
 public:
  /// logic_error when a tuning value is out of its range (write_tuning), nothing started.
  explicit file_writer(const write_tuning& tuning = {});
  /// Where its files' write() calls spent their time, over all of them.
  [[nodiscard]] sequential_file_times times() const noexcept;
  /// How many of its files may be open at once: write_buffers - 1.
  [[nodiscard]] std::size_t max_open() const noexcept;

 private:
  friend class sequential_file;
  std::shared_ptr<detail::file_writer_state> w_;
};

class sequential_file {
 public:
  /// Creates (or truncates) `path` (io_error when it cannot); `durable`: O_DIRECT writes where the filesystem allows,
  /// and close() syncs the file. Written through a file_writer of its own.
  explicit sequential_file(const std::filesystem::path& path, bool durable = false);
  /// The same, written through `writer` (its buffers and threads, shared with its other files); logic_error when
  /// write_buffers - 1 of its files are open (not closed, not destroyed).
  sequential_file(const std::filesystem::path& path, bool durable, const file_writer& writer);
  ~sequential_file();
  sequential_file(sequential_file&&) noexcept;
  sequential_file& operator=(sequential_file&&) noexcept;
  sequential_file(const sequential_file&) = delete;
  sequential_file& operator=(const sequential_file&) = delete;

  /// Appends `bytes` (copied before it returns). io_error: a write of this file failed (the file is then
  /// incomplete); logic_error: the file is closed.
  void write(std::span<const std::byte> bytes);
  /// Every byte written is in the file, synced when durable; a second close() does nothing. io_error as write().
  void close();
  [[nodiscard]] std::uint64_t size() const noexcept;  ///< bytes written so far
  [[nodiscard]] bool closed() const noexcept;
  [[nodiscard]] const std::filesystem::path& path() const noexcept;
  /// Its writer's times(): with a shared file_writer, over every file of that writer.
  [[nodiscard]] sequential_file_times times() const noexcept;

 private:
  std::unique_ptr<detail::sequential_file_impl> impl_;
};

}  // namespace ferry::sink
