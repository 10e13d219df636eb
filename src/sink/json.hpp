// SPDX-License-Identifier: Apache-2.0
// The little JSON the sinks write (a safetensors header, index.json), by hand: strings escaped per RFC 8259,
// unsigned integers, integer arrays. No parser: the sinks never read JSON back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::sink::detail::json {

/// Appends `s` as a JSON string (quotes, backslashes and control characters escaped; UTF-8 as is).
inline void append_string(std::string& out, std::string_view s)
{
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

[[nodiscard]] inline std::string string(std::string_view s)
{
  std::string out;
  append_string(out, s);
  return out;
}

/// Appends `[a,b,c]`.
inline void append_array(std::string& out, const std::vector<std::uint64_t>& v)
{
  out += '[';
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i != 0) { out += ','; }
    out += std::to_string(v[i]);
  }
  out += ']';
}

/// Appends `"key":` (with a leading comma unless `first`).
inline void append_key(std::string& out, std::string_view key, bool first = false)
{
  if (!first) { out += ','; }
  append_string(out, key);
  out += ':';
}

}  // namespace ferry::sink::detail::json
