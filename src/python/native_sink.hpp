// SPDX-License-Identifier: Apache-2.0
// The native sinks' common half (ferry.sinks: sink.cpp, shm_stream.cpp): py_native_sink<S>, the py_sink that
// Channel(sink=...) attaches (its core sink as a d2h::sink_ref, its counters as a dict), and what both bindings
// share: the queue policy from its name, the counters' names, and the methods every sink has (stats, close,
// closed, the context manager). Conversion only: the rules are the core sinks' (ferry/sink/*.hpp).
#pragma once

#include "d2h_channel.hpp"
#include "d2h_typed.hpp"

#include <ferry/sink/policy.hpp>

#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ferry::python {

namespace fk = ferry::sink;

/// The counters of a sink (safetensors_stats, shm_stream_stats) as a dict, in the core's field order.
template <class Stats>
[[nodiscard]] nb::dict stats_dict(const Stats& st)
{
  return fields_dict([&](auto&& f) { for_each_stat(st, f); });  // ferry::sink::for_each_stat, by ADL
}

/// A native sink: the core's sink `S` (sink::safetensors, sink::shm_stream), attached by the core's one call.
template <class S>
class py_native_sink final : public py_sink {
 public:
  template <class Config>
  explicit py_native_sink(Config c) : s{std::move(c)}
  {
  }
  py_native_sink(const py_native_sink&) = delete;
  py_native_sink& operator=(const py_native_sink&) = delete;
  /// Closing waits for the sink's threads (the writer's last shard, a stream's reader) and may drop a staging
  /// registration (on the host backend: a wait for its streams): never with the GIL held.
  ~py_native_sink() override
  {
    gil_release g;
    S gone = std::move(s);
  }
  [[nodiscard]] fd::sink_ref ref() override { return fd::sink_ref{s}; }
  [[nodiscard]] nb::dict stats() const override { return stats_dict(s.stats()); }

  S s;
};

/// A sink's queue_policy from Python's "block" / "drop" (logic_error naming `who` otherwise).
[[nodiscard]] inline fk::queue_policy policy_of(const std::string& policy, const char* who)
{
  FERRY_EXPECTS(policy == "block" || policy == "drop", ferry::logic_error,
                "{}: expected policy 'block' or 'drop', got '{}'", who, policy);
  return policy == "block" ? fk::queue_policy::block : fk::queue_policy::drop;
}

/// What every sink's config takes alike from Python: its schema (hook tuples, d2h_typed.hpp; empty: the channel's,
/// which the one-call attach offers) and its queue policy by name.
template <class Config>
void set_schema_and_policy(Config& c, const std::vector<hook_tuple>& schema, const std::string& policy, const char* who)
{
  c.schema = schema_of(schema, who);
  c.policy = policy_of(policy, who);
}
/// A sink's longest wait, `seconds` from Python (seconds_arg's checks), in milliseconds.
[[nodiscard]] inline std::chrono::milliseconds wait_arg(double seconds, const char* who, const char* name)
{
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds_arg(seconds, who, name) * 1000.0));
}

/// The names of a sink's counters (Stats' field list), as the module attribute `attr`.
template <class Stats>
void add_stat_names(nb::module_& m, const char* attr)
{
  nb::list names;
  Stats st;
  for_each_stat(st, [&](const char* name, const auto&) { names.append(name); });
  m.attr(attr) = nb::tuple(names);
}

/// A sink's `__exit__`: closes `s` without the GIL unless it is closed; after an error in the with-body, an
/// error of close() is dropped so it does not mask the body's.
template <class Sink>
void close_on_exit(Sink& s, nb::args exc)
{
  if (s.closed()) { return; }
  const bool clean = nb::len(exc) == 0 || exc[0].is_none();
  gil_release g;
  try {
    (void)s.close();
  } catch (const std::exception&) {
    if (clean) { throw; }
  }
}

/// What every native sink binds: stats(), close() (`close_doc`), closed, and the context manager.
template <class S>
void def_sink_calls(nb::class_<py_native_sink<S>, py_sink>& c, const char* close_doc)
{
  using P = py_native_sink<S>;
  c.def("stats", [](const P& p) { return stats_dict(p.s.stats()); })
    .def(
      "dropped_requests",
      [](const P& p) {
        std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> out;
        for (const auto& d : p.s.dropped_requests()) { out.emplace_back(d.request, d.forwards, d.rows); }
        return out;
      },
      "Policy drop: [(request, forwards, rows)] for every request whose forwards lost entries (each forward "
      "counted once, with the rows it held for the request), by request id; [] under block.")
    .def(
      "close",
      [](P& p) {
        decltype(p.s.close()) st;
        {
          gil_release g;
          st = p.s.close();
        }
        return stats_dict(st);
      },
      close_doc)
    .def_prop_ro("closed", [](const P& p) { return p.s.closed(); })
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](P& p, nb::args exc) { close_on_exit(p.s, std::move(exc)); });
}

}  // namespace ferry::python
