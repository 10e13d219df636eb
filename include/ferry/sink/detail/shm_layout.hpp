// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's segment, byte by byte (layout version 3; docs/design/shm_stream.md). One POSIX
// shared-memory object "/ferry-<name>" (Linux: /dev/shm/ferry-<name>), all words little-endian uint64:
//
//   [0, 4096)           header, one 64-byte line per writer so no two writers share a line:
//     line 0, 1         fixed at creation: magic (written last, store-release), version, sizes, generation,
//                       the producer's pid and start time, the schema region's offset and capacity, the record
//                       region's offset and capacity
//     line 2            head: descriptors published (producer, store-release)
//     line 3            producer control: state, session, session_claim, read_start, detach_reason, schema (the
//                       schema region's bytes once written, store-release; 0: none yet)
//     line 4            release: the reader's released prefix, tagged with its session (reader, store-release)
//     line 5            consumed: the reader's read index, tagged (reader; diagnostics)
//     line 6            reader control: claim (CAS), attach_request, the reader's start time
//   [4096, desc_end)    descriptor ring: capacity (a power of two) x 128-byte descriptors, index i at i % capacity
//   [schema_offset, +schema_capacity)  the hook schema (page-aligned; shm_schema.hpp), written once
//   [record_offset, +record_capacity)  the forwards' attribution records (page-aligned; shm_records.hpp): a ring of
//                       records, each written before the first descriptor naming it is published
//   [staging_offset, +staging_bytes)  the channel's staging (page-aligned): entry payloads, where D2H lands
//
// Word access goes through std::atomic_ref (lock-free, so address-free: valid across processes).
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <signal.h>
#include <unistd.h>

namespace ferry::sink::detail::shm {

inline constexpr std::uint64_t magic = 0x4d48535952524546ULL;  // "FERRYSHM" in memory order
/// 3: the record region and 128-byte descriptors naming their forward's record and the entry's reservation;
/// 2: the schema region; 1: neither.
inline constexpr std::uint64_t layout_version = 3;
inline constexpr std::uint64_t header_bytes = 4096;
inline constexpr std::uint64_t page = 4096;
inline constexpr std::uint64_t descriptor_bytes = 128;
inline constexpr unsigned tag_shift = 48;  ///< release / consumed words: session tag << 48 | index
inline constexpr std::uint64_t index_mask = (std::uint64_t{1} << tag_shift) - 1;

/// Byte offsets of the header words.
enum word : std::uint64_t {
  // line 0, 1: fixed
  w_magic = 0, w_version = 8, w_header_bytes = 16, w_total_bytes = 24, w_desc_offset = 32, w_desc_capacity = 40,
  w_staging_offset = 48, w_staging_bytes = 56, w_generation = 64, w_producer_pid = 72, w_producer_start = 80,
  w_descriptor_bytes = 88, w_schema_offset = 96, w_schema_capacity = 104, w_record_offset = 112,
  w_record_capacity = 120,
  // line 2: producer, hot
  w_head = 128,
  // line 3: producer control
  w_state = 192, w_session = 200, w_session_claim = 208, w_read_start = 216, w_detach_reason = 224, w_schema = 232,
  // line 4, 5: reader, hot
  w_release = 256, w_consumed = 320,
  // line 6: reader control
  w_claim = 384, w_attach_request = 392, w_reader_start = 400,
};

enum stream_state : std::uint64_t { state_creating = 0, state_open = 1, state_closed = 2 };
/// Why the producer ended the last session (w_detach_reason).
enum detach_reason : std::uint64_t { detach_none = 0, detach_evicted = 1, detach_reader_left = 2, detach_reader_died = 3 };

/// A descriptor's attribution: what its forward's record is (shm_records.hpp).
enum attribution : std::uint32_t {
  attribution_none = 0,      ///< the forward carries no forward_meta (no tag, requests or user bytes given)
  attribution_record = 1,    ///< record, record_offset, record_bytes name its record in the record region
  attribution_overflow = 2,  ///< its record (record_bytes) is larger than the whole record region: not written
};

/// One published entry (128 bytes). status: d2h::entry_status (0 ok, 1 size_overflow, 2 selection_error).
struct descriptor {
  std::uint64_t index;      ///< the stream index (i-th published entry), checked by the reader
  std::uint64_t seq;        ///< entry_view::seq()
  std::uint64_t forward;    ///< entry_view::forward_index()
  std::uint64_t tag;        ///< entry_view::tag()
  std::uint64_t offset;     ///< payload offset from the staging base (0 for an entry without bytes)
  std::uint64_t size;       ///< entry_view::size()
  std::uint64_t row_bytes;  ///< entry_view::row_bytes()
  std::uint32_t hook;
  std::uint32_t status;
  std::uint64_t reserved;       ///< entry_view::reserved_bytes()
  std::uint64_t record;         ///< attribution_record: the record's number (1, 2, ...; its header repeats it)
  std::uint64_t record_offset;  ///< attribution_record: its offset in the record region
  std::uint64_t record_bytes;   ///< attribution_record: its length; attribution_overflow: the length it needed
  std::uint32_t attribution;    ///< shm::attribution
  std::uint32_t spare0;
  std::uint64_t spare[3];       ///< zero
};
static_assert(sizeof(descriptor) == descriptor_bytes);
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free, "cross-process words need lock-free atomics");

/// The header word at byte `w` of the mapping at `base`.
[[nodiscard]] inline std::atomic_ref<std::uint64_t> at(std::byte* base, std::uint64_t w) noexcept
{
  return std::atomic_ref<std::uint64_t>{*reinterpret_cast<std::uint64_t*>(base + w)};
}
[[nodiscard]] inline std::uint64_t load(std::byte* base, std::uint64_t w,
                                        std::memory_order o = std::memory_order_acquire) noexcept
{
  return at(base, w).load(o);
}
inline void store(std::byte* base, std::uint64_t w, std::uint64_t v,
                  std::memory_order o = std::memory_order_release) noexcept
{
  at(base, w).store(v, o);
}

[[nodiscard]] constexpr std::uint64_t tagged(std::uint64_t session, std::uint64_t index) noexcept
{
  return (session << tag_shift) | (index & index_mask);
}
[[nodiscard]] constexpr std::uint64_t tag_of(std::uint64_t word) noexcept { return word >> tag_shift; }
[[nodiscard]] constexpr std::uint64_t session_tag(std::uint64_t session) noexcept { return session & 0xFFFF; }
[[nodiscard]] constexpr std::uint64_t align_page(std::uint64_t n) noexcept { return (n + page - 1) / page * page; }

/// A reader's claim word: its pid and a per-reader nonce (two readers of one process never share a claim).
[[nodiscard]] constexpr std::uint64_t claim_of(std::uint64_t pid, std::uint32_t nonce) noexcept
{
  return (pid << 32) | nonce;
}
[[nodiscard]] constexpr long pid_of_claim(std::uint64_t claim) noexcept { return static_cast<long>(claim >> 32); }

/// Whether `name` is a valid stream name: 1..200 characters of [A-Za-z0-9._-], not starting with '.'.
[[nodiscard]] inline bool valid_name(const std::string& name) noexcept
{
  if (name.empty() || name.size() > 200 || name[0] == '.') { return false; }
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) { return false; }
  }
  return true;
}
/// The shm_open name of stream `name` ("/ferry-<name>"; Linux: /dev/shm/ferry-<name>).
[[nodiscard]] inline std::string object_name(const std::string& name) { return "/ferry-" + name; }

/// A process's start time (field 22 of /proc/<pid>/stat, clock ticks since boot), 0 when unknown; `zombie`
/// is set for a process that ended but was not reaped. Tells a live process from a recycled pid.
[[nodiscard]] inline std::uint64_t start_time(long pid, bool* zombie = nullptr) noexcept
{
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  std::FILE* f = std::fopen(path, "re");
  if (f == nullptr) { return 0; }
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr) { return 0; }
  char state = '?';
  unsigned long long t = 0;
  // after ')': state (field 3), then fields 4..21 skipped, starttime (field 22)
  if (std::sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", &state,
                  &t) != 2) {
    return 0;
  }
  if (zombie != nullptr) { *zombie = state == 'Z' || state == 'X'; }
  return t;
}

/// Whether process `pid` (started at `started`, 0: unknown) is alive: it exists, is no zombie, and, when its
/// start time is known, is the same process (not a recycled pid). Producer and reader share a pid namespace.
[[nodiscard]] inline bool alive(long pid, std::uint64_t started) noexcept
{
  if (pid <= 0) { return false; }
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) { return false; }
  bool zombie = false;
  const std::uint64_t t = start_time(pid, &zombie);
  if (zombie) { return false; }
  return started == 0 || t == 0 || t == started;
}

}  // namespace ferry::sink::detail::shm
