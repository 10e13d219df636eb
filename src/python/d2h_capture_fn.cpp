// SPDX-License-Identifier: Apache-2.0
// Channel.capture_fn: ferry.hooks' capture call site, capture(hook, tensor), as one C++ function per (channel,
// stream, deferred choice). Conversion only, as Channel.capture / capture_deferred make it: the stream argument
// resolved once where it is a fixed one (a ferry.Stream, whose handle is still read per call since it may be
// closed, or an int handle), the deferred hook ids held as a table, and a plain dense torch.Tensor read by the
// fast path (torch_fast.hpp: the tensor reader, no Python call, where ferry.torch_ops lent it). Anything else
// (a tensor that is strided, of another layout or device, a subclass, a hook that is not an int in range)
// goes through `prepare(hook, tensor)` (ferry.hooks: detach, contiguous, the layout error) and then
// Channel.capture / capture_deferred themselves, so every input keeps the result and the error it had.
#include "d2h_channel.hpp"

#include <algorithm>
#include <memory>
#include <vector>

namespace ferry::python {

namespace {

/// A hook id that is an int in [0, 2^32) (anything else: the general path's error).
bool int_hook(nb::handle hook, std::uint32_t& out) noexcept
{
  if (PyLong_CheckExact(hook.ptr()) == 0) { return false; }
  const unsigned long long v = PyLong_AsUnsignedLongLong(hook.ptr());
  if (PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    return false;
  }
  if (v > UINT32_MAX) { return false; }
  out = static_cast<std::uint32_t>(v);
  return true;
}

/// Which hook ids a capture_fn captures deferred: none, all, or a set (a bitmap below 2^16, else sorted ids).
class deferred_ids {
 public:
  explicit deferred_ids(nb::handle d)
  {
    if (d.is_none() || d.ptr() == Py_False) { return; }
    if (d.ptr() == Py_True) {
      all_ = true;
      return;
    }
    for (nb::handle h : nb::iter(d)) {
      const auto id = nb::cast<std::uint64_t>(h);
      if (id > UINT32_MAX) { continue; }  // no hook has it
      sorted_.push_back(static_cast<std::uint32_t>(id));
    }
    std::sort(sorted_.begin(), sorted_.end());
    sorted_.erase(std::unique(sorted_.begin(), sorted_.end()), sorted_.end());
    if (!sorted_.empty() && sorted_.back() < (1U << 16)) {
      bits_.assign(sorted_.back() + 1U, 0);
      for (auto id : sorted_) { bits_[id] = 1; }
      sorted_.clear();
    }
  }
  [[nodiscard]] bool operator()(std::uint32_t id) const noexcept
  {
    if (all_) { return true; }
    if (!bits_.empty()) { return id < bits_.size() && bits_[id] != 0; }
    return std::binary_search(sorted_.begin(), sorted_.end(), id);
  }
  [[nodiscard]] bool all() const noexcept { return all_; }

 private:
  bool all_{false};
  std::vector<std::uint8_t> bits_;
  std::vector<std::uint32_t> sorted_;
};

template <class B>
class capture_fn {
 public:
  capture_fn(nb::handle channel, nb::handle stream, nb::handle deferred, nb::handle prepare)
    : channel_{nb::borrow(channel)}, ch_{&nb::cast<py_channel<B>&>(channel)}, stream_{nb::borrow(stream)},
      deferred_{deferred}, prepare_{nb::borrow(prepare)}, capture_{channel.attr("capture")},
      capture_deferred_{channel.attr("capture_deferred")}
  {
    if (nb::isinstance<py_stream<B>>(stream)) {
      fstream_ = &nb::cast<py_stream<B>&>(stream);
    } else if constexpr (!is_host<B>) {
      if (PyLong_CheckExact(stream.ptr()) != 0) {
        handle_ = nb::cast<std::uintptr_t>(stream);
        int_stream_ = true;
      }
    }
  }

  void operator()(nb::handle hook, nb::handle tensor)
  {
    std::uint32_t h = 0;
    array_bytes t;
    if (!int_hook(hook, h) || !torch_fast_bytes<B>(tensor, ch_->device(), t)) {
      general(hook, tensor, int_hook(hook, h) ? deferred_(h) : deferred_.all());
      return;
    }
    const bool deferred = deferred_(h);
    ch_->capture_bytes(h, tensor, std::move(t), stream(deferred), deferred);
  }

 private:
  [[nodiscard]] fb::stream_view<B> stream(bool deferred) const
  {
    if (fstream_ != nullptr) { return fb::stream_view<B>{B{}, fstream_->handle()}; }
    if (int_stream_) { return fb::stream_view<B>{B{}, reinterpret_cast<typename B::stream_type>(handle_)}; }
    return resolve_stream<B>(stream_, ch_->device(), deferred ? "Channel.capture_deferred" : "Channel.capture");
  }

  /// What ferry.hooks' Python closure did: prepare(hook, tensor), then the Channel method.
  void general(nb::handle hook, nb::handle tensor, bool deferred)
  {
    nb::object t = prepare_.is_none() ? nb::borrow(tensor) : prepare_(hook, tensor);
    (deferred ? capture_deferred_ : capture_)(hook, t, stream_);
  }

  nb::object channel_;  // keeps ch_ alive
  py_channel<B>* ch_;
  nb::object stream_;
  py_stream<B>* fstream_{nullptr};  // stream_ is a ferry.Stream (alive with stream_)
  bool int_stream_{false};
  std::uintptr_t handle_{0};
  deferred_ids deferred_;
  nb::object prepare_;
  nb::object capture_, capture_deferred_;  // the Channel's bound methods (the general path)
};

/// Channel.capture_deferred_many(items, stream, prepare): ferry.hooks.Collector's hand-over of the captures it
/// collected during a forward, `items` a list of (hook, tensor, version at the hook: -1 unknown) tuples, each
/// converted as capture_fn converts it, all before the first is given to the core (one that does not convert:
/// nothing recorded). A tensor written in place since its hook is refused here (its bytes are no longer the
/// hook's); the version recorded for the core's deferred check is the hook's. `end`: the forward is ended in
/// the same call after the hand-over (an item that fails: it stays open, as the two calls would leave it).
template <class B>
nb::object capture_deferred_many(py_channel<B>& ch, nb::handle items, nb::handle stream, nb::handle prepare, bool end)
{
  const char* what = "Channel.capture_deferred_many";
  if (PyList_Check(items.ptr()) == 0) {
    throw nb::type_error(("ferry: " + std::string{what} + ": expected a list of (hook, tensor, version) tuples, got " +
                          type_of(items)).c_str());
  }
  const auto s = resolve_stream<B>(stream, ch.device(), what);
  std::vector<staged_capture> staged(static_cast<std::size_t>(PyList_GET_SIZE(items.ptr())));
  for (std::size_t i = 0; i < staged.size(); ++i) {
    PyObject* it = PyList_GET_ITEM(items.ptr(), static_cast<Py_ssize_t>(i));
    auto& st = staged[i];
    long long at_hook = -1;
    if (PyTuple_Check(it) == 0 || PyTuple_GET_SIZE(it) != 3 || !int_hook(PyTuple_GET_ITEM(it, 0), st.hook) ||
        PyLong_Check(PyTuple_GET_ITEM(it, 2)) == 0 || (at_hook = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 2))) < -1) {
      PyErr_Clear();
      throw nb::type_error(("ferry: " + std::string{what} + ": item " + std::to_string(i) +
                            ": expected a (hook id in [0, 2^32), tensor, version >= -1) tuple, got " +
                            type_of(nb::handle{it})).c_str());
    }
    nb::handle tensor{PyTuple_GET_ITEM(it, 1)};
    const bool fast = torch_fast_bytes<B>(tensor, ch.device(), st.t);
    st.keep = fast || prepare.is_none() ? nb::borrow(tensor) : prepare(st.hook, tensor);
    if (!fast) { st.t = tensor_bytes<B>(st.keep, ch.device(), what, st.hook); }
    if (at_hook < 0) { continue; }
    bool ok = fast && st.t.version_read && st.t.version >= 0;
    const long long now = ok ? st.t.version : py_source::version_now(tensor.ptr(), ok);
    FERRY_EXPECTS(!ok || now == at_hook, ferry::logic_error,
                  "{}: hook {} (item {}): expected the tensor as it was at its hook (version {}), got it written in "
                  "place since (version {}): collect a clone, or capture it immediately",
                  what, st.hook, i, at_hook, now);
    if (st.keep.is(tensor)) {  // a prepared copy (contiguous()) keeps its own version
      st.t.version = at_hook;
      st.t.version_read = true;
    }
  }
  auto plan = ch.capture_deferred_staged(staged, s, end);
  return plan ? nb::cast(std::move(*plan)) : nb::none();
}

}  // namespace

template <class B>
std::optional<py_plan> py_channel<B>::capture_deferred_staged(std::vector<staged_capture>& items,
                                                              const fb::stream_view<B>& s, bool end)
{
  tie(s);
  std::vector<fd::source_owner> owners;
  owners.reserve(items.size());
  for (auto& it : items) {
    owners.push_back(
        py_source::make<B>(it.keep, std::move(it.t.dl), true, it.t.version_read ? &it.t.version : nullptr));
  }
  auto plan = call(end ? "end_forward" : "capture_deferred", [&](fd::channel<B>& ch) -> std::optional<py_plan> {
    for (std::size_t i = 0; i < items.size(); ++i) {
      ch.capture_deferred(fd::hook_id{items[i].hook}, items[i].t.data, items[i].t.nbytes, s, std::move(owners[i]));
    }
    if (!end) { return std::nullopt; }
    return py_plan{ch.end_forward(s)};
  });
  if (end) { forward_stream_ = nb::object{}; }  // as end_forward(): the stream need not outlive the forward now
  return plan;
}

template <class B>
void init_capture_fn(nb::module_& m)
{
  (void)m;
  nb::handle cls = nb::type<py_channel<B>>();
  nb::cpp_function_def(
    [](nb::handle self, nb::handle stream, nb::handle deferred, nb::handle prepare) {
      auto fn = std::make_shared<capture_fn<B>>(self, stream, deferred, prepare);
      return nb::cpp_function([fn](nb::handle hook, nb::handle tensor) { (*fn)(hook, tensor); }, nb::name("capture"),
                              nb::arg("hook"), nb::arg("tensor").none(),
                              nb::sig("def capture(hook: int, tensor: object) -> None"));
    },
    nb::scope(cls), nb::name("capture_fn"), nb::is_method(), nb::arg("stream").none() = nb::none(), nb::kw_only(),
    nb::arg("deferred").none() = false, nb::arg("prepare").none() = nb::none(),
    nb::sig("def capture_fn(self, stream: object | None = None, *, deferred: object = False, prepare: "
            "typing.Callable[[int, object], object] | None = None) -> typing.Callable[[int, object], None]"),
    "capture(hook, tensor) through capture (or capture_deferred for the hook ids in deferred: False, True or "
    "ids) on stream, as one C++ function: a plain dense torch.Tensor is read without a Python call; anything "
    "else is given to prepare(hook, tensor) (None: as it is) and then to capture / capture_deferred. The call "
    "site of ferry.hooks.channel_capture.");
  nb::cpp_function_def(
    [](py_channel<B>& self, nb::handle items, nb::handle stream, nb::handle prepare, bool end) {
      return capture_deferred_many<B>(self, items, stream, prepare, end);
    },
    nb::scope(cls), nb::name("capture_deferred_many"), nb::is_method(), nb::arg("items"),
    nb::arg("stream").none() = nb::none(), nb::kw_only(), nb::arg("prepare").none() = nb::none(),
    nb::arg("end_forward") = false,
    nb::sig("def capture_deferred_many(self, items: list[tuple[int, object, int]], stream: object | None = None, *, "
            "prepare: typing.Callable[[int, object], object] | None = None, end_forward: bool = False) -> Plan | None"),
    "capture_deferred(hook, tensor, stream) for each (hook, tensor, version at its hook: -1 unknown) of items, in "
    "order, as one call (ferry.hooks.Collector's hand-over): converted as capture_fn converts them (prepare for "
    "anything but a plain dense torch.Tensor); a tensor written in place since its hook is a LogicError. Every "
    "item is converted before any is given to the channel (an item that does not convert: nothing recorded); an "
    "item the channel refuses raises, the items before it stay recorded, as calls one by one would leave them. "
    "end_forward=True: then end_forward(stream) in the same call, its Plan returned (an item that fails leaves the "
    "forward open, as the two calls would).");
}

template std::optional<py_plan> py_channel<fb::host_backend>::capture_deferred_staged(
  std::vector<staged_capture>&, const fb::stream_view<fb::host_backend>&, bool);
template void init_capture_fn<fb::host_backend>(nb::module_&);
#if defined(FERRY_PYTHON_CUDA)
template std::optional<py_plan> py_channel<fb::cuda_backend>::capture_deferred_staged(
  std::vector<staged_capture>&, const fb::stream_view<fb::cuda_backend>&, bool);
template void init_capture_fn<fb::cuda_backend>(nb::module_&);
#endif

}  // namespace ferry::python
