// SPDX-License-Identifier: Apache-2.0
// Channel.capture_rows (docs/api/python.md): conversion of the tensor and the selection arrays into the
// core's row_selection (ferry/d2h/row_selection.hpp); every rule about them (ranges, the reservation, what the
// kernel refuses) is the core's.
//   ch.capture_rows(hook, tensor, rows=idx)                                   the rows idx[0..n)
//   ch.capture_rows(hook, tensor, query_start_loc=qsl, requests=req)         the last token of each request
//   ch.capture_rows(hook, tensor, query_start_loc=qsl, requests=req, window=(a, b))
//   count=None (every element of rows / requests) | int (the first `count`) | a 1-element int32 device array
//   (a GPU-resolved count, at most max_count, default the array's length); stream=None as capture.
//   reduce="topk(K)" | "fp8_e4m3" | "mean" | "stats": the reducer's records instead of the rows (reducer.hpp);
//   capture_rows_deferred takes the reducers with a record per row (one launch per batch; the core refuses others).
#include "d2h_channel.hpp"

#include <optional>
#include <string>
#include <utility>

namespace ferry::python {

namespace {

/// An array argument as the selection kernel reads it: its address, first dimension, element bits, byte size.
struct rows_arg {
  const void* data{nullptr};
  std::uint64_t len{0};
  std::uint64_t nbytes{0};
  std::uint32_t bits{0};
  std::size_t ndim{0};
  bool integer{false};
  std::string dtype;  ///< for messages
};

/// A plain torch.Tensor on the channel's device read through its attributes (torch_fast_bytes, then shape and
/// dtype), never through __dlpack__: torch's __dlpack__ makes the legacy default stream wait for the current
/// one, which invalidates a CUDA graph capture (capture_rows inside torch.cuda.graph). False: not one.
template <class B>
bool torch_rows_arg(nb::handle obj, int device, rows_arg& out)
{
  array_bytes ab;
  if (!torch_fast_bytes<B>(obj, device, ab)) { return false; }
  const nb::object shape = nb::steal(PyObject_GetAttrString(obj.ptr(), "shape"));  // torch.Size: ints
  const nb::object dtype = nb::steal(PyObject_GetAttrString(obj.ptr(), "dtype"));
  const nb::object dts = dtype.is_valid() ? nb::steal(PyObject_Str(dtype.ptr())) : nb::object();
  const char* dtc = dts.is_valid() ? PyUnicode_AsUTF8(dts.ptr()) : nullptr;
  if (!shape.is_valid() || dtc == nullptr) { throw nb::python_error(); }
  const std::string dt = dtc;
  out.data = ab.data;
  out.nbytes = ab.nbytes;
  out.ndim = static_cast<std::size_t>(PySequence_Size(shape.ptr()));
  out.len = 0;
  if (out.ndim > 0) {
    const nb::object first = nb::steal(PySequence_GetItem(shape.ptr(), 0));
    out.len = first.is_valid() ? PyLong_AsUnsignedLongLong(first.ptr()) : 0;
    if (PyErr_Occurred() != nullptr) { throw nb::python_error(); }
  }
  out.integer = dt == "torch.int32" || dt == "torch.int64";
  out.bits = dt == "torch.int64" ? 64 : 32;
  out.dtype = dt;
  return true;
}

/// A 1-D C-contiguous index array in backend B's device memory of `device`, of int32 (or int64 where `wide`).
template <class B>
rows_arg index_array(nb::handle obj, int device, const char* name, bool wide)
{
  const std::string who = std::string{"Channel.capture_rows: "} + name;
  rows_arg r;
  if (!torch_rows_arg<B>(obj, device, r)) {
    any_array a = as_array(obj, who.c_str());
    check_device_array<B>(a, device, who);
    const auto d = a.dtype();
    r = {a.data(), a.ndim() > 0 ? a.shape(0) : 0, a.nbytes(), d.bits, a.ndim(),
         static_cast<nb::dlpack::dtype_code>(d.code) == nb::dlpack::dtype_code::Int && d.lanes == 1, dtype_str(d)};
  }
  if (r.ndim != 1 || !r.integer || !(r.bits == 32 || (wide && r.bits == 64))) {
    throw nb::type_error(("ferry: " + who + ": expected a 1-D " + (wide ? "int32 or int64" : "int32") +
                          " array, got a " + std::to_string(r.ndim) + "-d " + r.dtype + " one")
                             .c_str());
  }
  return r;
}

/// reduce="topk(K)" | "fp8_e4m3" | "mean" | "stats" (reducer.hpp's parse_reducer) of rows of `t`'s element type
/// (float32, float16 or bfloat16, by torch's or DLPack's name); none: plain rows.
std::optional<rows_reduce> reduce_of(nb::handle reduce, const rows_arg& t, std::uint64_t row_bytes, std::uint32_t hook)
{
  if (reduce.is_none()) { return std::nullopt; }
  std::string spec;
  if (!nb::try_cast(reduce, spec)) {
    throw nb::type_error(("ferry: Channel.capture_rows: expected reduce= a str ('topk(K)', 'fp8_e4m3', 'mean' or "
                          "'stats'), got " + type_of(reduce)).c_str());
  }
  rows_reduce r;
  FERRY_EXPECTS(fd::parse_reducer(spec, r.r), ferry::logic_error,
                "Channel.capture_rows (hook {}): expected reduce= 'topk(K)', 'fp8_e4m3', 'mean' or 'stats', got '{}'",
                hook, spec);
  const std::string& d = t.dtype;
  if (d == "torch.float32" || d == "float32") {
    r.in = fd::reduce_input::f32;
  } else if (d == "torch.float16" || d == "float16") {
    r.in = fd::reduce_input::f16;
  } else if (d == "torch.bfloat16" || d == "bfloat16") {
    r.in = fd::reduce_input::bf16;
  } else {
    throw nb::type_error(("ferry: Channel.capture_rows (hook " + std::to_string(hook) + "): expected reduce='" + spec +
                          "' of float32, float16 or bfloat16 rows, got " + (d.empty() ? "an untyped array" : d))
                             .c_str());
  }
  r.width = row_bytes / fd::input_bytes(r.in);
  return r;
}

nb::handle kw(const nb::kwargs& k, const char* name)
{
  return k.contains(name) ? nb::handle(k[name]) : nb::handle(Py_None);
}

}  // namespace

template <class B>
void py_channel<B>::capture_rows(std::uint32_t hook, nb::handle tensor, const nb::kwargs& k, bool deferred)
{
  const char* what = deferred ? "Channel.capture_rows_deferred" : "Channel.capture_rows";
  for (auto [key, v] : k) {
    const std::string n = nb::cast<std::string>(nb::str(key));
    if (n != "rows" && n != "query_start_loc" && n != "requests" && n != "window" && n != "count" &&
        n != "max_count" && n != "stream" && n != "reduce") {
      throw nb::type_error(("ferry: Channel.capture_rows: unexpected keyword '" + n +
                            "' (expected rows, query_start_loc, requests, window, count, max_count, stream, reduce)")
                             .c_str());
    }
  }
  auto s = resolve_stream<B>(kw(k, "stream"), dev_, what);
  rows_arg t;
  if (!torch_rows_arg<B>(tensor, dev_, t)) {  // not a plain torch tensor (or one the fast path leaves): DLPack
    const array_bytes ab = tensor_bytes<B>(tensor, dev_, what, hook);  // its checks (device, layout, conj bits)
    any_array a = as_array(tensor, what);
    t = {ab.data, a.ndim() > 0 ? a.shape(0) : 0, ab.nbytes, 0, a.ndim(), false, dtype_str(a.dtype())};
  }
  const std::uint64_t n_rows = t.len;
  const std::uint64_t row_bytes = n_rows > 0 ? t.nbytes / n_rows : 0;
  const nb::handle rows = kw(k, "rows");
  const nb::handle qsl = kw(k, "query_start_loc");
  const nb::handle req = kw(k, "requests");
  const nb::handle window = kw(k, "window");
  if (rows.is_none() == (req.is_none() || qsl.is_none())) {
    throw nb::type_error("ferry: Channel.capture_rows: expected either rows=, or query_start_loc= and requests= "
                         "(the last token, or window=(a, b), of each request)");
  }
  nb::list keep;  // the tensor and every selection array, alive until the kernel read them
  keep.append(tensor);
  fd::row_selection sel;
  std::uint64_t items = 0;
  if (!rows.is_none()) {
    const rows_arg r = index_array<B>(rows, dev_, "rows", true);
    items = r.len;
    sel = r.bits == 64 ? fd::row_selection::rows(static_cast<const std::int64_t*>(r.data), items)
                       : fd::row_selection::rows(static_cast<const std::int32_t*>(r.data), items);
    keep.append(rows);
  } else {
    const rows_arg q = index_array<B>(qsl, dev_, "query_start_loc", false);
    const rows_arg r = index_array<B>(req, dev_, "requests", false);
    items = r.len;
    const auto n_req = static_cast<std::uint32_t>(q.len > 0 ? q.len - 1 : 0);
    const auto* qp = static_cast<const std::int32_t*>(q.data);
    const auto* rp = static_cast<const std::int32_t*>(r.data);
    if (window.is_none()) {
      sel = fd::row_selection::last_token(qp, n_req, rp, items);
    } else {
      if (!nb::isinstance<nb::tuple>(window) || nb::len(window) != 2) {
        throw nb::type_error(
            ("ferry: Channel.capture_rows: expected window=(begin, end), got " + type_of(window)).c_str());
      }
      const nb::tuple w = nb::borrow<nb::tuple>(window);
      std::int64_t a = 0;
      std::int64_t b = 0;
      if (!nb::try_cast(w[0], a) || !nb::try_cast(w[1], b)) {
        throw nb::type_error("ferry: Channel.capture_rows: expected window=(begin, end) of two ints in [-2^63, 2^63)");
      }
      sel = fd::row_selection::window(qp, n_req, rp, items, a, b);
    }
    keep.append(qsl);
    keep.append(req);
  }
  const nb::handle count = kw(k, "count");
  uint_arg n;
  // An array (anything with __dlpack__) is a device count: never converted as an int, whose __index__ on a
  // one-element torch CUDA tensor is .item(), a device-to-host sync that invalidates a graph capture.
  const bool array = !count.is_none() && PyObject_HasAttrString(count.ptr(), "__dlpack__") != 0;
  if (!count.is_none() && !array && nb::try_cast(count, n)) {
    sel.count = n.get(what, "count");
    sel.max_count = sel.count;
    FERRY_EXPECTS(sel.count <= items, ferry::logic_error,
                  "Channel.capture_rows (hook {}): expected count <= the {} selected items given, got {}", hook, items,
                  sel.count);
  } else if (!count.is_none()) {
    const rows_arg c = index_array<B>(count, dev_, "count", false);
    const nb::handle mc = kw(k, "max_count");
    uint_arg m;
    if (!mc.is_none() && !nb::try_cast(mc, m)) {
      throw nb::type_error(("ferry: Channel.capture_rows: expected max_count an int, got " + type_of(mc)).c_str());
    }
    sel = sel.counted_on_device(static_cast<const std::int32_t*>(c.data),
                                mc.is_none() ? items : m.get(what, "max_count"));
    keep.append(count);
  }
  const std::optional<rows_reduce> red = reduce_of(kw(k, "reduce"), t, row_bytes, hook);
  fd::source_owner owner = py_source::make<B>(keep, array_bytes{}.dl, deferred);
  capture_rows_core(hook, t.data, n_rows, row_bytes, sel, s, std::move(owner), deferred, red ? &*red : nullptr);
}

/// The C ABI's capture_rows (capi.cpp): the stream resolved as capture_raw resolves it.
template <class B>
void py_channel<B>::capture_rows_raw(void* self, std::uint32_t hook, const void* ptr, std::uint64_t n_rows,
                                     std::uint64_t row_bytes, const fd::row_selection& sel, std::uintptr_t stream,
                                     fd::source_owner owner)
{
  auto& c = *static_cast<py_channel*>(self);
  std::shared_lock lk{c.mu_};
  auto& ch = c.live("capture_rows");
  const auto s = c.raw_stream(stream, hook, "capture_rows");
  c.tie(s);
  c.set_dev();
  ch.capture_rows(fd::hook_id{hook}, ptr, n_rows, row_bytes, sel, s, std::move(owner));
}

template void py_channel<fb::host_backend>::capture_rows_raw(void*, std::uint32_t, const void*, std::uint64_t,
                                                             std::uint64_t, const fd::row_selection&, std::uintptr_t,
                                                             fd::source_owner);
#if defined(FERRY_PYTHON_CUDA)
template void py_channel<fb::cuda_backend>::capture_rows_raw(void*, std::uint32_t, const void*, std::uint64_t,
                                                             std::uint64_t, const fd::row_selection&, std::uintptr_t,
                                                             fd::source_owner);
#endif
template void py_channel<fb::host_backend>::capture_rows(std::uint32_t, nb::handle, const nb::kwargs&, bool);
#if defined(FERRY_PYTHON_CUDA)
template void py_channel<fb::cuda_backend>::capture_rows(std::uint32_t, nb::handle, const nb::kwargs&, bool);
#endif

/// The stub signature of Channel.capture_rows / capture_rows_deferred (the same keywords, d2h_rows.cpp).
const char* rows_signature(const char* name)
{
  static std::string sigs[2];
  std::string& s = sigs[std::string{name} == "capture_rows" ? 0 : 1];
  s = std::string{"def "} + name +
      "(self, hook: int, tensor: object, *, rows: object | None = None, query_start_loc: object | None = None, "
      "requests: object | None = None, window: tuple[int, int] | None = None, count: object | None = None, "
      "max_count: int | None = None, stream: object | None = None, reduce: str | None = None) -> None";
  return s.c_str();
}

}  // namespace ferry::python
