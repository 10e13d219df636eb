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
// Word access goes through std::atomic_ref (lock-free, so address-free: valid across processes). The layout is
// public because a reader's entry (shm_reader.hpp) holds its descriptor; the code that maps and serves the
// segment is compiled into ferry::core (src/sink/shm_*.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

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
enum detach_reason : std::uint64_t {
  detach_none = 0,
  detach_evicted = 1,
  detach_reader_left = 2,
  detach_reader_died = 3
};

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

/// The shm_open name of stream `name` ("/ferry-<name>"; Linux: /dev/shm/ferry-<name>).
[[nodiscard]] inline std::string object_name(const std::string& name) { return "/ferry-" + name; }

}  // namespace ferry::sink::detail::shm
