// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's record region (shm_layout.hpp; docs/design/shm_stream.md, S2): per forward, the
// attribution its entries carry (d2h::forward_meta: the tag, the requests {request, first_row, rows} in row
// order, the opaque user bytes, plan()'s selected), so a reader sees what the producer's entry_view saw. A ring of
// records the producer writes (plain stores, under the stream's mutex) before the head store-release of the first
// descriptor naming the record; a record's bytes are reused only once every descriptor naming it was released.
// A reader parses a private copy, every field checked against its descriptor. Integers little-endian:
//
//   0    u64 magic "FERRYREC"
//   8    u32 CRC-32 (crc32.hpp: zlib's) of bytes [16, record bytes), u32 flags (bit 0: a tag, bit 1: selected)
//   16   u64 number: the record's, also in every descriptor naming it (1, 2, ... per stream)
//   24   u64 forward: entry_view::forward_index()
//   32   u64 tag (flag bit 0; else 0)
//   40   u64 selected (flag bit 1; else 0)
//   48   u64 requests: their count n
//   56   u64 user bytes u
//   64   n x {u64 request, u64 first_row, u64 rows}, then the u user bytes, zero padding to a multiple of 8
//
// A record never wraps the region's end (the rest of the region is skipped); one larger than the whole region is
// never written: its entries' descriptors say attribution_overflow with the length it needed.
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/forward_info.hpp>
#include <ferry/error.hpp>
#include "crc32.hpp"
#include <ferry/sink/detail/shm_layout.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ferry::sink::detail::shm {

inline constexpr std::uint64_t record_magic = 0x4345525952524546ULL;  // "FERRYREC" in memory order
inline constexpr std::uint64_t record_header_bytes = 64;
inline constexpr std::uint64_t request_bytes = 24;  ///< one {request, first_row, rows}

/// The record length of `m`.
[[nodiscard]] inline std::uint64_t record_bytes_of(const d2h::forward_meta& m) noexcept
{
  return record_header_bytes + m.requests.size() * request_bytes + (m.user.size() + 7) / 8 * 8;
}

/// Writes the record of forward `forward` (`m`, number `number`) at `dst` (record_bytes_of(m) bytes).
inline void write_record(std::byte* dst, std::uint64_t number, std::uint64_t forward, const d2h::forward_meta& m)
{
  const std::uint64_t n = record_bytes_of(m);
  const std::uint32_t flags = (m.tag ? 1U : 0U) | (m.selected ? 2U : 0U);
  const std::uint64_t words[6] = {number, forward, m.tag.value_or(0), m.selected.value_or(0), m.requests.size(),
                                  m.user.size()};
  std::memcpy(dst, &record_magic, 8);
  std::memcpy(dst + 12, &flags, 4);
  std::memcpy(dst + 16, words, sizeof words);
  std::byte* p = dst + record_header_bytes;
  for (const auto& r : m.requests) {
    const std::uint64_t q[3] = {r.request, r.first_row, r.rows};
    std::memcpy(p, q, sizeof q);
    p += sizeof q;
  }
  if (!m.user.empty()) { std::memcpy(p, m.user.data(), m.user.size()); }
  p += m.user.size();
  std::memset(p, 0, static_cast<std::size_t>(dst + n - p));
  const std::uint32_t crc = crc32(dst + 16, n - 16);
  std::memcpy(dst + 8, &crc, 4);
}

/// The forward_meta of a private copy `rec` of the record descriptor `d` names. Throws logic_error naming the
/// stream, the entry and the field, expected against found, for a record that is not `d`'s (a corrupted segment,
/// or a reader the producer evicted reading a reused record).
[[nodiscard]] inline std::shared_ptr<const d2h::forward_meta> read_record(std::span<const std::byte> rec,
                                                                          const descriptor& d,
                                                                          const std::string& stream)
{
  const auto fail = [&](const std::string& what) {
    throw ferry::logic_error(::ferry::detail::format(
      "ferry: shm reader: stream '{}': entry {} (hook {}, forward {}): record {} at offset {} of {} bytes: {} (a "
      "corrupted segment) [{}:{}]", stream, d.index, d.hook, d.forward, d.record, d.record_offset, rec.size(), what,
      __FILE__, __LINE__));
  };
  if (rec.size() < record_header_bytes) {
    fail(
        ::ferry::detail::format("expected at least its {} byte header, got {} bytes", record_header_bytes, rec.size()));
  }
  std::uint64_t magic_word = 0;
  std::uint32_t crc = 0, flags = 0;
  std::uint64_t w[6];
  std::memcpy(&magic_word, rec.data(), 8);
  std::memcpy(&crc, rec.data() + 8, 4);
  std::memcpy(&flags, rec.data() + 12, 4);
  std::memcpy(w, rec.data() + 16, sizeof w);
  if (magic_word != record_magic) {
    fail(::ferry::detail::format("expected magic {:#x}, got {:#x}", record_magic, magic_word));
  }
  if (const std::uint32_t have = crc32(rec.data() + 16, rec.size() - 16); have != crc) {
    fail(::ferry::detail::format("expected the CRC-32 {:#010x} (the record's), got {:#010x}", crc, have));
  }
  if (w[0] != d.record || w[1] != d.forward) {
    fail(::ferry::detail::format("expected record {} of forward {} (the descriptor's), got record {} of forward {}",
                                 d.record, d.forward, w[0], w[1]));
  }
  const std::uint64_t body = rec.size() - record_header_bytes;
  if (w[4] > body / request_bytes || w[5] > body ||
      record_header_bytes + w[4] * request_bytes + (w[5] + 7) / 8 * 8 != rec.size()) {
    fail(::ferry::detail::format("expected {} requests and {} user bytes to fill the record, got {} bytes", w[4], w[5],
                                 rec.size()));
  }
  if ((flags & ~3U) != 0 || ((flags & 1U) != 0 && w[2] != d.tag)) {
    fail(
        ::ferry::detail::format("expected flags within 0x3 and a tag equal to the descriptor's {}, got flags {:#x} and "
                                "tag {}",
                                d.tag, flags, w[2]));
  }
  auto m = std::make_shared<d2h::forward_meta>();
  if ((flags & 1U) != 0) { m->tag = w[2]; }
  if ((flags & 2U) != 0) { m->selected = w[3]; }
  m->requests.resize(static_cast<std::size_t>(w[4]));
  const std::byte* p = rec.data() + record_header_bytes;
  for (auto& r : m->requests) {
    std::uint64_t q[3];
    std::memcpy(q, p, sizeof q);
    r = {q[0], q[1], q[2]};
    p += sizeof q;
  }
  m->user.assign(p, p + w[5]);
  return m;
}

/// The producer's side of the record region (under the stream's mutex): which records live where, written when a
/// forward's first entry is published, reclaimed once every descriptor naming one was released.
class record_ring {
 public:
  struct ref {
    std::uint32_t state{attribution_none};
    std::uint64_t number{0}, offset{0}, bytes{0};
    /// The descriptor's attribution fields.
    void into(descriptor& d) const noexcept
    {
      d.attribution = state;
      d.record = number;
      d.record_offset = offset;
      d.record_bytes = bytes;
    }
  };

  record_ring(std::byte* region, std::uint64_t capacity) noexcept : region_{region}, cap_{capacity} {}

  /// Whether entry `v` can be published now as far as its record goes: it needs none, its forward's record is
  /// live, it can never fit (attribution_overflow), or there is room for it once records of entries below
  /// `released` are reclaimed.
  [[nodiscard]] bool room(const d2h::entry_view& v, std::uint64_t released)
  {
    if (v.meta() == nullptr || current(v)) { return true; }
    const std::uint64_t n = record_bytes_of(*v.meta());
    if (n > cap_) { return true; }
    reclaim(released);
    return fit(n) != none;
  }

  /// Entry `v`, stream index `index`: its forward's record, written now if not live (plain stores; the caller's
  /// head store-release publishes them with the descriptor). room(v) was true.
  [[nodiscard]] ref place(const d2h::entry_view& v, std::uint64_t index, std::uint64_t released)
  {
    if (v.meta() == nullptr) { return {}; }
    if (current(v)) {
      recs_.back().last_index = index;
      return recs_.back().r;
    }
    const std::uint64_t n = record_bytes_of(*v.meta());
    if (n > cap_) {  // never fits: its entries carry the outcome; counted once per forward
      if (overflow_meta_ != v.shared_meta() || overflow_forward_ != v.forward_index()) {
        overflow_meta_ = v.shared_meta();
        overflow_forward_ = v.forward_index();
        ++overflows;
      }
      return {attribution_overflow, 0, 0, n};
    }
    reclaim(released);
    const std::uint64_t at = fit(n);
    FERRY_EXPECTS(at != none, ferry::logic_error, "shm stream: record of forward {} ({} bytes) expected room in the "
                  "{} byte record region (checked by room()), got none", v.forward_index(), n, cap_);
    const ref r{attribution_record, ++number_, at % cap_, n};
    write_record(region_ + r.offset, r.number, v.forward_index(), *v.meta());
    head_ = at + n;
    recs_.push_back(live{at, index, v.forward_index(), v.shared_meta(), r});
    ++written;
    return r;
  }

  std::uint64_t written{0};    ///< records written
  std::uint64_t overflows{0};  ///< forwards whose record is larger than the region

 private:
  static constexpr std::uint64_t none = ~std::uint64_t{0};
  struct live {
    std::uint64_t begin, last_index, forward;
    std::shared_ptr<const d2h::forward_meta> meta;  // identifies the forward (with its index: two channels' forward 0)
    ref r;
  };

  [[nodiscard]] bool current(const d2h::entry_view& v) const noexcept
  {
    return !recs_.empty() && recs_.back().meta == v.shared_meta() && recs_.back().forward == v.forward_index();
  }
  /// Drops the records whose every descriptor is below `released` (the reader is done with them).
  void reclaim(std::uint64_t released) noexcept
  {
    while (!recs_.empty() && recs_.front().last_index < released) { recs_.pop_front(); }
    if (recs_.empty()) { head_ = tail_ = 0; }  // an empty ring starts over: a record of the whole region fits
    else { tail_ = recs_.front().begin; }
  }
  /// The ring position a record of `n` bytes goes to (never across the region's end), or `none`.
  [[nodiscard]] std::uint64_t fit(std::uint64_t n) const noexcept
  {
    const std::uint64_t pos = head_ % cap_;
    const std::uint64_t at = cap_ - pos < n ? head_ + (cap_ - pos) : head_;
    return at + n - tail_ <= cap_ ? at : none;
  }

  std::byte* region_;
  std::uint64_t cap_;
  std::deque<live> recs_;       // live records, oldest first: ring positions [tail_, head_)
  std::uint64_t head_{0}, tail_{0}, number_{0};
  std::shared_ptr<const d2h::forward_meta> overflow_meta_;
  std::uint64_t overflow_forward_{0};
};

}  // namespace ferry::sink::detail::shm
