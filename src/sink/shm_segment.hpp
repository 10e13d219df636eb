// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's segment (layout: shm_layout.hpp): created by the producer (shm_open O_EXCL, the
// size reserved with posix_fallocate so a full /dev/shm is an io_error, not a SIGBUS later; a stale segment of a
// dead producer is replaced, a live producer's refused), opened by a reader (waiting for it to appear, version
// and sizes checked). The producer maps it whole, read-write; a reader maps the header, the descriptors, the
// schema and the record regions read-write and the staging read-only. The schema region is written once: at
// creation (before the magic) or by publish_schema (before its word's store-release); the record region by the
// producer's record_ring (shm_records.hpp). Unmapped by the destructor; the name is removed by unlink().
// Definitions: shm_segment.cpp.
#pragma once

#include <ferry/sink/detail/shm_layout.hpp>
#include <ferry/sink/errors.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <sys/mman.h>

namespace ferry::sink::detail::shm {

/// Whether `name` is a valid stream name: 1..200 characters of [A-Za-z0-9._-], not starting with '.'.
[[nodiscard]] bool valid_name(const std::string& name) noexcept;
/// A process's start time (field 22 of /proc/<pid>/stat, clock ticks since boot), 0 when unknown; `zombie`
/// is set for a process that ended but was not reaped. Tells a live process from a recycled pid.
[[nodiscard]] std::uint64_t start_time(long pid, bool* zombie = nullptr) noexcept;
/// Whether process `pid` (started at `started`, 0: unknown) is alive: it exists, is no zombie, and, when its
/// start time is known, is the same process (not a recycled pid). Producer and reader share a pid namespace.
[[nodiscard]] bool alive(long pid, std::uint64_t started) noexcept;

class segment {
 public:
  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;
  ~segment();

  /// Producer: a new stream `name` with `capacity` descriptors (a power of two), a schema region of
  /// `schema_capacity` bytes (at least `schema`'s, rounded up to pages) holding `schema` (the encoded region;
  /// empty: none yet), a record region of `record_capacity` bytes (rounded up to pages) and `staging_bytes` of
  /// staging.
  static std::shared_ptr<segment> create(const std::string& name, std::uint64_t capacity, std::uint64_t staging_bytes,
                                         std::uint64_t schema_capacity, std::span<const std::byte> schema,
                                         std::uint64_t record_capacity);

  /// Reader: stream `name`, waiting up to `timeout` for it to exist and be initialized.
  static std::shared_ptr<segment> open(const std::string& name, std::chrono::milliseconds timeout);

  /// Producer, S0 for a schema adopted after creation: `schema` (the encoded region) into the region, then its
  /// word, store-release. Once: logic_error for a region written already or too small.
  void publish_schema(std::span<const std::byte> schema);
  /// The schema region (reader: its mapping is read-write; read it only after an acquire of w_schema).
  [[nodiscard]] const std::byte* schema_region() const noexcept { return control_ + schema_offset_; }
  [[nodiscard]] std::uint64_t schema_capacity() const noexcept { return schema_capacity_; }
  /// The record region (shm_records.hpp; reader: read a record only after the acquire of head, S3).
  [[nodiscard]] std::byte* record_region() const noexcept { return control_ + record_offset_; }
  [[nodiscard]] std::uint64_t record_capacity() const noexcept { return record_capacity_; }

  /// Producer: removes the name (mappings stay valid; a reader still attached keeps reading). Idempotent.
  void unlink() noexcept
  {
    if (owner_) {
      owner_ = false;
      ::shm_unlink(object_name(name_).c_str());
    }
  }

  [[nodiscard]] std::byte* header() const noexcept { return control_; }
  [[nodiscard]] descriptor* descriptors() const noexcept
  {
    return reinterpret_cast<descriptor*>(control_ + header_bytes);
  }
  [[nodiscard]] std::byte* staging() const noexcept { return staging_; }
  [[nodiscard]] std::uint64_t staging_bytes() const noexcept { return staging_bytes_; }
  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  explicit segment(std::string name) : name_{std::move(name)} {}

  /// An existing segment of this name: a live producer's is refused; a dead producer's (or one never
  /// initialized for 100 ms) is removed so the caller can create it again.
  static void replace_stale(const std::string& name, const std::string& obj);

  /// A number that tells this segment from an earlier one of the same name.
  static std::uint64_t generation();

  std::string name_;
  int fd_{-1};
  bool owner_{false};
  std::byte* control_{nullptr};
  std::uint64_t control_bytes_{0};
  std::byte* staging_{nullptr};
  std::uint64_t schema_offset_{0};
  std::uint64_t schema_capacity_{0};
  std::uint64_t record_offset_{0};
  std::uint64_t record_capacity_{0};
  std::uint64_t staging_offset_{0};
  std::uint64_t staging_bytes_{0};
  std::uint64_t capacity_{0};
};

}  // namespace ferry::sink::detail::shm
