// SPDX-License-Identifier: Apache-2.0
// ferry.engine's native half: _ferry.SampleAssembler, a thin handle on ferry::sink::sample_assembler
// (sink/sample_assembler.hpp): conversion only. Channel(sink=...) attaches it as any native sink (native_sink.hpp):
// the drain thread files each entry's rows in C++, without the GIL; the engine's thread adds and finishes requests;
// the writer thread's next() builds a sample with the GIL released and gets it as numpy arrays that own its bytes.
#include "native_sink.hpp"

#include <ferry/sink/sample_assembler.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace ferry::python {

namespace {

using py_assembler = py_native_sink<fk::sample_assembler>;

/// `v`'s elements as a numpy array of `Elem` and `shape` that owns them (the vector moves into its capsule).
template <class Elem, class T>
nb::object owned(std::vector<T>&& v, std::vector<std::size_t> shape)
{
  static_assert(sizeof(Elem) == sizeof(T));
  auto* keep = new std::vector<T>(std::move(v));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(
    nb::ndarray<nb::numpy, Elem>(reinterpret_cast<Elem*>(keep->data()), shape.size(), shape.data(), owner));
}

}  // namespace

void init_sample_assembler(nb::module_& m)
{
  add_stat_names<fk::sample_assembler_stats>(m, "sample_assembler_stats");

  nb::class_<py_assembler, py_sink> c(m, "SampleAssembler",
                                      "Per-request samples from a channel's row entries (ferry.engine's native "
                                      "assembler; sink/sample_assembler.hpp).");
  c.def(
     "__init__",
     [](py_assembler* self, std::uint32_t hooks, const std::string& policy, uint_arg max_pending_bytes,
        double timeout) {
       const char* who = "ferry.engine assembler";
       fk::sample_assembler_config cfg;
       cfg.hooks = hooks;
       cfg.policy = policy_of(policy, who);
       cfg.max_pending_bytes = max_pending_bytes.get(who, "max_pending_bytes");
       cfg.timeout = wait_arg(timeout, who, "timeout");
       new (self) py_assembler(cfg);
     },
     nb::arg("hooks"), nb::kw_only(), nb::arg("policy") = "block", nb::arg("max_pending_bytes") = 1ULL << 30,
     nb::arg("timeout") = 60.0)
    .def(
      "add",
      [](py_assembler& p, std::uint64_t handle, std::string id, std::int64_t lo, std::int64_t hi,
         std::vector<std::uint32_t> keep, std::vector<std::int64_t> prompt, bool strict) {
        p.s.add({.handle = handle, .id = std::move(id), .lo = lo, .hi = hi, .keep = std::move(keep),
                 .prompt = std::move(prompt), .strict = strict});
      },
      nb::arg("handle"), nb::arg("request_id"), nb::arg("lo"), nb::arg("hi"), nb::arg("keep"), nb::arg("prompt"),
      nb::arg("strict"))
    .def(
      "finish",
      [](py_assembler& p, std::uint64_t handle, std::vector<std::int64_t> sequence, std::string reason,
         std::int64_t last_step) { p.s.finish(handle, std::move(sequence), std::move(reason), last_step); },
      nb::arg("handle"), nb::arg("sequence"), nb::arg("reason"), nb::arg("last_step"))
    .def(
      "next",
      [](py_assembler& p, double timeout) -> nb::object {
        std::optional<fk::assembled_sample> got;
        {
          gil_release g;
          got = p.s.next(std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000.0)));
        }
        if (!got) { return nb::none(); }
        fk::assembled_sample& s = *got;
        const std::size_t n = s.positions.size();
        const std::size_t taps = s.keep.size();
        nb::object hidden = owned<std::uint8_t>(std::move(s.hidden), {n, taps, static_cast<std::size_t>(s.row_bytes)});
        nb::object pos = owned<std::int64_t>(std::move(s.positions), {n});
        nb::object tok = owned<std::int64_t>(std::move(s.token_ids), {n});
        return nb::make_tuple(s.handle, s.id, s.keep, hidden, pos, tok, s.missing, s.reason, s.complete);
      },
      nb::arg("timeout"),
      "The next ready sample, (handle, request_id, keep, hidden uint8 [tokens, len(keep), row_bytes], positions, "
      "token_ids, missing [(a, b)], reason, complete), built without the GIL; None when none is ready in time.")
    .def_prop_ro("done", [](const py_assembler& p) { return p.s.done(); });
  def_sink_calls(c, "No more entries: every request not finished ends incomplete, every finished one is ready "
                    "for next(). Close the channel first.");
}

}  // namespace ferry::python
