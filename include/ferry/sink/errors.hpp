// SPDX-License-Identifier: Apache-2.0
// Typed errors of ferry's sinks (sink/safetensors.hpp): a failed file operation (io_error, with the path and
// the errno), a directory that already holds another run (existing_run_error), and a drain thread that waited
// for the writer past its limit (stall_error). Schema mismatches are d2h::entry_shape_error (hook_schema.hpp).
// The shared-memory stream (shm_stream.hpp, shm_reader.hpp): a stream or its reader slot already taken
// (stream_busy_error), a reader of another layout version (layout_version_error), a reader whose session the
// producer ended (reader_detached_error), a producer that died (producer_gone_error), an entry whose forward's
// attribution did not fit the stream's record region (attribution_overflow_error).
#pragma once

#include <ferry/error.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

namespace ferry::sink {

/// A file operation of a sink failed: creating the run directory, writing a shard (ENOSPC, EIO, ...),
/// renaming it, writing the index. `code()` is the errno, `path()` the file or directory.
class io_error : public ferry::error {
 public:
  io_error(const std::string& msg, std::filesystem::path path, int code)
    : error(msg), path_{std::move(path)}, code_{code}
  {
  }
  [[nodiscard]] int code() const noexcept { return code_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  int code_;
};

/// The run directory already holds another run's files (index.json, shards, temporaries) and the sink was
/// not told to overwrite them. `code()` is EEXIST.
class existing_run_error : public io_error {
 public:
  using io_error::io_error;
};

/// The drain thread waited for queue space longer than the sink's block timeout (policy block). Nothing was
/// lost: the entry was queued past the limit once the wait gave up.
class stall_error : public ferry::timeout_error {
 public:
  using timeout_error::timeout_error;
};

/// A shared-memory stream is taken: a second reader attaching while a live one is attached, or a producer
/// creating a stream whose name a live producer holds. `owner_pid()` is the process holding it.
class stream_busy_error : public ferry::error {
 public:
  stream_busy_error(const std::string& msg, long owner_pid) : error(msg), pid_{owner_pid} {}
  [[nodiscard]] long owner_pid() const noexcept { return pid_; }

 private:
  long pid_;
};

/// A reader built for one layout version of the shared-memory stream found a segment of another.
class layout_version_error : public ferry::error {
 public:
  layout_version_error(const std::string& msg, std::uint64_t expected, std::uint64_t got)
    : error(msg), expected_{expected}, got_{got}
  {
  }
  [[nodiscard]] std::uint64_t expected() const noexcept { return expected_; }  ///< the reader's version
  [[nodiscard]] std::uint64_t got() const noexcept { return got_; }            ///< the segment's version

 private:
  std::uint64_t expected_;
  std::uint64_t got_;
};

/// The producer ended this reader's session (policy drop: the reader held entries without releasing any for
/// longer than the stream's timeout while the stream needed the room). The reader may attach again.
class reader_detached_error : public ferry::error {
 public:
  using error::error;
};

/// The stream's producer process died without closing the stream (or the segment is a dead producer's).
/// Entries it published before are still read; this is raised once none is left.
class producer_gone_error : public ferry::error {
 public:
  using error::error;
};

/// A shared-memory stream entry whose forward's attribution (forward_meta: requests, user bytes, tag) needed a
/// record larger than the stream's whole record region (shm_stream_config::record_bytes): the producer published
/// the entry without it and counted the forward (attribution_overflows). Raised by the reader's attribution
/// accessors (shm_entry::meta(), requests(), user(), rows_of()); the entry's bytes are intact.
class attribution_overflow_error : public ferry::error {
 public:
  attribution_overflow_error(const std::string& msg, std::uint64_t record_bytes, std::uint64_t capacity)
    : error(msg), record_bytes_{record_bytes}, capacity_{capacity}
  {
  }
  [[nodiscard]] std::uint64_t record_bytes() const noexcept { return record_bytes_; }  ///< the record it needed
  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }          ///< the region's bytes

 private:
  std::uint64_t record_bytes_;
  std::uint64_t capacity_;
};

}  // namespace ferry::sink

/// Throws `error_type(msg, path, code)` (an io_error) for the errno `code`, with the message
///   "ferry: <formatted>: got errno <code> (<text>) [file:line]".
#define FERRY_FAIL_IO(error_type, path, code, ...)                                                                  \
  throw error_type(                                                                                                 \
      ::ferry::detail::format("ferry: {}: got errno {} ({}) [{}:{}]", ::ferry::detail::format(__VA_ARGS__), (code), \
                              std::generic_category().message(code), __FILE__, __LINE__),                           \
      (path), (code))
