// SPDX-License-Identifier: Apache-2.0
// A d2h::config or d2h::tuning field from and to Python, by the field's C++ type (d2h/detail/fields.hpp lists
// the fields): assign converts a given value (ints in range, bools, enums by name, durations in seconds) or
// throws LogicError naming the keyword, the expected and the given value; literal and annotation write the
// field's default and type into the generated stub's signature.
#pragma once

#include "d2h_channel.hpp"

#include <ferry/d2h/detail/fields.hpp>

#include <chrono>
#include <limits>
#include <string>
#include <type_traits>

namespace ferry::python::fields {

template <class T>
inline constexpr bool is_duration = false;
template <class R, class P>
inline constexpr bool is_duration<std::chrono::duration<R, P>> = true;

/// `v` (a Python value of keyword `name`) as the field's type: ints in range, bools, enums by name,
/// durations in seconds; LogicError naming the keyword, the expected and the given value otherwise.
template <class T>
inline void assign(T& field, nb::handle v, const char* name)
{
  if constexpr (std::is_same_v<T, bool>) {
    FERRY_EXPECTS(PyBool_Check(v.ptr()) != 0, ferry::logic_error, "Channel: expected {} a bool, got {}", name,
                  type_of(v));
    field = v.ptr() == Py_True;
  } else if constexpr (std::is_integral_v<T>) {
    FERRY_EXPECTS(PyLong_Check(v.ptr()) != 0 && PyBool_Check(v.ptr()) == 0, ferry::logic_error,
                  "Channel: expected {} an int, got {}", name, type_of(v));
    const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
    const bool bad = PyErr_Occurred() != nullptr || x > std::numeric_limits<T>::max();
    PyErr_Clear();
    FERRY_EXPECTS(!bad, ferry::logic_error, "Channel: expected {} an int in [0, {}], got {}", name,
                  std::numeric_limits<T>::max(), nb::cast<std::string>(nb::str(v)));
    field = static_cast<T>(x);
  } else if constexpr (std::is_enum_v<T>) {
    std::string names;
    for (const auto& [n, e] : fd::detail::enum_names<T>::values) {
      if (nb::isinstance<nb::str>(v) && nb::cast<std::string>(v) == n) {
        field = e;
        return;
      }
      names += (names.empty() ? "'" : ", '") + std::string{n} + "'";
    }
    FERRY_FAIL(ferry::logic_error, "Channel: expected {} one of {}, got {}", name, names,
               nb::cast<std::string>(nb::repr(v)));
  } else {
    static_assert(is_duration<T>, "a config field of a type the binding cannot convert");
    const bool num = PyFloat_Check(v.ptr()) != 0 || (PyLong_Check(v.ptr()) != 0 && PyBool_Check(v.ptr()) == 0);
    const double s = num ? PyFloat_AsDouble(v.ptr()) : -1.0;  // an int past a double's range: OverflowError
    const bool overflow = PyErr_Occurred() != nullptr;
    PyErr_Clear();
    FERRY_EXPECTS(num && !overflow, ferry::logic_error, "Channel: expected {} a number of seconds, got {}", name,
                  nb::cast<std::string>(nb::repr(v)));
    field = std::chrono::duration_cast<T>(std::chrono::duration<double>(seconds_arg(s, "Channel", name)));
  }
}

/// The Python literal of a field's default (the stub's signature).
template <class T>
inline std::string literal(const T& v)
{
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "True" : "False";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else if constexpr (std::is_enum_v<T>) {
    for (const auto& [n, e] : fd::detail::enum_names<T>::values) {
      if (e == v) { return "'" + std::string{n} + "'"; }
    }
    return "None";
  } else {
    return nb::cast<std::string>(nb::repr(nb::float_(std::chrono::duration<double>(v).count())));
  }
}
template <class T>
inline const char* annotation()
{
  if constexpr (std::is_same_v<T, bool>) {
    return "bool";
  } else if constexpr (std::is_integral_v<T>) {
    return "int";
  } else if constexpr (std::is_enum_v<T>) {
    return "str";
  } else {
    return "float";
  }
}

}  // namespace ferry::python::fields
