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
}

/// Where a sequential_file's write() calls spent their time: copying into the writer's buffers, and waiting for a
/// buffer the I/O threads had not given back yet (the medium is then the limit).
struct sequential_file_times {
  double copy_seconds{0};
  double wait_seconds{0};
};

class sequential_file {
 public:
  /// Creates (or truncates) `path` (io_error when it cannot); `durable`: O_DIRECT writes where the filesystem allows,
  /// and close() syncs the file.
  explicit sequential_file(const std::filesystem::path& path, bool durable = false);
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
  [[nodiscard]] sequential_file_times times() const noexcept;

 private:
  std::unique_ptr<detail::sequential_file_impl> impl_;
};

}  // namespace ferry::sink
