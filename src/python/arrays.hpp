// SPDX-License-Identifier: Apache-2.0
// Argument conversion, tensors: the bytes of a tensor argument (a plain torch.Tensor through the fast path of
// torch_fast.hpp, anything else through DLPack), and the checks that it lies contiguously in the backend's
// device memory.
#pragma once

#include "torch_fast.hpp"

#include <cstdint>
#include <string>
#include <type_traits>

namespace ferry::python {

/// A buffer of `obj` held for a scope (PyObject_GetBuffer with `flags`): a TypeError "<expected>, got <type>" when
/// it has none (`expected`: the call, the argument and what it takes).
struct held_buffer {
  Py_buffer view{};
  held_buffer(nb::handle obj, int flags, const std::string& expected)
  {
    if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
      PyErr_Clear();
      throw nb::type_error(
        (expected + ", got " + nb::cast<std::string>(nb::str(obj.type().attr("__name__")))).c_str());
    }
  }
  ~held_buffer() { PyBuffer_Release(&view); }
  held_buffer(const held_buffer&) = delete;
  held_buffer& operator=(const held_buffer&) = delete;
};

/// An unsigned integer argument (a count, a capacity, a slot): the binding accepts any Python int and get()
/// range-checks it with a ferry LogicError naming the call, the argument and its range (nanobind's own
/// unsigned conversion answers a negative or too-large int with "incompatible function arguments").
struct uint_arg {
  std::uint64_t value{0};
  long long negative{0};  ///< the value, when below 0
  bool too_large{false};  ///< at least 2^64
  [[nodiscard]] std::uint64_t get(const char* who, const char* name, std::uint64_t max = UINT64_MAX) const
  {
    FERRY_EXPECTS(negative == 0 && !too_large && value <= max, ferry::logic_error,
                  "{}: expected {} an int in [0, {}], got {}", who, name, max,
                  negative != 0 ? std::to_string(negative)
                  : too_large   ? std::string{">= 2^64"}
                                : std::to_string(value));
    return value;
  }
};

/// The longest wait or sleep a seconds-valued argument may ask for (about 31 years): far inside what the
/// core's durations hold (milliseconds, microseconds, and steady_clock::now() plus it in nanoseconds).
inline constexpr double max_seconds = 1e9;

/// A seconds-valued float argument (a timeout, a sleep), checked before it becomes a duration (a float-to-int
/// conversion of nan, inf or 1e300 is undefined): nan or a value outside [lo, hi] is a ferry LogicError naming
/// the call, the argument, the range and the value. The one check of every float->duration conversion.
[[nodiscard]] inline double seconds_arg(double s, const char* who, const char* name, double lo = 0.0,
                                        double hi = max_seconds)
{
  FERRY_EXPECTS(s >= lo && s <= hi, ferry::logic_error, "{}: expected {} a number of seconds in [{}, {}], got {}", who,
                name, lo, hi, s);
  return s;
}

/// A sink's counters as a dict: `for_each(f)` calls f(name, value) per field (the core's field list); an empty
/// string (no error) becomes None.
template <class ForEach>
[[nodiscard]] nb::dict fields_dict(ForEach&& for_each)
{
  nb::dict d;
  for_each([&](const char* name, const auto& v) {
    using T = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::string>) {
      d[name] = v.empty() ? nb::none() : nb::cast(v);
    } else {
      d[name] = v;
    }
  });
  return d;
}

/// Any object with __dlpack__ (or the buffer protocol) as an array; TypeError otherwise.
[[nodiscard]] inline any_array as_array(nb::handle obj, const char* who)
{
  any_array a;
  if (!nb::try_cast<any_array>(obj, a)) {
    // An array of Python objects (numpy dtype object) has no bytes to export: say so, not only its type.
    std::string what = type_of(obj);
    if (nb::hasattr(obj, "dtype")) {
      const nb::object dt = obj.attr("dtype");
      if (nb::hasattr(dt, "kind") && nb::cast<std::string>(nb::str(nb::object(dt.attr("kind")))) == "O") {
        what += " of dtype object (an array of numbers or bools is needed)";
      }
    }
    throw nb::type_error(
      ("ferry: " + std::string{who} + ": expected an array (an object with __dlpack__), got " + what).c_str());
  }
  return a;
}


/// Bytes of a C-contiguous array (size-1 dimensions may have any stride); raises LogicError otherwise.
[[nodiscard]] inline bool c_contiguous(const any_array& a)
{
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    if (a.shape(i) == 0) { return true; }  // no element: no layout (its strides may be anything)
  }
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
                : is_host<B> ? " (a device tensor where the host backend needs a host array)"
                             : "");
  if constexpr (!is_host<B>) {
    FERRY_EXPECTS(a.device_id() == device, ferry::logic_error, "{}: expected a tensor on device {}, got device {}",
                  who, device, a.device_id());
  }
  FERRY_EXPECTS(c_contiguous(a), ferry::logic_error, "{}: expected a C-contiguous array, got a strided one ({}-d)",
                who, a.ndim());
}

/// A captured tensor's bytes: a plain torch.Tensor through the fast path (torch_fast_bytes), anything else
/// (and a torch tensor the fast path leaves alone) through DLPack, checked by check_device_array.
template <class B>
[[nodiscard]] array_bytes tensor_bytes(nb::handle tensor, int device, const char* what, std::uint32_t hook)
{
  array_bytes out;
  if (torch_fast_bytes<B>(tensor, device, out)) { return out; }
  // A torch tensor with the conjugate or negative bit holds its values un-negated in memory (the bit is a lazy
  // view): its bytes are not its values, so it is refused, not copied (DLPack may export the raw memory).
  if (PyTypeObject* tp = torch_tensor_type(); tp != nullptr && PyObject_TypeCheck(tensor.ptr(), tp) != 0) {
    const auto& n = detail::names();
    FERRY_EXPECTS(
        detail::call_truth(tensor.ptr(), n.is_conj) != 1 && detail::call_truth(tensor.ptr(), n.is_neg) != 1,
        ferry::logic_error,
        "{} (hook {}): expected a tensor whose memory holds its values, got one with the conjugate or negative "
        "bit set (call .resolve_conj() / .resolve_neg() first)",
        what, hook);
  }
  any_array t = as_array(tensor, what);
  check_device_array<B>(t, device, std::string{what} + " (hook " + std::to_string(hook) + ")");
  out.data = t.data();
  out.nbytes = t.nbytes();
  out.dl = std::move(t);
  return out;
}

}  // namespace ferry::python

namespace nanobind::detail {
/// uint_arg from any Python int or integer-like object (__index__: numpy's integers), not a bool; rendered as
/// `int` in the stubs.
template <>
struct type_caster<ferry::python::uint_arg> {
  NB_TYPE_CASTER(ferry::python::uint_arg, const_name("int"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept
  {
    if (PyBool_Check(src.ptr()) != 0) { return false; }
    object as_int;
    if (PyLong_Check(src.ptr()) == 0) {
      if (PyIndex_Check(src.ptr()) == 0) { return false; }
      as_int = steal(PyNumber_Index(src.ptr()));
      if (!as_int.is_valid()) {
        PyErr_Clear();
        return false;
      }
    }
    PyObject* n = as_int.is_valid() ? as_int.ptr() : src.ptr();
    value = {};
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (overflow < 0) {
      value.negative = -1;  // below -2^63: any negative value says it
    } else if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(n);
      if (PyErr_Occurred() != nullptr) {
        PyErr_Clear();
        value.too_large = true;
      } else {
        value.value = u;
      }
    } else if (v < 0) {
      value.negative = v;
    } else {
      value.value = static_cast<std::uint64_t>(v);
    }
    return true;
  }
  static handle from_cpp(const ferry::python::uint_arg& v, rv_policy, cleanup_list*) noexcept
  {
    return PyLong_FromUnsignedLongLong(v.value);
  }
};
}  // namespace nanobind::detail

