// SPDX-License-Identifier: Apache-2.0
// Typed errors of ferry's sinks (sink/safetensors.hpp): a failed file operation (io_error, with the path and
// the errno), a directory that already holds another run (existing_run_error), and a drain thread that waited
// for the writer past its limit (stall_error). Schema mismatches are d2h::entry_shape_error (hook_schema.hpp).
#pragma once

#include <ferry/error.hpp>

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

}  // namespace ferry::sink

/// Throws `error_type(msg, path, code)` (an io_error) for the errno `code`, with the message
///   "ferry: <formatted>: got errno <code> (<text>) [file:line]".
#define FERRY_FAIL_IO(error_type, path, code, ...)                                                              \
  throw error_type(::ferry::detail::format("ferry: {}: got errno {} ({}) [{}:{}]", ::ferry::detail::format(__VA_ARGS__), \
                                           (code), std::generic_category().message(code), __FILE__, __LINE__),   \
                   (path), (code))
