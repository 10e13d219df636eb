// SPDX-License-Identifier: Apache-2.0
// ferry/_torch_ops.so's shared part: the C ABI table it is bound to and the error path (a ferry exception raised
// through torch's op call), used by ops.cpp (the operators) and layouts.cpp (the refused layouts).
#pragma once

#include "../ferry_capi.h"

#include <Python.h>
#include <pybind11/pybind11.h>  // torch's own copy: its error_already_set is what torch's op call restores

#include <c10/util/Exception.h>

#include <atomic>
#include <string>

namespace ferry_torch {

/// The core module's C ABI table (torch.ops.ferry._bind_capi), shared by this library's files.
inline std::atomic<const ferry_capi*> g_capi{nullptr};

// In a Python process: the ferry exception itself (ferry.LogicError, ...), set by the core
// module and carried out through torch's op call as a pending Python error. Without Python (a C++ program):
// a c10 error whose prefix names the ferry type (ValueError for LogicError, RuntimeError otherwise).
[[noreturn]] inline void raise(int rc, const char* msg)
{
  const ferry_capi* api = g_capi.load(std::memory_order_acquire);
  if (api != nullptr && Py_IsInitialized() != 0) {
    // torch's op call from Python runs the kernel without the GIL: take it to build the error, then let
    // it go; torch takes it again to restore the error when the exception reaches its call wrapper.
    const PyGILState_STATE st = PyGILState_Ensure();
    api->set_python_error(rc, msg);
    pybind11::error_already_set e;
    PyGILState_Release(st);
    throw e;
  }
  const std::string what = std::string{"[ferry."} + ferry_status_name(rc) + "] " + msg;
  if (rc == FERRY_ERR_LOGIC) { throw c10::ValueError({__func__, __FILE__, __LINE__}, what); }
  throw c10::Error({__func__, __FILE__, __LINE__}, what);
}

[[noreturn]] inline void logic(const std::string& msg) { raise(FERRY_ERR_LOGIC, msg.c_str()); }

}  // namespace ferry_torch
