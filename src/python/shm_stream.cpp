// SPDX-License-Identifier: Apache-2.0
// ferry.sinks.shm_stream's native half: _ferry.ShmStreamSink, a thin handle on ferry::sink::shm_stream
// (sink/shm_stream.hpp): conversion only (the knobs, the schema from hook tuples as d2h_typed.hpp makes it, the
// counters as a dict). Channel(sink=...) attaches it as any native sink (native_sink.hpp): the core's one call
// offers it the channel's schema, takes its callback (entry views handed over in C++, no GIL per entry) and its
// staging (the segment's, registered with the channel's backend), so the D2H lands in shared memory. The reader,
// for another process, is shm_reader.cpp.
#include "native_sink.hpp"

#include <ferry/sink/shm_stream.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <string>
#include <vector>

namespace ferry::python {

namespace {

using py_shm_stream = py_native_sink<fk::shm_stream>;

fk::shm_stream_config config_of(const std::string& name, const std::vector<hook_tuple>& schema, uint_arg schema_bytes,
                                uint_arg staging_bytes, uint_arg descriptors, const std::string& policy, double timeout,
                                uint_arg max_lag_entries, uint_arg max_lag_bytes, double poll_interval,
                                uint_arg record_bytes)
{
  const char* who = "ferry.sinks.shm_stream";
  fk::shm_stream_config c;
  c.name = name;
  set_schema_and_policy(c, schema, policy, who);
  c.schema_bytes = schema_bytes.get(who, "schema_bytes");
  c.record_bytes = record_bytes.get(who, "record_bytes");
  c.staging_bytes = staging_bytes.get(who, "staging_bytes");
  c.descriptors = descriptors.get(who, "descriptors");
  c.timeout = wait_arg(timeout, who, "timeout");
  c.max_lag_entries = max_lag_entries.get(who, "max_lag_entries");
  c.max_lag_bytes = max_lag_bytes.get(who, "max_lag_bytes");
  c.poll_interval = std::chrono::microseconds(
    static_cast<std::int64_t>(seconds_arg(poll_interval, who, "poll_interval", 1e-6, 1.0) * 1e6));
  return c;
}

}  // namespace

void init_shm_stream(nb::module_& m)
{
  add_stat_names<fk::shm_stream_stats>(m, "shm_stream_stats");

  nb::class_<py_shm_stream, py_sink> c(m, "ShmStreamSink",
                                       "A D2H sink publishing entries zero-copy to a reader process through shared "
                                       "memory (ferry.sinks.shm_stream builds one; ferry.ShmReader reads it).");
  c.def(
      "__init__",
      [](py_shm_stream* self, const std::string& name, const std::vector<hook_tuple>& schema, uint_arg schema_bytes,
         uint_arg staging_bytes, uint_arg descriptors, const std::string& policy, double timeout,
         uint_arg max_lag_entries, uint_arg max_lag_bytes, double poll_interval, uint_arg record_bytes) {
        auto cfg = config_of(name, schema, schema_bytes, staging_bytes, descriptors, policy, timeout, max_lag_entries,
                           max_lag_bytes, poll_interval, record_bytes);
        gil_release g;  // creates and reserves the segment
        new (self) py_shm_stream(std::move(cfg));
      },
      nb::arg("name"), nb::arg("schema"), nb::kw_only(), nb::arg("schema_bytes"), nb::arg("staging_bytes"),
      nb::arg("descriptors"), nb::arg("policy"), nb::arg("timeout"), nb::arg("max_lag_entries"),
      nb::arg("max_lag_bytes"), nb::arg("poll_interval"), nb::arg("record_bytes"))
    .def_prop_ro("name", [](const py_shm_stream& p) { return p.s.cfg().name; })
    .def_prop_ro("staging_bytes", [](const py_shm_stream& p) { return p.s.cfg().staging_bytes; })
    .def_prop_ro("schema", [](const py_shm_stream& p) { return schema_dict(p.s.cfg().schema); },
                 "The stream's hook schema, {hook: (name, dtype name, row_shape)} ({}: none yet).")
    .def_prop_ro("policy", [](const py_shm_stream& p) {
      return std::string{p.s.cfg().policy == fk::queue_policy::block ? "block" : "drop"};
    })
    .def("__repr__", [](const py_shm_stream& p) {
      return "<ferry.sinks.ShmStreamSink '" + p.s.cfg().name + "' " +
             (p.s.cfg().policy == fk::queue_policy::block ? "block" : "drop") + (p.s.closed() ? " closed>" : ">");
    });
  def_sink_calls(c, "Marks the stream closed (the reader reads to its end), waits up to `timeout` for the reader to "
                    "release what it holds, removes the name; raises the first error kept. Close the channel first.");
}

}  // namespace ferry::python
