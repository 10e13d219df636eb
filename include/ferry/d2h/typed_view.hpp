// SPDX-License-Identifier: Apache-2.0
// A delivered entry as the tensor its hook schema says it is (hook_schema.hpp): the entry's bytes where the
// D2H put them (no copy), the element type, the shape [rows, *row_shape] and the hook's name. Valid while the
// entry_view is (and the schema). Host-only.
//
//   fd::channel<B> ch{cfg, b, {}, {}, schema};            // the channel's schema: ch.schema()
//   auto e = ch.try_pop();
//   const fd::typed_view t = fd::typed(*ch.schema(), *e);  // entry_shape_error for a hook it does not name
//   for (float x : t.as<float>()) { ... }                  // t.shape(): {rows, 1024}
#pragma once

#include <ferry/d2h/dtype.hpp>
#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/error.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry::d2h {

/// The dtype of a C++ element type (float, double, the fixed-width integers, bool), or none (a type of the
/// user's, e.g. a bfloat16 struct: typed_view::as<T>() then checks its size only).
template <class T>
[[nodiscard]] constexpr std::optional<dtype> dtype_of() noexcept
{
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) { return dtype::boolean; }
  else if constexpr (std::is_same_v<U, float>) { return dtype::f32; }
  else if constexpr (std::is_same_v<U, double>) { return dtype::f64; }
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
    if constexpr (sizeof(U) == 8) { return dtype::i64; }
    else if constexpr (sizeof(U) == 4) { return dtype::i32; }
    else if constexpr (sizeof(U) == 2) { return dtype::i16; }
    else { return dtype::i8; }
  } else if constexpr (std::is_integral_v<U>) {
    if constexpr (sizeof(U) == 8) { return dtype::u64; }
    else if constexpr (sizeof(U) == 4) { return dtype::u32; }
    else if constexpr (sizeof(U) == 2) { return dtype::u16; }
    else { return dtype::u8; }
  } else {
    return std::nullopt;
  }
}

/// An ok entry of a hook of a schema, typed: [rows, *row_shape] elements of the hook's dtype.
class typed_view {
 public:
  typed_view(const hook_spec& spec, std::span<const std::byte> bytes, std::vector<std::uint64_t> shape)
    : spec_{&spec}, bytes_{bytes}, shape_{std::move(shape)}
  {
  }
  [[nodiscard]] const hook_spec& spec() const noexcept { return *spec_; }
  [[nodiscard]] const std::string& name() const noexcept { return spec_->name; }
  [[nodiscard]] dtype type() const noexcept { return spec_->type; }
  /// [rows, *row_shape].
  [[nodiscard]] const std::vector<std::uint64_t>& shape() const noexcept { return shape_; }
  [[nodiscard]] std::uint64_t rows() const noexcept { return shape_[0]; }
  [[nodiscard]] std::uint64_t elements() const noexcept { return bytes_.size() / dtype_bytes(spec_->type); }
  /// The payload (the entry's bytes).
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }

  /// The elements as T (row-major over shape()). logic_error naming the hook when T is not the hook's dtype
  /// (dtype_of<T>()), or, for a T without one (a user's bfloat16), its size is not the element size; or the
  /// bytes are not aligned for T.
  template <class T>
  [[nodiscard]] std::span<const T> as() const
  {
    constexpr auto want = dtype_of<T>();
    if constexpr (want.has_value()) {
      FERRY_EXPECTS(*want == spec_->type, ferry::logic_error,
                    "typed view of hook {} \"{}\": expected elements of {} (the schema's dtype), got as<{}>()",
                    spec_->id.value, spec_->name, dtype_name(spec_->type), dtype_name(*want));
    } else {
      FERRY_EXPECTS(sizeof(T) == dtype_bytes(spec_->type), ferry::logic_error,
                    "typed view of hook {} \"{}\": expected an element type of {} bytes ({}), got one of {} bytes",
                    spec_->id.value, spec_->name, dtype_bytes(spec_->type), dtype_name(spec_->type), sizeof(T));
    }
    FERRY_EXPECTS(reinterpret_cast<std::uintptr_t>(bytes_.data()) % alignof(T) == 0, ferry::logic_error,
                  "typed view of hook {} \"{}\": expected bytes aligned to {} for its elements, got address {:#x}",
                  spec_->id.value, spec_->name, alignof(T), reinterpret_cast<std::uintptr_t>(bytes_.data()));
    return {reinterpret_cast<const T*>(bytes_.data()), bytes_.size() / sizeof(T)};
  }

 private:
  const hook_spec* spec_;
  std::span<const std::byte> bytes_;
  std::vector<std::uint64_t> shape_;
};

/// The payload `bytes` of an entry of `hook` (its own row size `entry_row_bytes`: entry_view::row_bytes(), 0
/// for an entry captured whole) as its hook's tensor in `schema`, wherever the bytes are (a channel's staging, a
/// shared-memory stream's segment: sink/shm_reader.hpp). Throws entry_shape_error (hook_schema::check) for a
/// hook the schema does not name, a size that is not a whole number of rows, or a capture_rows row size other
/// than the schema's.
[[nodiscard]] inline typed_view typed(const hook_schema& schema, hook_id hook, std::span<const std::byte> bytes,
                                      std::uint64_t entry_row_bytes)
{
  std::uint64_t rows = 0;
  const hook_spec& h = schema.check(hook, bytes.size(), entry_row_bytes, rows);
  std::vector<std::uint64_t> shape{rows};
  shape.insert(shape.end(), h.row_shape.begin(), h.row_shape.end());
  return typed_view{h, bytes, std::move(shape)};
}

/// The entry `e` as its hook's tensor in `schema` (above); and the entry's own errors as entry_view::bytes()
/// does (size_overflow_error, selection_error, a released view).
[[nodiscard]] inline typed_view typed(const hook_schema& schema, const entry_view& e)
{
  return typed(schema, e.hook(), e.bytes(), e.row_bytes());
}

}  // namespace ferry::d2h
