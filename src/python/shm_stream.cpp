// SPDX-License-Identifier: Apache-2.0
// ferry.sinks.shm_stream's native half: _ferry.ShmStreamSink, a thin handle on ferry::sink::shm_stream
// (sink/shm_stream.hpp): conversion only (the knobs, the schema from hook tuples as d2h_typed.hpp makes it, the
// counters as a dict). Channel(sink=...) takes its callback in C++ (shm_sink_callback: entry views handed over, no
// GIL per entry) AND its staging (sink_staging: the segment's, registered with the channel's backend), so the D2H
// lands in shared memory, and gives it its schema (shm_sink_adopt_schema: the core's adopt_schema decides).
// The reader, for another process, is shm_reader.cpp.
#include "d2h_channel.hpp"
#include "d2h_typed.hpp"

#include <ferry/sink/shm_stream.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <string>
#include <type_traits>
#include <vector>

namespace ferry::python {

namespace {

namespace fk = ferry::sink;

struct py_shm_stream {
  fk::shm_stream s;
  explicit py_shm_stream(fk::shm_stream_config c) : s{std::move(c)} {}
  py_shm_stream(const py_shm_stream&) = delete;
  py_shm_stream& operator=(const py_shm_stream&) = delete;
  ~py_shm_stream()
  {
    // Closing waits for the reader (and may drop the staging's registration, which on the host backend
    // waits for its streams): never with the GIL held.
    gil_release g;
    fk::shm_stream gone = std::move(s);
  }
};

fk::shm_stream_config config_of(const std::string& name, const std::vector<hook_tuple>& schema, uint_arg schema_bytes,
                                uint_arg staging_bytes, uint_arg descriptors, const std::string& policy, double timeout,
                                uint_arg max_lag_entries, uint_arg max_lag_bytes, double poll_interval,
                                uint_arg record_bytes)
{
  const char* who = "ferry.sinks.shm_stream";
  fk::shm_stream_config c;
  c.name = name;
  c.schema = schema_of(schema, who);  // empty: the channel's (shm_sink_adopt_schema)
  c.schema_bytes = schema_bytes.get(who, "schema_bytes");
  c.record_bytes = record_bytes.get(who, "record_bytes");
  c.staging_bytes = staging_bytes.get(who, "staging_bytes");
  c.descriptors = descriptors.get(who, "descriptors");
  FERRY_EXPECTS(policy == "block" || policy == "drop", ferry::logic_error,
                "{}: expected policy 'block' or 'drop', got '{}'", who, policy);
  c.policy = policy == "block" ? fk::queue_policy::block : fk::queue_policy::drop;
  c.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(seconds_arg(timeout, who, "timeout") * 1000.0));
  c.max_lag_entries = max_lag_entries.get(who, "max_lag_entries");
  c.max_lag_bytes = max_lag_bytes.get(who, "max_lag_bytes");
  c.poll_interval = std::chrono::microseconds(
    static_cast<std::int64_t>(seconds_arg(poll_interval, who, "poll_interval", 1e-6, 1.0) * 1e6));
  return c;
}

nb::dict stats_dict(const fk::shm_stream_stats& st)
{
  return fields_dict([&](auto&& f) { fk::for_each_shm_stat(st, f); });
}

py_shm_stream* shm_of(nb::handle obj)
{
  py_shm_stream* p = nullptr;
  if (!obj.is_valid() || obj.is_none() || !nb::try_cast<py_shm_stream*>(obj, p)) { return nullptr; }
  return p;
}

}  // namespace

std::function<void(fd::entry_view&&)> shm_sink_callback(nb::handle obj)
{
  py_shm_stream* p = shm_of(obj);
  return p != nullptr ? p->s.callback() : std::function<void(fd::entry_view&&)>{};
}

nb::object shm_sink_stats(nb::handle sink)
{
  py_shm_stream* p = shm_of(sink);
  return p != nullptr ? nb::object(stats_dict(p->s.stats())) : nb::none();
}

void shm_sink_adopt_schema(nb::handle sink, const fd::hook_schema& schema)
{
  py_shm_stream* p = shm_of(sink);
  if (p == nullptr) { return; }
  gil_release g;
  p->s.adopt_schema(schema);
}

template <class B>
fd::staging_memory sink_staging(nb::handle sink, const B& b)
{
  py_shm_stream* p = shm_of(sink);
  return p != nullptr ? p->s.staging(b) : fd::staging_memory{};
}
template fd::staging_memory sink_staging(nb::handle, const fb::host_backend&);
#if defined(FERRY_PYTHON_CUDA)
template fd::staging_memory sink_staging(nb::handle, const fb::cuda_backend&);
#endif

void init_shm_stream(nb::module_& m)
{
  nb::list names;
  fk::shm_stream_stats st;
  fk::for_each_shm_stat(st, [&](const char* name, const auto&) { names.append(name); });
  m.attr("shm_stream_stats") = nb::tuple(names);

  nb::class_<py_shm_stream>(m, "ShmStreamSink",
                            "A D2H sink publishing entries zero-copy to a reader process through shared memory "
                            "(ferry.sinks.shm_stream builds one; ferry.ShmReader reads it).")
    .def(
      "__init__",
      [](py_shm_stream* self, const std::string& name, const std::vector<hook_tuple>& schema, uint_arg schema_bytes,
         uint_arg staging_bytes, uint_arg descriptors, const std::string& policy, double timeout,
         uint_arg max_lag_entries, uint_arg max_lag_bytes, double poll_interval, uint_arg record_bytes) {
        auto c = config_of(name, schema, schema_bytes, staging_bytes, descriptors, policy, timeout, max_lag_entries,
                           max_lag_bytes, poll_interval, record_bytes);
        gil_release g;  // creates and reserves the segment
        new (self) py_shm_stream(std::move(c));
      },
      nb::arg("name"), nb::arg("schema"), nb::kw_only(), nb::arg("schema_bytes"), nb::arg("staging_bytes"),
      nb::arg("descriptors"), nb::arg("policy"), nb::arg("timeout"), nb::arg("max_lag_entries"),
      nb::arg("max_lag_bytes"), nb::arg("poll_interval"), nb::arg("record_bytes"))
    .def("stats", [](const py_shm_stream& p) { return stats_dict(p.s.stats()); })
    .def(
      "close",
      [](py_shm_stream& p) {
        fk::shm_stream_stats st;
        {
          gil_release g;
          st = p.s.close();
        }
        return stats_dict(st);
      },
      "Marks the stream closed (the reader reads to its end), waits up to `timeout` for the reader to release "
      "what it holds, removes the name; raises the first error kept. Close the channel first.")
    .def_prop_ro("closed", [](const py_shm_stream& p) { return p.s.closed(); })
    .def_prop_ro("name", [](const py_shm_stream& p) { return p.s.cfg().name; })
    .def_prop_ro("staging_bytes", [](const py_shm_stream& p) { return p.s.cfg().staging_bytes; })
    .def_prop_ro("schema", [](const py_shm_stream& p) { return schema_dict(p.s.cfg().schema); },
                 "The stream's hook schema, {hook: (name, dtype name, row_shape)} ({}: none yet).")
    .def_prop_ro("policy", [](const py_shm_stream& p) {
      return std::string{p.s.cfg().policy == fk::queue_policy::block ? "block" : "drop"};
    })
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](py_shm_stream& p, nb::args exc) { close_on_exit(p.s, std::move(exc)); })
    .def("__repr__", [](const py_shm_stream& p) {
      return "<ferry.sinks.ShmStreamSink '" + p.s.cfg().name + "' " +
             (p.s.cfg().policy == fk::queue_policy::block ? "block" : "drop") + (p.s.closed() ? " closed>" : ">");
    });
}

}  // namespace ferry::python
