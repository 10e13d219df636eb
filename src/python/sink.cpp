// SPDX-License-Identifier: Apache-2.0
// ferry.sinks.safetensors' native half: _ferry.SafetensorsSink, a thin handle on ferry::sink::safetensors
// (sink/safetensors.hpp): conversion only (the schema from (hook, name, dtype, row_shape) tuples, d2h_typed.hpp;
// none: the channel's, which the core's adopt_schema takes; the knobs; the counters as a dict, also under
// Channel.stats()["sink"]). Channel(sink=...) hands it entry views directly (sink_view_callback): the drain
// thread calls the C++ sink, no Python and no GIL per entry. ferry/sinks.py is the Python face.
#include "d2h_channel.hpp"

#include <ferry/sink/safetensors.hpp>
#include <ferry/version.hpp>

#include <nanobind/stl/tuple.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

namespace ferry::python {

namespace {

namespace fk = ferry::sink;

struct py_sink {
  fk::safetensors s;
  explicit py_sink(fk::safetensors_config c) : s{std::move(c)} {}
};

fk::safetensors_config config_of(const std::string& directory, const std::vector<hook_tuple>& schema, uint_arg shard_bytes,
                                 uint_arg max_queue_bytes, const std::string& policy, double block_timeout, bool fsync,
                                 bool overwrite, bool direct_io)
{
  const char* who = "ferry.sinks.safetensors";
  fk::safetensors_config c;
  c.directory = directory;
  c.schema = schema_of(schema, who);  // empty: the channel's (sink_adopt_schema)
  c.shard_bytes = shard_bytes.get(who, "shard_bytes");
  c.max_queue_bytes = max_queue_bytes.get(who, "max_queue_bytes");
  FERRY_EXPECTS(policy == "block" || policy == "drop", ferry::logic_error,
                "{}: expected policy 'block' or 'drop', got '{}'", who, policy);
  c.policy = policy == "block" ? fk::queue_policy::block : fk::queue_policy::drop;
  c.block_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(seconds_arg(block_timeout, who, "block_timeout") * 1000.0));
  c.fsync = fsync;
  c.overwrite = overwrite;
  c.direct_io = direct_io;
  return c;
}

nb::dict stats_dict(const fk::safetensors_stats& st)
{
  return fields_dict([&](auto&& f) { fk::for_each_stat(st, f); });
}

py_sink* sink_of(nb::handle obj)
{
  py_sink* p = nullptr;
  if (!obj.is_valid() || obj.is_none() || !nb::try_cast<py_sink*>(obj, p)) { return nullptr; }
  return p;
}

}  // namespace

std::function<void(fd::entry_view&&)> sink_view_callback(nb::handle obj)
{
  py_sink* p = sink_of(obj);
  return p != nullptr ? p->s.callback() : std::function<void(fd::entry_view&&)>{};
}

nb::object sink_stats(nb::handle sink)
{
  if (py_sink* p = sink_of(sink); p != nullptr) { return stats_dict(p->s.stats()); }
  return shm_sink_stats(sink);
}

void sink_adopt_schema(nb::handle sink, const fd::hook_schema& schema)
{
  py_sink* p = sink_of(sink);
  if (p == nullptr) { return shm_sink_adopt_schema(sink, schema); }
  gil_release g;  // rewrites index.json
  p->s.adopt_schema(schema);
}

void init_sink(nb::module_& m)
{
  m.attr("version") = std::string{ferry::version};
  nb::list names;
  fk::safetensors_stats st;
  fk::for_each_stat(st, [&](const char* name, const auto&) { names.append(name); });
  m.attr("sink_stats") = nb::tuple(names);

  nb::class_<py_sink>(m, "SafetensorsSink",
                      "A D2H sink writing safetensors shards and index.json (ferry.sinks.safetensors builds one).")
    .def(
      "__init__",
      [](py_sink* self, const std::string& directory, const std::vector<hook_tuple>& schema, uint_arg shard_bytes,
         uint_arg max_queue_bytes, const std::string& policy, double block_timeout, bool fsync, bool overwrite,
         bool direct_io) {
        auto c = config_of(directory, schema, shard_bytes, max_queue_bytes, policy, block_timeout, fsync, overwrite,
                           direct_io);
        gil_release g;  // prepares the directory, writes the first index
        new (self) py_sink(std::move(c));
      },
      nb::arg("directory"), nb::arg("schema"), nb::kw_only(), nb::arg("shard_bytes"), nb::arg("max_queue_bytes"),
      nb::arg("policy"), nb::arg("block_timeout"), nb::arg("fsync"), nb::arg("overwrite"), nb::arg("direct_io") = true)
    .def(
      "flush",
      [](py_sink& p) {
        gil_release g;
        p.s.flush();
      },
      "Completes the open forward and publishes the shard being written (call it between forwards).")
    .def("stats", [](const py_sink& p) { return stats_dict(p.s.stats()); })
    .def(
      "close",
      [](py_sink& p) {
        fk::safetensors_stats st;
        {
          gil_release g;
          st = p.s.close();
        }
        return stats_dict(st);
      },
      "Publishes the last shard, marks index.json complete, stops the writer; raises the first error kept.")
    .def_prop_ro("closed", [](const py_sink& p) { return p.s.closed(); })
    .def_prop_ro("directory", [](const py_sink& p) { return p.s.cfg().directory.string(); })
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](py_sink& p, nb::args exc) { close_on_exit(p.s, std::move(exc)); });
}

}  // namespace ferry::python
