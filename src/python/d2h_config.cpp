// SPDX-License-Identifier: Apache-2.0
// init_d2h_channel: ferry.Channel's methods, and its keyword arguments: one per d2h::config field and the
// `tuning` dict, one key per d2h::tuning field, named, converted and defaulted from the core's field lists
// (d2h/detail/fields.hpp), so a new knob cannot be forgotten here or in the generated stubs (the signature and
// the tuning keys' docstring below are built from the same lists).
#include "d2h_channel.hpp"
#include "d2h_fields.hpp"

#include <ferry/d2h/detail/fields.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace ferry::python {

namespace {

/// The config fields the binding fixes (the drain runs on the channel's thread: poll() takes from it).
constexpr std::string_view fixed_fields[] = {"drain"};
[[nodiscard]] bool fixed(std::string_view name)
{
  for (auto f : fixed_fields) {
    if (f == name) { return true; }
  }
  return false;
}

/// A hook id from Python: an int in [0, 2^32) (LogicError naming the value otherwise; TypeError for a non-int).
std::uint32_t hook_of(nb::handle h, const char* what)
{
  if (PyLong_Check(h.ptr()) == 0 || PyBool_Check(h.ptr()) != 0) {
    throw nb::type_error(("ferry: Channel." + std::string{what} + ": expected hook an int, got " + type_of(h)).c_str());
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  FERRY_EXPECTS(overflow == 0 && v >= 0 && v <= static_cast<long long>(UINT32_MAX), ferry::logic_error,
                "Channel.{}: expected hook an int in [0, 2^32), got {}", what, nb::cast<std::string>(nb::str(h)));
  return static_cast<std::uint32_t>(v);
}

/// Whether `name` is a tuning key (d2h::tuning's field list).
[[nodiscard]] bool tuning_key(std::string_view name)
{
  bool found = false;
  const fd::tuning t{};
  fd::detail::for_each_tuning_field(t, [&](const char* n, const auto&) { found = found || name == n; });
  return found;
}

/// The tuning={...} keyword into c.tuning: every key a d2h::tuning field, every value of its type (LogicError
/// naming the key, expected vs got).
void tuning_from(fd::tuning& t, nb::handle d)
{
  if (d.is_none()) { return; }
  FERRY_EXPECTS(PyDict_Check(d.ptr()) != 0, ferry::logic_error,
                "Channel: expected tuning a dict of tuning keys (help(ferry.Channel)), got {}", type_of(d));
  for (auto [k, v] : nb::borrow<nb::dict>(d)) {
    FERRY_EXPECTS(nb::isinstance<nb::str>(k), ferry::logic_error, "Channel: expected every tuning key a str, got {}",
                  type_of(k));
    const auto key = nb::cast<std::string>(k);
    bool known = false;
    fd::detail::for_each_tuning_field(t, [&](const char* name, auto& field) {
      if (key != name) { return; }
      known = true;
      fields::assign(field, v, ("tuning['" + key + "']").c_str());
    });
    if (!known) {
      std::string names;
      fd::detail::for_each_tuning_field(
        t, [&](const char* n, const auto&) { names += (names.empty() ? "" : ", ") + std::string{n}; });
      FERRY_FAIL(ferry::logic_error, "Channel: tuning key '{}' unknown: expected one of {}", key, names);
    }
  }
}

/// Channel(device, **kwargs)'s config: the defaults of d2h::config, each given keyword converted.
fd::config config_from(const nb::kwargs& kw)
{
  fd::config c;
  c.drain = fd::drain_mode::thread;
  std::size_t used = 0;
  fd::detail::for_each_config_field(c, [&](const char* name, auto& field) {
    if (fixed(name) || !kw.contains(name)) { return; }
    fields::assign(field, kw[name], name);
    ++used;
  });
  if (kw.contains("tuning")) { tuning_from(c.tuning, kw["tuning"]); }
  for (const char* other : {"sink", "schema", "tuning"}) { used += kw.contains(other) ? 1U : 0U; }  // not fields
  if (used != static_cast<std::size_t>(PyDict_Size(kw.ptr()))) {
    for (auto [k, v] : kw) {
      const auto key = nb::cast<std::string>(k);
      bool known = key == "sink" || key == "schema" || key == "tuning";
      fd::detail::for_each_config_field(
        c, [&](const char* name, auto&) { known = known || (!fixed(name) && key == name); });
      if (!known) {
        const std::string hint = tuning_key(key) ? " (a tuning key: pass tuning={'" + key + "': ...})"
                                                 : std::string{" (see help(ferry.Channel) for the knobs)"};
        throw nb::type_error(("ferry.Channel: unexpected keyword argument '" + key + "'" + hint).c_str());
      }
    }
  }
  return c;
}

/// "def __init__(self, device: int = 0, *, ring_bytes: int = 67108864, ...) -> None": the stub signature.
const char* init_signature()
{
  static const std::string sig = [] {
    std::string s = "def __init__(self, device: int = 0, *";
    const fd::config c{};
    fd::detail::for_each_config_field(c, [&](const char* name, const auto& v) {
      if (fixed(name)) { return; }
      using T = std::remove_cvref_t<decltype(v)>;
      s += std::string{", "} + name + ": " + fields::annotation<T>() + " = " + fields::literal(v);
    });
    return s + ", sink: object | None = None, schema: object | None = None, tuning: dict[str, object] | None = None) "
               "-> None";
  }();
  return sig.c_str();
}

/// The constructor's docstring: what the keywords are, and every tuning key with its type and default.
const char* init_doc()
{
  static const std::string doc = [] {
    std::string s =
      "A channel on `device`. The keywords are what a user chooses (d2h::config, include/ferry/d2h/types.hpp); "
      "sink: a ferry.sinks sink or a \"ferry.sink\" capsule; schema: {hook: (name, dtype, row_shape)}.\n"
      "tuning: a dict of performance knobs and platform overrides (d2h::tuning, include/ferry/d2h/tuning.hpp, "
      "every one documented there; an unknown key or a wrong type is a LogicError). Its keys and defaults:\n";
    const fd::tuning t{};
    fd::detail::for_each_tuning_field(t, [&](const char* name, const auto& v) {
      using T = std::remove_cvref_t<decltype(v)>;
      s += std::string{"  "} + name + ": " + fields::annotation<T>() + " = " + fields::literal(v) + "\n";
    });
    return s;
  }();
  return doc.c_str();
}

}  // namespace

template <class B>
void init_d2h_channel(nb::module_& m)
{
  using C = py_channel<B>;
  nb::class_<C>(m, "Channel", "D2H channel: capture device tensors into a ring, poll() them on the host.")
    .def(
      "__init__",
      [](C* self, int device, nb::kwargs kw) {
        nb::object sink = kw.contains("sink") ? nb::object(kw["sink"]) : nb::none();
        const bool typed = kw.contains("schema") && !kw["schema"].is_none();
        new (self)
          C(device, config_from(kw), sink, typed ? schema_of(kw["schema"], "ferry.Channel") : fd::hook_schema{});
      },
      nb::arg("device") = 0, nb::arg("kwargs"), nb::sig(init_signature()), init_doc())
    .def(
      "begin_forward",
      [](C& c, nb::handle s, nb::handle tag, nb::handle req, nb::handle meta) {
        c.begin_forward(s, tag, req, meta);
      },
      nb::arg("stream").none() = nb::none(), nb::kw_only(), nb::arg("tag").none() = nb::none(),
      nb::arg("requests").none() = nb::none(), nb::arg("meta").none() = nb::none(),
      nb::sig("def begin_forward(self, stream: object | None = None, *, tag: int | None = None, requests: object | "
              "None = None, meta: bytes | None = None) -> None"))
    .def("end_forward", &C::end_forward, nb::arg("stream").none() = nb::none())
    .def("abort_forward", &C::abort_forward, nb::arg("stream").none() = nb::none(),
         "Drops the forward open on stream (the recovery after an exception inside a forward): an eager "
         "forward's captured entries are published and delivered, a captured one is forgotten, pending deferred "
         "entries are dropped. Returns whether a forward was open.")
    .def(
      "capture",
      [](C& c, nb::handle hook, nb::handle t, nb::handle s) { c.capture(hook_of(hook, "capture"), t, s, false); },
      nb::arg("hook"), nb::arg("tensor").none(), nb::arg("stream").none() = nb::none(),
      nb::sig("def capture(self, hook: int, tensor: object, stream: object | None = None) -> None"))
    .def(
      "capture_deferred",
      [](C& c, nb::handle hook, nb::handle t, nb::handle s) {
        c.capture(hook_of(hook, "capture_deferred"), t, s, true);
      },
      nb::arg("hook"), nb::arg("tensor").none(), nb::arg("stream").none() = nb::none(),
      nb::sig("def capture_deferred(self, hook: int, tensor: object, stream: object | None = None) -> None"))
    .def(
      "capture_rows",
      [](C& c, nb::handle hook, nb::handle t, const nb::kwargs& k) {
        c.capture_rows(hook_of(hook, "capture_rows"), t, k, false);
      },
      nb::arg("hook"), nb::arg("tensor"), nb::arg("kwargs"), nb::sig(rows_signature("capture_rows")))
    .def(
      "capture_rows_deferred",
      [](C& c, nb::handle hook, nb::handle t, const nb::kwargs& k) {
        c.capture_rows(hook_of(hook, "capture_rows_deferred"), t, k, true);
      },
      nb::arg("hook"), nb::arg("tensor"), nb::arg("kwargs"), nb::sig(rows_signature("capture_rows_deferred")))
    .def("flush", &C::flush, nb::arg("stream").none() = nb::none())
    .def_prop_ro("deferred_pending", &C::deferred_pending)
    .def(
      "plan",
      [](C& c, const py_plan& p, nb::handle s, nb::handle tag, nb::handle req, nb::handle meta, nb::handle selected) {
        fd::forward_meta m = forward_meta_of(tag, req, meta, "Channel.plan");
        uint_arg n;
        if (!selected.is_none() && !nb::try_cast(selected, n)) {
          throw nb::type_error(
            ("ferry: Channel.plan: expected selected an int or None, got " + type_of(selected)).c_str());
        }
        if (!selected.is_none()) { m.selected = n.get("Channel.plan", "selected"); }
        c.plan(p, s, std::move(m));
      },
      nb::arg("plan"), nb::arg("stream").none() = nb::none(), nb::kw_only(), nb::arg("tag").none() = nb::none(),
      nb::arg("requests").none() = nb::none(), nb::arg("meta").none() = nb::none(),
      nb::arg("selected").none() = nb::none(),
      nb::sig("def plan(self, plan: Plan, stream: object | None = None, *, tag: int | None = None, requests: object | "
              "None = None, meta: bytes | None = None, selected: int | None = None) -> None"))
    .def(
      "poll",
      [](C& c, uint_arg n, std::optional<double> timeout) {
        return c.poll(n.get("Channel.poll", "max_entries"), timeout);
      },
      nb::arg("max_entries") = 1024, nb::arg("timeout").none() = 0.0)
    .def(
      "poll_batch",
      [](C& c, uint_arg n, std::optional<double> timeout) {
        return c.poll_batch(n.get("Channel.poll_batch", "max_entries"), timeout);
      },
      nb::arg("max_entries") = 1024, nb::arg("timeout").none() = nb::none(),
      "Up to max_entries delivered entries as one EntryBatch: waits up to timeout s (None: forever) for the first "
      "without the GIL, then takes what is ready; an empty batch after the timeout.")
    .def_prop_ro("schema", [](const C& c) { return schema_dict(c.schema()); },
                 "The channel's hook schema: {hook: (name, dtype, row_shape)} ({}: none).")
    .def("stats", &C::stats)
    .def("close", &C::close, nb::arg("timeout").none() = nb::none())
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__",
         [](C& c, nb::args exc) {
           // closes an open channel; an error of the with-body is not masked by a close() error
           if (c.closed()) { return; }
           if (nb::len(exc) == 0 || exc[0].is_none()) {
             (void)c.close(std::nullopt);
           } else {
             try {
               (void)c.close(std::nullopt);
             } catch (const std::exception&) {
             }
           }
         })
    .def_prop_ro("closed", &C::closed)
    .def_prop_ro("handle", &C::handle, "The channel's integer handle for native code (ferry_capi.h, torch ops).")
    .def_prop_ro("has_sink", &C::has_sink)
    .def_prop_ro("device", &C::device)
    .def_prop_ro("invalidated", &C::invalidated)
    .def_prop_ro("capture_disabled", &C::capture_disabled,
                 "on_error='disable': whether an error disabled capture (producer calls are no-ops until recover())")
    .def_prop_ro("capture_error", &C::capture_error, "The first error that disabled capture, or None")
    .def("recover", &C::recover, "Re-enables capture disabled by on_error='disable', between forwards")
    .def("release_producer_thread", &C::release_producer_thread,
         "From the producer thread, between forwards: the next thread to make a producer call becomes it")
    .def_prop_ro("programmatic_launch", &C::programmatic_launch,
                 "Whether ferry's kernels are launched programmatically (tuning's programmatic_launch "
                 "and the device's support: sm_90+ CUDA).")
    .def_prop_ro_static("backend", [](nb::handle) { return traits<B>::name; });
}

/// The field lists (module attributes, for tests and tools): config fields, tuning keys and counters, in order.
void init_d2h_fields(nb::module_& m)
{
  nb::list cfg, fixed_l, tun, ctr;
  const fd::config c{};
  fd::detail::for_each_config_field(c,
                                    [&](const char* name, const auto&) { (fixed(name) ? fixed_l : cfg).append(name); });
  fd::detail::for_each_tuning_field(c.tuning, [&](const char* name, const auto&) { tun.append(name); });
  const fd::counters k{};
  fd::detail::for_each_counter(k, [&](const char* name, const auto&) { ctr.append(name); });
  m.attr("channel_config_fields") = nb::tuple(cfg);
  m.attr("channel_fixed_fields") = nb::tuple(fixed_l);
  m.attr("channel_tuning_fields") = nb::tuple(tun);
  m.attr("channel_counters") = nb::tuple(ctr);
}

template void init_d2h_channel<fb::host_backend>(nb::module_&);
#if defined(FERRY_PYTHON_CUDA)
template void init_d2h_channel<fb::cuda_backend>(nb::module_&);
#endif

}  // namespace ferry::python
