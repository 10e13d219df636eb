// SPDX-License-Identifier: Apache-2.0
// A small, dependency-free, runtime formatter for ferry's error messages, so that no public header needs
// fmt (whose constexpr machinery nvcc 13 rejects in C++20 mode) and every compiler a user compiles with
// (g++, clang++, nvcc, hipcc) accepts the headers.
//
//   ferry::detail::format("ring of {} bytes at {}: {:#x}", n, "device", addr)
//
// Replacement fields follow fmt's syntax for the subset ferry uses:
//   {} / {N}                          next / N-th argument
//   {:[[fill]align][sign][#][0][width][.precision][type]}
//     align  < > ^        sign  + - space        # alternate form (0x, 0b, 0 prefixes)
//     type   integers: d x X b B o c   floats: f F e E g G   strings: s   pointers: p
//   {{ and }}                         literal braces
// Argument kinds: bool, char, integers, floating point, std::string, std::string_view, const char*,
// pointers (printed 0x... as fmt does), std::nullptr_t, enumerations (through an ADL to_string(e) when
// one exists, else the underlying value) and any type with an ADL to_string(x) returning something
// string-like. A malformed field or a missing argument is written as-is (this formats error messages:
// it must never throw a second error of its own).
#pragma once

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace ferry::detail {

namespace format_impl {

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
      r = std::to_chars(digits, digits + sizeof digits, m, std::chars_format::fixed, sp.precision < 0 ? 6 : sp.precision);
      break;
    case 'e':
    case 'E':
      r = std::to_chars(digits, digits + sizeof digits, m, std::chars_format::scientific,
                        sp.precision < 0 ? 6 : sp.precision);
      break;
    case 'g':
    case 'G':
      r = std::to_chars(digits, digits + sizeof digits, m, std::chars_format::general, sp.precision < 0 ? 6 : sp.precision);
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

template <class T>
concept has_adl_to_string = requires(const T& v) {
  { to_string(v) } -> std::convertible_to<std::string_view>;
};

/// Appends one argument. The overload set is closed: an argument of another type does not compile.
template <class T>
void append_arg(std::string& out, const T& v, const spec& sp)
{
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    if (sp.type != '\0' && sp.type != 's') {
      append_integer(out, static_cast<unsigned>(v), sp);
    } else {
      append_text(out, v ? "true" : "false", sp);
    }
  } else if constexpr (std::is_same_v<U, char>) {
    if (sp.type != '\0' && sp.type != 'c') {
      append_integer(out, static_cast<int>(v), sp);
    } else {
      pad(out, {}, std::string_view(&v, 1), sp, false);
    }
  } else if constexpr (std::is_integral_v<U>) {
    append_integer(out, v, sp);
  } else if constexpr (std::is_floating_point_v<U>) {
    append_float(out, static_cast<double>(v), sp);
  } else if constexpr (std::is_same_v<U, std::nullptr_t>) {
    append_pointer(out, nullptr, sp);
  } else if constexpr (std::is_same_v<U, const char*> || std::is_same_v<U, char*>) {
    append_text(out, v != nullptr ? std::string_view(v) : std::string_view("(null)"), sp);
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    append_text(out, std::string_view(v), sp);
  } else if constexpr (std::is_pointer_v<U>) {
    append_pointer(out, static_cast<const void*>(v), sp);
  } else if constexpr (has_adl_to_string<U>) {
    append_text(out, std::string_view(to_string(v)), sp);
  } else if constexpr (std::is_enum_v<U>) {
    append_integer(out, static_cast<std::underlying_type_t<U>>(v), sp);
  } else {
    static_assert(sizeof(U) == 0, "ferry::detail::format: unsupported argument type");
  }
}

/// One type-erased argument: the object and the function that appends it.
struct arg {
  const void* object;
  void (*append)(std::string&, const void*, const spec&);
};

template <class T>
arg make_arg(const T& v)
{
  return {static_cast<const void*>(&v),
          [](std::string& out, const void* p, const spec& sp) { append_arg(out, *static_cast<const T*>(p), sp); }};
}
/// Arrays (string literals) decay to pointers.
template <class T, std::size_t N>
arg make_arg(const T (&v)[N])
{
  return {static_cast<const void*>(v), [](std::string& out, const void* p, const spec& sp) {
            append_arg(out, static_cast<const T*>(p), sp);
          }};
}

/// The non-template engine: walks `f`, appending literal text and the arguments' replacements.
inline std::string vformat(std::string_view f, const arg* args, std::size_t count)
{
  std::string out;
  out.reserve(f.size() + 16 * count);
  std::size_t next = 0;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}') {
      out.push_back('}');
      if (i + 1 < f.size() && f[i + 1] == '}') { ++i; }
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const std::size_t close = f.find('}', i + 1);
    if (close == std::string_view::npos) {
      out.append(f.substr(i));
      break;
    }
    const std::string_view field = f.substr(i + 1, close - i - 1);
    const std::size_t colon = field.find(':');
    const std::string_view id = field.substr(0, colon);
    spec sp;
    bool ok = colon == std::string_view::npos || parse_spec(field.substr(colon + 1), sp);
    std::size_t index = next;
    if (!id.empty()) {
      const auto r = std::from_chars(id.data(), id.data() + id.size(), index);
      ok = ok && r.ec == std::errc{} && r.ptr == id.data() + id.size();
    } else {
      ++next;
    }
    if (ok && index < count) {
      args[index].append(out, args[index].object, sp);
    } else {
      out.append(f.substr(i, close - i + 1));
    }
    i = close;
  }
  return out;
}

}  // namespace format_impl

/// Formats `f` with `a...` (see the top of this header for the syntax); never throws anything but
/// std::bad_alloc.
template <class... A>
[[nodiscard]] std::string format(std::string_view f, const A&... a)
{
  if constexpr (sizeof...(A) == 0) {
    return format_impl::vformat(f, nullptr, 0);
  } else {
    const format_impl::arg args[] = {format_impl::make_arg(a)...};
    return format_impl::vformat(f, args, sizeof...(A));
  }
}

}  // namespace ferry::detail
