// SPDX-License-Identifier: Apache-2.0
// The writing half of ferry::detail::format (ferry/detail/format.hpp): a replacement field's parsed spec
// ([[fill]align][sign][#][0][width][.precision][type]), the padding to its width, and one writer per
// argument kind (text, integers, floating point, pointers). Each writer appends to `out` and never throws
// anything but std::bad_alloc; format.hpp picks the writer for an argument's type.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace ferry::detail::format_impl {

struct spec {
  char fill{' '};
  char align{'\0'};  ///< '<', '>', '^', or '\0' (default: numbers right, text left)
  char sign{'-'};
  bool alternate{false};
  bool zero_pad{false};
  int width{0};
  int precision{-1};
  char type{'\0'};
};

/// Parses the part of a replacement field after ':'. False when it is not a valid spec.
inline bool parse_spec(std::string_view s, spec& out)
{
  std::size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^'; };
  if (s.size() >= 2 && is_align(s[1])) {
    out.fill = s[0];
    out.align = s[1];
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    out.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) { out.sign = s[i++]; }
  if (i < s.size() && s[i] == '#') {
    out.alternate = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    out.zero_pad = true;
    ++i;
  }
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') { out.width = out.width * 10 + (s[i++] - '0'); }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (i >= s.size() || s[i] < '0' || s[i] > '9') { return false; }
    out.precision = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') { out.precision = out.precision * 10 + (s[i++] - '0'); }
  }
  if (i < s.size()) { out.type = s[i++]; }
  return i == s.size();
}

/// Appends `body` (with `prefix`, e.g. a sign or "0x") padded to the spec's width.
inline void pad(std::string& out, std::string_view prefix, std::string_view body, const spec& sp, bool numeric)
{
  const std::size_t len = prefix.size() + body.size();
  const std::size_t width = sp.width > 0 ? static_cast<std::size_t>(sp.width) : 0;
  if (len >= width) {
    out.append(prefix).append(body);
    return;
  }
  const std::size_t fill = width - len;
  if (numeric && sp.zero_pad && sp.align == '\0') {
    out.append(prefix).append(fill, '0').append(body);
    return;
  }
  const char align = sp.align != '\0' ? sp.align : (numeric ? '>' : '<');
  const std::size_t before = align == '>' ? fill : align == '^' ? fill / 2 : 0;
  out.append(before, sp.fill).append(prefix).append(body).append(fill - before, sp.fill);
}

inline void append_text(std::string& out, std::string_view s, const spec& sp)
{
  if (sp.precision >= 0 && static_cast<std::size_t>(sp.precision) < s.size()) {
    s = s.substr(0, static_cast<std::size_t>(sp.precision));
  }
  pad(out, {}, s, sp, false);
}

inline void append_unsigned(std::string& out, unsigned long long v, bool negative, const spec& sp)
{
  int base = 10;
  std::string_view prefix;
  bool upper = false;
  switch (sp.type) {
    case 'x': base = 16; prefix = "0x"; break;
    case 'X': base = 16; prefix = "0X"; upper = true; break;
    case 'b': base = 2; prefix = "0b"; break;
    case 'B': base = 2; prefix = "0B"; break;
    case 'o': base = 8; prefix = "0"; break;
    default: break;
  }
  char digits[72];
  auto r = std::to_chars(digits, digits + sizeof digits, v, base);
  if (upper) {
    for (char* p = digits; p != r.ptr; ++p) {
      if (*p >= 'a' && *p <= 'f') { *p = static_cast<char>(*p - 'a' + 'A'); }
    }
  }
  std::string head;
  if (negative) {
    head = "-";
  } else if (sp.sign == '+' || sp.sign == ' ') {
    head = std::string(1, sp.sign);
  }
  if (sp.alternate && !(base == 8 && v == 0)) { head.append(prefix); }
  pad(out, head, std::string_view(digits, static_cast<std::size_t>(r.ptr - digits)), sp, true);
}

template <class T>
void append_integer(std::string& out, T v, const spec& sp)
{
  if (sp.type == 'c') {
    const char c = static_cast<char>(v);
    pad(out, {}, std::string_view(&c, 1), sp, false);
    return;
  }
  if constexpr (std::is_signed_v<T>) {
    const bool negative = v < 0;
    const auto magnitude = negative ? 0ULL - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    append_unsigned(out, magnitude, negative, sp);
  } else {
    append_unsigned(out, static_cast<unsigned long long>(v), false, sp);
  }
}

inline void append_float(std::string& out, double v, const spec& sp)
{
  char digits[512];
  std::to_chars_result r{};
  const bool upper = sp.type == 'F' || sp.type == 'E' || sp.type == 'G';
  if (v != v) {  // NaN
    pad(out, {}, upper ? "NAN" : "nan", sp, true);
    return;
  }
  const bool negative = v < 0 || (v == 0 && 1 / v < 0);
  const double m = negative ? -v : v;
  if (m > std::numeric_limits<double>::max()) {  // infinity
    pad(out, negative ? "-" : "", upper ? "INF" : "inf", sp, true);
    return;
  }
  switch (sp.type) {
    case 'f':
    case 'F':
      r = std::to_chars(digits, digits + sizeof digits, m, std::chars_format::fixed,
                        sp.precision < 0 ? 6 : sp.precision);
      break;
    case 'e':
    case 'E':
      r = std::to_chars(digits, digits + sizeof digits, m, std::chars_format::scientific,
                        sp.precision < 0 ? 6 : sp.precision);
      break;
    case 'g':
    case 'G':
      r = std::to_chars(digits, digits + sizeof digits, m, std::chars_format::general,
                        sp.precision < 0 ? 6 : sp.precision);
      break;
    default:
      r = sp.precision < 0 ? std::to_chars(digits, digits + sizeof digits, m)
                           : std::to_chars(digits, digits + sizeof digits, m, std::chars_format::general, sp.precision);
      break;
  }
  if (r.ec != std::errc{}) {
    pad(out, {}, "?", sp, true);
    return;
  }
  if (upper) {
    for (char* p = digits; p != r.ptr; ++p) {
      if (*p == 'e') { *p = 'E'; }
    }
  }
  std::string_view head = negative ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
  pad(out, head, std::string_view(digits, static_cast<std::size_t>(r.ptr - digits)), sp, true);
}

inline void append_pointer(std::string& out, const void* p, const spec& sp)
{
  spec hex = sp;
  hex.type = 'x';
  hex.alternate = true;
  append_unsigned(out, static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)), false, hex);
}

}  // namespace ferry::detail::format_impl
