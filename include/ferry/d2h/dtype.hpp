// SPDX-License-Identifier: Apache-2.0
// Element types of captured tensors, named as safetensors names them (F32, BF16, I64, ...): what a hook
// schema (hook_schema.hpp) says one row of a hook holds, and what a sink writes in a tensor's header.
// Host-only (the GPU never sees a dtype: ferry moves bytes).
#pragma once

#include <ferry/error.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::d2h {

/// A tensor element type: the byte-sized types of the safetensors format.
enum class dtype : std::uint8_t {
  f64, f32, f16, bf16, f8_e4m3, f8_e5m2,
  i64, i32, i16, i8,
  u64, u32, u16, u8,
  boolean,
};

namespace detail {
struct dtype_info {
  dtype type;
  std::string_view name;  // safetensors' spelling
  std::uint32_t bytes;
};
inline constexpr std::array<dtype_info, 15> dtype_table{{
  {dtype::f64, "F64", 8}, {dtype::f32, "F32", 4}, {dtype::f16, "F16", 2}, {dtype::bf16, "BF16", 2},
  {dtype::f8_e4m3, "F8_E4M3", 1}, {dtype::f8_e5m2, "F8_E5M2", 1},
  {dtype::i64, "I64", 8}, {dtype::i32, "I32", 4}, {dtype::i16, "I16", 2}, {dtype::i8, "I8", 1},
  {dtype::u64, "U64", 8}, {dtype::u32, "U32", 4}, {dtype::u16, "U16", 2}, {dtype::u8, "U8", 1},
  {dtype::boolean, "BOOL", 1},
}};
[[nodiscard]] constexpr const dtype_info& info_of(dtype t) noexcept
{
  for (const auto& i : dtype_table) {
    if (i.type == t) { return i; }
  }
  return dtype_table[0];  // unreachable for a valid enumerator
}
}  // namespace detail

/// safetensors' name of `t` ("F32", "BF16", "BOOL", ...).
[[nodiscard]] constexpr std::string_view dtype_name(dtype t) noexcept { return detail::info_of(t).name; }
/// Bytes of one element of `t`.
[[nodiscard]] constexpr std::uint32_t dtype_bytes(dtype t) noexcept { return detail::info_of(t).bytes; }
/// ADL hook of ferry::detail::format: a dtype prints as its name.
[[nodiscard]] inline std::string to_string(dtype t) { return std::string{dtype_name(t)}; }

/// The dtype named `name` (safetensors' spelling, exact case), or false.
[[nodiscard]] constexpr bool parse_dtype(std::string_view name, dtype& out) noexcept
{
  for (const auto& i : detail::dtype_table) {
    if (i.name == name) {
      out = i.type;
      return true;
    }
  }
  return false;
}

/// Every dtype name, comma-separated (for error messages).
[[nodiscard]] inline std::string dtype_names()
{
  std::string s;
  for (const auto& i : detail::dtype_table) {
    if (!s.empty()) { s += ", "; }
    s += i.name;
  }
  return s;
}

}  // namespace ferry::d2h
