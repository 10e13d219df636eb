// SPDX-License-Identifier: Apache-2.0
// Argument conversion, the torch fast path: the bytes of a plain torch.Tensor argument read without DLPack (by
// the tensor reader that ferry.torch_ops lends, tensor_reader.h, else through the tensor's Python attributes).
// arrays.hpp's tensor_bytes takes it first and the general DLPack path for anything it leaves alone.
#pragma once

#include "stream.hpp"
#include "tensor_reader.h"

#include <atomic>
#include <cstdint>

namespace ferry::python {

using any_array = nb::ndarray<nb::ro>;

/// The bytes of a tensor argument: its address and size; `dl` holds a DLPack import (the general path)
/// alive while the bytes are used (a bare DLPack capsule owns its memory). `version_read`: the tensor reader
/// read `version` too (-1: the tensor has no version counter), so a deferred capture need not ask again.
struct array_bytes {
  const void* data{nullptr};
  std::uint64_t nbytes{0};
  any_array dl{};
  long long version{-1};
  bool version_read{false};
};

/// The tensor reader lent by ferry/_torch_ops.so (tensor_reader.h; ferry._ferry._bind_tensor_reader), or null.
[[nodiscard]] inline std::atomic<const ferry_tensor_reader*>& tensor_reader_slot() noexcept
{
  static std::atomic<const ferry_tensor_reader*> r{nullptr};
  return r;
}
[[nodiscard]] inline const ferry_tensor_reader* tensor_reader() noexcept
{
  return tensor_reader_slot().load(std::memory_order_acquire);
}

namespace detail {
/// Interned attribute names of the torch fast path.
struct torch_names {
  PyObject* is_cpu{PyUnicode_InternFromString("is_cpu")};
  PyObject* is_cuda{PyUnicode_InternFromString("is_cuda")};
  PyObject* get_device{PyUnicode_InternFromString("get_device")};
  PyObject* is_contiguous{PyUnicode_InternFromString("is_contiguous")};
  PyObject* is_conj{PyUnicode_InternFromString("is_conj")};
  PyObject* is_neg{PyUnicode_InternFromString("is_neg")};
  PyObject* data_ptr{PyUnicode_InternFromString("data_ptr")};
  PyObject* nbytes{PyUnicode_InternFromString("nbytes")};
  PyObject* is_inference{PyUnicode_InternFromString("is_inference")};
  PyObject* version{PyUnicode_InternFromString("_version")};
};
inline const torch_names& names()
{
  static const torch_names n;
  return n;
}
/// 1 for True, 0 for False, -1 for anything else or an error (cleared).
inline int truth(PyObject* v) noexcept
{
  const int r = v == Py_True ? 1 : v == Py_False ? 0 : -1;
  if (v == nullptr) { PyErr_Clear(); }
  Py_XDECREF(v);
  return r;
}
inline int call_truth(PyObject* o, PyObject* name) noexcept { return truth(PyObject_CallMethodNoArgs(o, name)); }
inline long long as_ll(PyObject* v) noexcept
{
  long long r = -1;
  if (v != nullptr && PyLong_Check(v) != 0) { r = PyLong_AsLongLong(v); }
  if (v == nullptr || PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    r = -1;
  }
  Py_XDECREF(v);
  return r;
}
}  // namespace detail

/// The fast path of a tensor argument: a plain torch.Tensor (exact type, no libtorch: read by the tensor reader
/// where ferry.torch_ops lent one, else through its Python attributes; never through __dlpack__, which is a
/// Python-level method of torch costing several us)
/// that is C-contiguous, on backend B's device `device` (the cpu on the host backend), and has no conjugate
/// or negative bit (a tensor that requires grad is read as DLPack reads it). Returns false, with no Python
/// error pending, for anything else: the caller then takes the general DLPack path, which accepts or
/// refuses it with its own errors (so every bad input keeps the error it had).
template <class B>
[[nodiscard]] bool torch_fast_bytes(nb::handle obj, int device, array_bytes& out) noexcept
{
  PyTypeObject* tp = torch_tensor_type();
  if (tp == nullptr || Py_TYPE(obj.ptr()) != tp) { return false; }
  if (const ferry_tensor_reader* r = tensor_reader(); r != nullptr) {  // one C call, no attribute
    ferry_tensor_facts f{};
    if (r->read(obj.ptr(), &f) != 0 || f.dense == 0) { return false; }
    if constexpr (is_host<B>) {
      if (f.device_type != FERRY_TENSOR_CPU) { return false; }
    } else {
      if (f.device_type != FERRY_TENSOR_CUDA || f.device_index != device) { return false; }
    }
    out.data = f.data;
    out.nbytes = f.nbytes;
    out.version = f.version;
    out.version_read = true;
    return true;
  }
  const auto& n = detail::names();
  PyObject* o = obj.ptr();
  if constexpr (is_host<B>) {
    if (detail::truth(PyObject_GetAttr(o, n.is_cpu)) != 1) { return false; }
  } else {
    if (detail::truth(PyObject_GetAttr(o, n.is_cuda)) != 1) { return false; }
    if (detail::as_ll(PyObject_CallMethodNoArgs(o, n.get_device)) != device) { return false; }
  }
  if (detail::call_truth(o, n.is_contiguous) != 1 || detail::call_truth(o, n.is_conj) != 0 ||
      detail::call_truth(o, n.is_neg) != 0) {
    return false;
  }
  const long long bytes = detail::as_ll(PyObject_GetAttr(o, n.nbytes));
  if (bytes < 0) { return false; }
  PyObject* p = PyObject_CallMethodNoArgs(o, n.data_ptr);
  if (p == nullptr || PyLong_Check(p) == 0) {
    PyErr_Clear();
    Py_XDECREF(p);
    return false;
  }
  const auto addr = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(p));
  Py_DECREF(p);
  if (PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    return false;
  }
  out.data = reinterpret_cast<const void*>(addr);
  out.nbytes = static_cast<std::uint64_t>(bytes);
  return true;
}

}  // namespace ferry::python
