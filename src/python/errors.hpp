// SPDX-License-Identifier: Apache-2.0
// ferry's errors in Python: ONE table from the C++ error types to a ferry_status (ferry_capi.h), and from a
// status to its Python exception class (ferry.LogicError, ...), used by the module's exception translator,
// the C ABI's status codes and its set_python_error (the torch ops raise through it).
#pragma once

#include "ferry_capi.h"

#include "stream.hpp"

#include <array>
#include <exception>

namespace ferry::python {

namespace nb = nanobind;

inline constexpr int status_count = FERRY_ERR_ATTRIBUTION_OVERFLOW + 1;

/// The Python exception classes by ferry_status (index FERRY_ERR_OTHER: ferry.Error), created by init_errors.
inline std::array<PyObject*, status_count>& exception_types()
{
  static std::array<PyObject*, status_count> t{};
  return t;
}
[[nodiscard]] inline PyObject* exception_of(int status)
{
  const auto& t = exception_types();
  return status > FERRY_OK && status < status_count ? t[static_cast<std::size_t>(status)] : t[FERRY_ERR_OTHER];
}

/// The ferry_status of an exception of ferry's (FERRY_ERR_OTHER for ferry::error and anything else).
[[nodiscard]] int status_of(const std::exception& e) noexcept;

/// Sets the Python error of `status` with message `msg` (the GIL held).
void set_python_error(int status, const char* msg);

/// Creates ferry.Error and its subclasses in `m` and registers the translator of ferry's C++ errors.
void init_errors(nb::module_& m);

}  // namespace ferry::python
