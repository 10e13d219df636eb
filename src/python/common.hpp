// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the Python bindings: backend traits, the ferry.Stream owner, stream and array
// resolution, and the error types.
#pragma once

#include <ferry/backend.hpp>
#include <ferry/error.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>

#if defined(FERRY_PYTHON_CUDA)
#include <ferry/backend/cuda/backend.hpp>
#endif

namespace ferry::python {

namespace nb = nanobind;
namespace fb = ferry::backend;

template <class B>
struct traits;

template <>
struct traits<fb::host_backend> {
  static constexpr const char* name = "host";
  static constexpr int dl_device = nb::device::cpu::value;  // host backend "device memory" is host memory
  static constexpr const char* dl_device_name = "cpu";
};

#if defined(FERRY_PYTHON_CUDA)
template <>
struct traits<fb::cuda_backend> {
  static constexpr const char* name = "cuda";
  static constexpr int dl_device = nb::device::cuda::value;
  static constexpr const char* dl_device_name = "cuda";
};
#endif

template <class B>
inline constexpr bool is_host = std::is_same_v<B, fb::host_backend>;

/// Interpreter exit. CPython (before 3.14) ends a daemon thread that takes the GIL back after finalization
/// began with pthread_exit, and its forced unwinding through a C++ destructor (a GIL guard's) aborts the
/// whole process ("terminate called without an active exception"): a daemon thread polling a channel at
/// exit would crash the interpreter. ferry's atexit hook (module.cpp; atexit runs before finalization)
/// marks the exit, then waits, the GIL released, at most `exit_wait` for every ferry call that released
/// the GIL to take it back; from then on no ferry call releases the GIL and poll() does not wait, so such a
/// thread ends in Python code, outside ferry. (A call still blocked after exit_wait is not covered.)
struct exit_state {
  static constexpr std::chrono::seconds exit_wait{2};
  std::atomic<bool> exiting{false};
  std::mutex mu;
  std::condition_variable cv;
  int in_flight{0};  ///< calls between releasing and retaking the GIL (guarded by mu)
};
/// The process-wide exit state (never destroyed: threads may still use it while the module is torn down).
[[nodiscard]] inline exit_state& exit_state_of_process()
{
  static auto* s = new exit_state;
  return *s;
}
[[nodiscard]] inline bool interpreter_exiting() noexcept
{
  return exit_state_of_process().exiting.load(std::memory_order_acquire);
}

/// Releases the GIL for a blocking or long call (nb::gil_scoped_release), except after interpreter exit
/// began (exit_state); counted, so the atexit hook can wait for the call to take the GIL back.
/// Construct it with the GIL held.
class gil_release {
 public:
  gil_release()
  {
    if (interpreter_exiting()) { return; }  // read under the GIL: the hook sets it under the GIL too
    auto& st = exit_state_of_process();
    {
      std::lock_guard l{st.mu};
      ++st.in_flight;
    }
    save_ = PyEval_SaveThread();
  }
  ~gil_release()
  {
    if (save_ == nullptr) { return; }
    PyEval_RestoreThread(save_);
    auto& st = exit_state_of_process();
    std::lock_guard l{st.mu};
    if (--st.in_flight == 0) { st.cv.notify_all(); }
  }
  gil_release(const gil_release&) = delete;
  gil_release& operator=(const gil_release&) = delete;

 private:
  PyThreadState* save_{nullptr};
};

/// The atexit hook's body (called with the GIL held): marks the exit, then waits, the GIL released, up to
/// exit_wait for the calls in flight to take the GIL back.
inline void on_interpreter_exit()
{
  auto& st = exit_state_of_process();
  st.exiting.store(true, std::memory_order_release);
  PyThreadState* save = PyEval_SaveThread();
  {
    std::unique_lock l{st.mu};
    st.cv.wait_for(l, exit_state::exit_wait, [&] { return st.in_flight == 0; });
  }
  PyEval_RestoreThread(save);
}

/// ferry.Stream: an owning stream of backend B (the host backend's only stream type; on CUDA a
/// non-blocking stream usable wherever an int handle or torch stream is).
template <class B>
struct py_stream {
  explicit py_stream(int device)
  {
    B b{};
    b.set_device(fb::device_id{device});
    s.emplace(b);
    dev = device;
  }
  std::optional<fb::stream<B>> s;
  int dev{0};
  [[nodiscard]] typename B::stream_type handle() const
  {
    FERRY_EXPECTS(s.has_value(), ferry::logic_error, "ferry.Stream: expected an open stream, got a closed one");
    return s->handle();
  }
};

[[nodiscard]] inline std::string type_of(nb::handle h)
{
  return nb::cast<std::string>(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr()))).attr("__name__"));
}

/// sys.modules["torch"] (borrowed), or nullptr while torch is not imported.
[[nodiscard]] inline PyObject* torch_module() noexcept
{
  PyObject* mods = PyImport_GetModuleDict();  // borrowed
  return mods != nullptr ? PyDict_GetItemString(mods, "torch") : nullptr;
}

/// torch._C._cuda_getCurrentRawStream (an int per device index), looked up once torch is imported; nullptr
/// before that or where torch has none (then the caller takes torch.cuda.current_stream()).
[[nodiscard]] inline PyObject* torch_current_raw_stream() noexcept
{
  static PyObject* fn = nullptr;  // a strong reference kept for the process
  static bool missing = false;
  if (fn != nullptr || missing) { return fn; }
  PyObject* torch = torch_module();
  if (torch == nullptr) { return nullptr; }
  PyObject* c = PyObject_GetAttrString(torch, "_C");
  PyObject* f = c != nullptr ? PyObject_GetAttrString(c, "_cuda_getCurrentRawStream") : nullptr;
  Py_XDECREF(c);
  if (f == nullptr || PyCallable_Check(f) == 0) {
    PyErr_Clear();
    Py_XDECREF(f);
    missing = true;
    return nullptr;
  }
  fn = f;
  return fn;
}

/// The exact type torch.Tensor (subclasses are not matched), looked up once torch is imported.
[[nodiscard]] inline PyTypeObject* torch_tensor_type() noexcept
{
  static PyTypeObject* tp = nullptr;  // a strong reference kept for the process
  if (tp != nullptr) { return tp; }
  PyObject* torch = torch_module();
  if (torch == nullptr) { return nullptr; }
  PyObject* t = PyObject_GetAttrString(torch, "Tensor");
  if (t == nullptr || PyType_Check(t) == 0) {
    PyErr_Clear();
    Py_XDECREF(t);
    return nullptr;
  }
  tp = reinterpret_cast<PyTypeObject*>(t);
  return tp;
}

/// Resolves a Python stream argument. Host backend: a ferry.Stream of the host backend. CUDA: a
/// ferry.Stream, an int handle, an object with __cuda_stream__ (returns (version, handle)), a
/// torch.cuda.Stream (its cuda_stream attribute), or None for torch's current stream on `device`.
template <class B>
[[nodiscard]] fb::stream_view<B> resolve_stream(nb::handle obj, int device, const char* who)
{
  using handle_type = typename B::stream_type;
  if (nb::isinstance<py_stream<B>>(obj)) { return fb::stream_view<B>{B{}, nb::cast<py_stream<B>&>(obj).handle()}; }
  if constexpr (!is_host<B>) {
    auto from_int = [&](nb::handle v) {
      return fb::stream_view<B>{B{}, reinterpret_cast<handle_type>(nb::cast<std::uintptr_t>(v))};
    };
    if (obj.is_none()) {
      // torch's current stream of `device` as an int (no torch.cuda.Stream object is built per call)
      if (PyObject* raw = torch_current_raw_stream(); raw != nullptr) {
        PyObject* h = PyObject_CallFunction(raw, "i", device);
        if (h == nullptr) { throw nb::python_error(); }
        return from_int(nb::steal(h));
      }
    }
    if (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr())) { return from_int(obj); }
    if (nb::hasattr(obj, "__cuda_stream__")) {
      nb::object t = obj.attr("__cuda_stream__")();
      if (nb::isinstance<nb::tuple>(t) && nb::len(t) == 2) { return from_int(nb::tuple(t)[1]); }
      throw nb::type_error(("ferry: " + std::string{who} + ": expected __cuda_stream__() to return (version, handle), got " +
                            type_of(t))
                             .c_str());
    }
    if (nb::hasattr(obj, "cuda_stream")) { return from_int(obj.attr("cuda_stream")); }
    if (obj.is_none()) {
      nb::dict mods = nb::borrow<nb::dict>(nb::module_::import_("sys").attr("modules"));
      if (mods.contains("torch")) {
        return from_int(mods["torch"].attr("cuda").attr("current_stream")(device).attr("cuda_stream"));
      }
    }
    throw nb::type_error(("ferry: " + std::string{who} +
                          ": expected a stream (ferry.Stream, an int handle, an object with __cuda_stream__, a "
                          "torch.cuda.Stream, or None with torch imported), got " +
                          type_of(obj))
                           .c_str());
  } else {
    throw nb::type_error(("ferry: " + std::string{who} + ": expected a ferry.Stream of the host backend, got " +
                          type_of(obj) + " (the host backend has no int, __cuda_stream__ or default streams)")
                           .c_str());
  }
}

using any_array = nb::ndarray<nb::ro>;

/// The bytes of a tensor argument: its address and size; `dl` holds a DLPack import (the general path)
/// alive while the bytes are used (a bare DLPack capsule owns its memory).
struct array_bytes {
  const void* data{nullptr};
  std::uint64_t nbytes{0};
  any_array dl{};
};

/// Any object with __dlpack__ (or the buffer protocol) as an array; TypeError otherwise.
[[nodiscard]] inline any_array as_array(nb::handle obj, const char* who)
{
  any_array a;
  if (!nb::try_cast<any_array>(obj, a)) {
    throw nb::type_error(("ferry: " + std::string{who} + ": expected an array (an object with __dlpack__), got " +
                          type_of(obj))
                           .c_str());
  }
  return a;
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

/// The fast path of a tensor argument: a plain torch.Tensor (exact type, no libtorch: read through its
/// Python attributes, not through __dlpack__, which is a Python-level method of torch costing several us)
/// that is C-contiguous, on backend B's device `device` (the cpu on the host backend), and has no conjugate
/// or negative bit (a tensor that requires grad is read as DLPack reads it). Returns false, with no Python
/// error pending, for anything else: the caller then takes the general DLPack path, which accepts or
/// refuses it with its own errors (so every bad input keeps the error it had).
template <class B>
[[nodiscard]] bool torch_fast_bytes(nb::handle obj, int device, array_bytes& out) noexcept
{
  PyTypeObject* tp = torch_tensor_type();
  if (tp == nullptr || Py_TYPE(obj.ptr()) != tp) { return false; }
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

/// Bytes of a C-contiguous array (size-1 dimensions may have any stride); raises LogicError otherwise.
[[nodiscard]] inline bool c_contiguous(const any_array& a)
{
  std::int64_t expect = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) { return false; }
    expect *= static_cast<std::int64_t>(a.shape(i));
  }
  return true;
}

[[nodiscard]] inline std::string dtype_str(nb::dlpack::dtype d)
{
  const char* k = "?";
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: k = "int"; break;
    case nb::dlpack::dtype_code::UInt: k = "uint"; break;
    case nb::dlpack::dtype_code::Float: k = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: k = "bfloat"; break;
    case nb::dlpack::dtype_code::Bool: k = "bool"; break;
    case nb::dlpack::dtype_code::Complex: k = "complex"; break;
    default: break;
  }
  return std::string{k} + std::to_string(d.bits);
}

/// Checks that `a` is a C-contiguous array in backend B's device memory on `device`.
template <class B>
void check_device_array(const any_array& a, int device, const std::string& who)
{
  FERRY_EXPECTS(a.device_type() == traits<B>::dl_device, ferry::logic_error,
                "{}: expected a {} array ({} backend), got one on DLPack device type {}{}", who,
                traits<B>::dl_device_name, traits<B>::name, a.device_type(),
                a.device_type() == nb::device::cpu::value ? " (a host array where a device tensor is needed)"
                : is_host<B>                              ? " (a device tensor where the host backend needs a host array)"
                                                          : "");
  if constexpr (!is_host<B>) {
    FERRY_EXPECTS(a.device_id() == device, ferry::logic_error, "{}: expected a tensor on device {}, got device {}",
                  who, device, a.device_id());
  }
  FERRY_EXPECTS(c_contiguous(a), ferry::logic_error, "{}: expected a C-contiguous array, got a strided one ({}-d)",
                who, a.ndim());
}

/// The Python exception types (ferry.Error and subclasses), created once by the module.
struct exceptions {
  PyObject* error{nullptr};
  PyObject* logic{nullptr};
  PyObject* oom{nullptr};
  PyObject* timeout{nullptr};
  PyObject* invalidated{nullptr};
  PyObject* backend{nullptr};
  PyObject* shutdown{nullptr};
  PyObject* size_overflow{nullptr};
};
inline exceptions& errors()
{
  static exceptions e;
  return e;
}

}  // namespace ferry::python
