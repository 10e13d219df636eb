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
//
// This header: the argument dispatch (append_arg), the type erasure and the field walk (vformat). The
// spec parser, the padding and the per-kind writers are in format_spec.hpp.
#pragma once

#include <ferry/detail/format_spec.hpp>

#include <charconv>
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace ferry::detail {

namespace format_impl {

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
