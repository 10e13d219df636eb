// SPDX-License-Identifier: Apache-2.0
// Argument conversion, streams: the backend traits, ferry.Stream (an owning stream), torch's stream and
// tensor types (looked up once torch is imported; no libtorch), and the resolution of a Python stream
// argument into a backend stream.
#pragma once

#include "gil.hpp"

#include <ferry/backend.hpp>
#include <ferry/error.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>  // every TU sees the same type casters (one definition of each inline)
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
        const nb::object dev = nb::steal(PyLong_FromLong(device));  // a small int: CPython's cached object
        PyObject* h = dev.is_valid() ? PyObject_CallOneArg(raw, dev.ptr()) : nullptr;  // vectorcall, no tuple
        if (h == nullptr) { throw nb::python_error(); }
        return from_int(nb::steal(h));
      }
    }
    if (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr())) { return from_int(obj); }
    if (nb::hasattr(obj, "__cuda_stream__")) {
      nb::object t = obj.attr("__cuda_stream__")();
      if (nb::isinstance<nb::tuple>(t) && nb::len(t) == 2) { return from_int(nb::tuple(t)[1]); }
      throw nb::type_error(
          ("ferry: " + std::string{who} + ": expected __cuda_stream__() to return (version, handle), got " + type_of(t))
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

/// What a graph captured with Stream.begin_capture / end_capture writes through: one Channel's or Publisher's
/// device memory. Its owner kills the tie (close, destruction) before that memory is freed; Graph.launch holds
/// every tie of the graph shared while it checks and enqueues, so a launch is either enqueued before the kill
/// (the free then waits for it: a host-backend free and cudaFree wait for queued work) or refused after it.
struct graph_tie {
  explicit graph_tie(std::string n) : name{std::move(n)} {}
  std::shared_mutex mu;
  std::atomic<const char*> dead{nullptr};  ///< nullptr while the memory lives; else "closed" or "destroyed"
  const std::string name;                  ///< "Channel(host, device 0, handle 3)"
  void kill(const char* how)
  {
    std::unique_lock l{mu};
    if (dead.load(std::memory_order_relaxed) == nullptr) { dead.store(how, std::memory_order_release); }
  }
  [[nodiscard]] bool alive() const noexcept { return dead.load(std::memory_order_acquire) == nullptr; }
};

/// The ties of the captures in progress, by stream handle: Stream.begin_capture opens an entry, every
/// producer call (Channel, Publisher) on a stream being captured adds its owner's tie, Stream.end_capture
/// hands them to the Graph. One relaxed load per call while no capture is open.
class capture_ties {
 public:
  static capture_ties& get()
  {
    static auto* t = new capture_ties;  // never destroyed: objects may tie or die during teardown
    return *t;
  }
  void begin(std::uintptr_t stream)
  {
    std::lock_guard l{mu_};
    by_stream_[stream].clear();
    open_.store(by_stream_.size(), std::memory_order_relaxed);
  }
  void tie(std::uintptr_t stream, const std::shared_ptr<graph_tie>& t)
  {
    if (open_.load(std::memory_order_relaxed) == 0) { return; }
    std::lock_guard l{mu_};
    auto it = by_stream_.find(stream);
    if (it == by_stream_.end()) { return; }
    for (const auto& x : it->second) {
      if (x == t) { return; }
    }
    it->second.push_back(t);
  }
  [[nodiscard]] std::vector<std::shared_ptr<graph_tie>> end(std::uintptr_t stream)
  {
    std::lock_guard l{mu_};
    std::vector<std::shared_ptr<graph_tie>> out;
    if (auto it = by_stream_.find(stream); it != by_stream_.end()) {
      out = std::move(it->second);
      by_stream_.erase(it);
    }
    open_.store(by_stream_.size(), std::memory_order_relaxed);
    return out;
  }

 private:
  std::mutex mu_;
  std::atomic<std::size_t> open_{0};
  std::map<std::uintptr_t, std::vector<std::shared_ptr<graph_tie>>> by_stream_;
};

/// Adds `t` to the capture in progress on `s`, if any (a producer call of t's owner on `s`).
template <class B>
void tie_to_capture(const fb::stream_view<B>& s, const std::shared_ptr<graph_tie>& t)
{
  capture_ties::get().tie(reinterpret_cast<std::uintptr_t>(s.handle()), t);
}

/// An executable graph (Stream.end_capture); the engine's own graphs (torch.cuda.CUDAGraph) work the same.
/// `ties`: the channels and publishers whose work it captured (graph_tie): a launch after one of them closed
/// is refused.
template <class B>
struct py_graph {
  typename B::graph_exec_type exec{};
  std::vector<std::shared_ptr<graph_tie>> ties;
  py_graph() = default;
  py_graph(const py_graph&) = delete;
  py_graph& operator=(const py_graph&) = delete;
  ~py_graph() { B{}.graph_exec_destroy(exec); }
};

/// Registers Stream and Graph of backend B in `m` (stream.cpp).
template <class B>
void init_streams(nb::module_& m);

}  // namespace ferry::python
