// SPDX-License-Identifier: Apache-2.0
// ferry.sinks.safetensors' native half: _ferry.SafetensorsSink, a thin handle on ferry::sink::safetensors
// (sink/safetensors.hpp): conversion only (the schema from (hook, name, dtype, row_shape, shard) tuples, d2h_typed.hpp;
// none: the channel's, which the core's one-call attach offers it; the knobs; the counters as a dict, also under
// Channel.stats()["sink"]). Channel(sink=...) attaches it as any native sink (native_sink.hpp): the drain thread
// calls the C++ sink, no Python and no GIL per entry. ferry/sinks.py is the Python face.
#include "native_sink.hpp"

#include <ferry/sink/safetensors.hpp>
#include <ferry/version.hpp>

#include <nanobind/stl/tuple.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

namespace ferry::python {

namespace {

using py_safetensors = py_native_sink<fk::safetensors>;

fk::safetensors_config config_of(const std::string& directory, const std::vector<hook_tuple>& schema,
                                 uint_arg shard_bytes, uint_arg max_queue_bytes, const std::string& policy,
                                 double block_timeout, bool fsync, bool overwrite, bool direct_io,
                                 uint_arg open_shards)
{
  const char* who = "ferry.sinks.safetensors";
  fk::safetensors_config c;
  c.directory = directory;
  set_schema_and_policy(c, schema, policy, who);
  c.shard_bytes = shard_bytes.get(who, "shard_bytes");
  c.max_queue_bytes = max_queue_bytes.get(who, "max_queue_bytes");
  c.block_timeout = wait_arg(block_timeout, who, "block_timeout");
  c.fsync = fsync;
  c.overwrite = overwrite;
  c.direct_io = direct_io;
  c.tuning.open_shards = open_shards.get(who, "open_shards");
  return c;
}

}  // namespace

void init_sink(nb::module_& m)
{
  m.attr("version") = std::string{ferry::version};
  add_stat_names<fk::safetensors_stats>(m, "sink_stats");

  nb::class_<py_sink>(
      m, "NativeSink",
      "A sink of ferry.sinks, attached in C++ by Channel(sink=...) (its schema, callback and staging).");
  nb::class_<py_safetensors, py_sink> c(
      m, "SafetensorsSink",
      "A D2H sink writing safetensors shards and index.json (ferry.sinks.safetensors builds one).");
  c.def(
     "__init__",
     [](py_safetensors* self, const std::string& directory, const std::vector<hook_tuple>& schema, uint_arg shard_bytes,
        uint_arg max_queue_bytes, const std::string& policy, double block_timeout, bool fsync, bool overwrite,
        bool direct_io, uint_arg open_shards) {
       auto cfg = config_of(directory, schema, shard_bytes, max_queue_bytes, policy, block_timeout, fsync, overwrite,
                            direct_io, open_shards);
       gil_release g;  // prepares the directory, writes the first index
       new (self) py_safetensors(std::move(cfg));
     },
     nb::arg("directory"), nb::arg("schema"), nb::kw_only(), nb::arg("shard_bytes"), nb::arg("max_queue_bytes"),
     nb::arg("policy"), nb::arg("block_timeout"), nb::arg("fsync"), nb::arg("overwrite"), nb::arg("direct_io") = true,
     nb::arg("open_shards") = 0)
    .def(
      "flush",
      [](py_safetensors& p) {
        gil_release g;
        p.s.flush();
      },
      "Completes the open forward and publishes the shard being written (call it between forwards).")
    .def_prop_ro("directory", [](const py_safetensors& p) { return p.s.cfg().directory.string(); });
  def_sink_calls(c,
                 "Publishes the last shard, marks index.json complete, stops the writer; raises the first error kept.");
}

}  // namespace ferry::python
