// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's schema region (shm_layout.hpp), byte by byte: the hook schema (d2h/hook_schema.hpp)
// the producer writes once and a reader parses from a private copy, every read bounds-checked. Integers in the
// header words' byte order (little-endian):
//
//   0    u64 magic "FERRYHKS"
//   8    u64 hooks: the number of records
//   16   u64 body bytes: the records' total
//   24   u32 CRC-32 of the body (crc32.hpp: zlib's), u32 0
//   32   one record per hook, by increasing id, each 8-byte aligned:
//          u32 hook id, u8 dimensions n, u8 dtype name bytes, u16 hook name bytes, u64 row_shape[n],
//          the dtype's safetensors name ("BF16": not an enum value, so a reordered d2h::dtype changes nothing;
//          a reduced hook: its reducer, "topk(64)", and row_shape the rows it reduces; a tensor-parallel slice
//          follows as "@world,rank,dim,offset,full"),
//          the hook's name (UTF-8), zero padding to a multiple of 8
//
// The region's length (32 + body bytes) is the header's schema word (w_schema), stored with release after these
// bytes; a reader reads them only after an acquire load of a nonzero word (docs/design/shm_stream.md, S0).
#pragma once

#include <ferry/d2h/hook_schema.hpp>
#include "crc32.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::sink::detail::shm {

inline constexpr std::uint64_t schema_magic = 0x534b485952524546ULL;  // "FERRYHKS" in memory order
inline constexpr std::uint64_t schema_header_bytes = 32;

/// A slice "world,rank,dim,offset,full" (decimal, each at most 19 digits; world, rank, dim below 2^32), or false.
[[nodiscard]] inline bool parse_shard(std::string_view s, d2h::shard_layout& out) noexcept
{
  std::uint64_t v[5]{};
  for (int k = 0; k < 5; ++k) {
    const std::size_t end = k < 4 ? s.find(',') : s.size();
    if (end == std::string_view::npos || end == 0 || end > 19) { return false; }
    for (const char c : s.substr(0, end)) {
      if (c < '0' || c > '9') { return false; }
      v[k] = v[k] * 10 + static_cast<std::uint64_t>(c - '0');
    }
    s.remove_prefix(k < 4 ? end + 1 : end);
  }
  if (v[0] > 0xffffffffULL || v[1] > 0xffffffffULL || v[2] > 0xffffffffULL || v[0] == 0) { return false; }
  out = {static_cast<std::uint32_t>(v[0]), static_cast<std::uint32_t>(v[1]), static_cast<std::uint32_t>(v[2]), v[3],
         v[4]};
  return true;
}

/// The region holding `s` (its length: the schema word). logic_error naming the stream and the hook for a row
/// of more than 255 dimensions or a name of more than 65535 bytes.
[[nodiscard]] inline std::vector<std::byte> encode_schema(const d2h::hook_schema& s, const std::string& stream)
{
  std::vector<std::byte> out(schema_header_bytes);
  const auto put = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (const auto& h : s.hooks()) {
    FERRY_EXPECTS(h.row_shape.size() <= 0xFF && h.name.size() <= 0xFFFF, ferry::logic_error,
                  "shm stream '{}': hook {} \"{}\": expected a row of at most 255 dimensions and a name of at most "
                  "65535 bytes (the schema region's fields), got {} dimensions and {} bytes", stream, h.id.value,
                  h.name, h.row_shape.size(), h.name.size());
    // a reduced hook: its reducer and the rows it reduces (hook_schema::add makes the same hook of them)
    const bool reduced = !h.reduce.empty();
    std::string type{reduced ? std::string_view{h.reduce} : d2h::dtype_name(h.type)};
    if (h.shard.world != 0) {  // a tensor-parallel slice: "<type>@world,rank,dim,offset,full"
      type += ::ferry::detail::format("@{},{},{},{},{}", h.shard.world, h.shard.rank, h.shard.dim, h.shard.offset,
                                      h.shard.full);
    }
    const std::vector<std::uint64_t> row = reduced ? std::vector<std::uint64_t>{h.reduce_width} : h.row_shape;
    const std::uint32_t id = h.id.value;
    const auto dims = static_cast<std::uint8_t>(row.size());
    const auto type_bytes = static_cast<std::uint8_t>(type.size());
    const auto name_bytes = static_cast<std::uint16_t>(h.name.size());
    put(&id, 4);
    put(&dims, 1);
    put(&type_bytes, 1);
    put(&name_bytes, 2);
    for (const std::uint64_t d : row) { put(&d, 8); }
    put(type.data(), type.size());
    put(h.name.data(), h.name.size());
    out.resize((out.size() + 7) / 8 * 8);  // zero padding
  }
  const std::uint64_t words[3] = {schema_magic, s.size(), out.size() - schema_header_bytes};
  const std::uint32_t crc[2] = {crc32(out.data() + schema_header_bytes, out.size() - schema_header_bytes), 0};
  std::memcpy(out.data(), words, sizeof words);
  std::memcpy(out.data() + sizeof words, crc, sizeof crc);
  return out;
}

/// The schema in `region` (a private copy of the region's first schema-word bytes). Throws d2h::schema_error
/// naming the stream, the place and what was expected against what is there: a region shorter than its header,
/// a magic, a body length or a CRC-32 that differs, a record reaching past the body, bytes left after the last
/// record, an unknown dtype name, or what hook_schema::add refuses (an empty or duplicate name, a duplicate id,
/// a zero dimension).
[[nodiscard]] inline d2h::hook_schema decode_schema(std::span<const std::byte> region, const std::string& stream)
{
  const auto fail = [&](const std::string& what) {
    throw d2h::schema_error(::ferry::detail::format("ferry: shm reader: stream '{}': schema region of {} bytes: {} (a "
                                                    "corrupted segment) [{}:{}]", stream, region.size(), what,
                                                    __FILE__, __LINE__));
  };
  if (region.size() < schema_header_bytes) {
    fail(::ferry::detail::format("expected at least its {} byte header, got {} bytes", schema_header_bytes,
                                 region.size()));
  }
  std::uint64_t words[3];
  std::uint32_t crc = 0;
  std::memcpy(words, region.data(), sizeof words);
  std::memcpy(&crc, region.data() + sizeof words, sizeof crc);
  const std::span<const std::byte> body = region.subspan(schema_header_bytes);
  if (words[0] != schema_magic) {
    fail(::ferry::detail::format("expected magic {:#x}, got {:#x}", schema_magic, words[0]));
  }
  if (words[2] != body.size()) {
    fail(::ferry::detail::format("expected a body of {} bytes (the schema word's), got a header saying {}", body.size(),
                                 words[2]));
  }
  if (const std::uint32_t have = crc32(body.data(), body.size()); have != crc) {
    fail(::ferry::detail::format("expected the body's CRC-32 {:#010x} (the header's), got {:#010x}", crc, have));
  }
  d2h::hook_schema s;
  std::size_t pos = 0;
  const auto take = [&](void* dst, std::size_t n, std::uint64_t record, const char* what) {
    if (n > body.size() - pos) {
      fail(::ferry::detail::format("record {} of {}: expected its {} ({} bytes) within the body, got {} bytes left at "
                                   "offset {}", record, words[1], what, n, body.size() - pos, pos));
    }
    if (dst != nullptr) { std::memcpy(dst, body.data() + pos, n); }
    pos += n;
  };
  for (std::uint64_t r = 0; r < words[1]; ++r) {
    std::uint32_t id = 0;
    std::uint8_t dims = 0, type_bytes = 0;
    std::uint16_t name_bytes = 0;
    take(&id, 4, r, "hook id");
    take(&dims, 1, r, "dimension count");
    take(&type_bytes, 1, r, "dtype name length");
    take(&name_bytes, 2, r, "name length");
    std::vector<std::uint64_t> shape(dims);
    take(shape.data(), dims * std::size_t{8}, r, "row shape");
    std::string type(type_bytes, '\0'), name(name_bytes, '\0');
    take(type.data(), type_bytes, r, "dtype name");
    take(name.data(), name_bytes, r, "hook name");
    take(nullptr, (8 - pos % 8) % 8, r, "padding");
    d2h::shard_layout slice;
    const std::size_t at = type.find('@');
    if (at != std::string::npos && !parse_shard(std::string_view{type}.substr(at + 1), slice)) {
      fail(::ferry::detail::format("record {} (hook {}): expected a slice \"@world,rank,dim,offset,full\" after its "
                                   "dtype, got {} bytes there", r, id, type.size() - at - 1));
    }
    type.resize(std::min(at, type.size()));
    d2h::dtype t{};
    d2h::reducer red;
    if (!d2h::parse_dtype(type, t) && !d2h::parse_reducer(type, red)) {
      fail(::ferry::detail::format("record {} (hook {}): expected a dtype among {} (or a reducer), got a name of {} "
                                   "bytes", r, id, d2h::dtype_names(), type.size()));
    }
    try {
      s.add(d2h::hook_id{id}, std::move(name), std::string_view{type}, std::move(shape));
      if (slice.world != 0) { s.shard(d2h::hook_id{id}, slice); }
    } catch (const d2h::schema_error& e) {
      fail(::ferry::detail::format("record {}: expected a valid hook, got: {}", r, e.what()));
    }
  }
  if (pos != body.size()) {
    fail(::ferry::detail::format("expected {} records filling the body, got {} bytes after them", words[1],
                                 body.size() - pos));
  }
  return s;
}

}  // namespace ferry::sink::detail::shm
