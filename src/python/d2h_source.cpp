// SPDX-License-Identifier: Apache-2.0
// py_source: the owner of a source given from Python (d2h_channel.hpp), and its version check.
#include "d2h_channel.hpp"

namespace ferry::python {

namespace {

/// torch's version counter of `o` (`ok`: it has one). Only a torch tensor that is not an inference tensor
/// has one: a plain torch.Tensor is read by the tensor reader where ferry.torch_ops lent one (arrays.hpp);
/// otherwise asking an inference tensor for it raises (a c10::Error with a backtrace, ~10 us), so
/// is_inference() is asked first, and an object without it (numpy, CuPy, ...) has no counter.
long long read_version(PyObject* o, bool& ok)
{
  ok = false;
  if (const ferry_tensor_reader* r = tensor_reader(); r != nullptr) {
    if (PyTypeObject* tp = torch_tensor_type(); tp != nullptr && Py_TYPE(o) == tp) {
      const long long v = r->version_of(o);
      ok = v >= 0;
      return ok ? v : 0;
    }
  }
  const auto& n = detail::names();
  const int inference = detail::call_truth(o, n.is_inference);  // -1: no such method (or it failed)
  if (inference != 0) { return 0; }                             // an inference tensor, or not a tensor
  PyObject* v = PyObject_GetAttr(o, n.version);
  ok = v != nullptr && PyLong_Check(v) != 0;
  const long long r = ok ? PyLong_AsLongLong(v) : 0;
  Py_XDECREF(v);
  if (!ok || PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    ok = false;
    return 0;
  }
  return r;
}

}  // namespace

template <class B>
fd::source_owner py_source::make(nb::handle obj, any_array dl, bool deferred, const long long* known_version)
{
  auto* p = new py_source{nb::borrow(obj), std::move(dl), 0, false, {}};
  if (deferred && PyList_Check(obj.ptr()) != 0) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(obj.ptr()); ++i) {
      bool ok = false;
      const long long v = read_version(PyList_GET_ITEM(obj.ptr(), i), ok);
      p->item_versions.push_back(ok ? v : -1);
    }
  } else if (deferred && known_version != nullptr) {  // read with the bytes (the tensor reader)
    p->versioned = *known_version >= 0;
    p->version = p->versioned ? *known_version : 0;
  } else if (deferred) {
    p->version = read_version(obj.ptr(), p->versioned);
  }
  fd::source_owner o;
  o.keep = std::shared_ptr<void>(p, [](void* q) {
    graveyard::get().give(q, [](void* r) { delete static_cast<py_source*>(r); });
  });
  o.unchanged = deferred ? &py_source::unchanged : nullptr;
  o.host_written = is_host<B>;  // NumPy arrays and torch CPU tensors are written by host code directly
  return o;
}

long long py_source::version_now(PyObject* o, bool& ok) { return read_version(o, ok); }

std::size_t py_source::unchanged(void* const* owners, std::size_t n)
{
  nb::gil_scoped_acquire g;
  for (std::size_t i = 0; i < n; ++i) {
    const auto* p = static_cast<const py_source*>(owners[i]);
    for (std::size_t k = 0; k < p->item_versions.size(); ++k) {
      if (p->item_versions[k] < 0) { continue; }
      bool ok = false;
      const long long now = read_version(PyList_GET_ITEM(p->obj.ptr(), static_cast<Py_ssize_t>(k)), ok);
      if (!ok || now != p->item_versions[k]) { return i; }
    }
    if (!p->versioned) { continue; }
    bool ok = false;
    const long long now = read_version(p->obj.ptr(), ok);
    if (!ok || now != p->version) { return i; }
  }
  return n;
}

template fd::source_owner py_source::make<fb::host_backend>(nb::handle, any_array, bool, const long long*);
#if defined(FERRY_PYTHON_CUDA)
template fd::source_owner py_source::make<fb::cuda_backend>(nb::handle, any_array, bool, const long long*);
#endif

}  // namespace ferry::python
