// SPDX-License-Identifier: Apache-2.0
// init_d2h_entry: ferry.Entry and ferry.Plan.
#include "d2h_entry.hpp"

#include <nanobind/stl/string.h>

#include <string>

namespace ferry::python {

nb::dict report_dict(const fd::shutdown_report& r)
{
  nb::dict d;
  nb::list unpub, hooks, undrained;
  for (auto s : r.unpublished) { unpub.append(s.value); }
  for (auto h : r.unpublished_hooks) { hooks.append(h.value); }
  for (auto s : r.undrained) { undrained.append(s.value); }
  d["delivered"] = r.delivered;
  d["pending_pop"] = r.pending_pop;
  d["views_held"] = r.views_held;
  d["unpublished"] = unpub;
  d["unpublished_hooks"] = hooks;
  d["undrained"] = undrained;
  d["forward_open"] = r.forward_open;
  d["callback_errors"] = r.callback_errors;
  d["first_callback_error"] = r.first_callback_error;
  d["capture_errors"] = r.capture_errors;
  d["first_capture_error"] = r.first_capture_error;
  d["clean"] = r.clean();
  return d;
}

void init_d2h_entry(nb::module_& m)
{
  static constexpr const char* release_doc =
    "Gives the entry's pinned staging back (once its numpy() views are gone too). Idempotent: a second call "
    "does nothing.";
  nb::class_<py_entry>(m, "Entry", "One delivered D2H entry: its bytes in pinned staging until released.")
    .def_ro("hook", &py_entry::hook)
    .def_ro("seq", &py_entry::seq)
    .def_ro("size", &py_entry::size)
    .def_ro("reserved", &py_entry::reserved)
    .def_ro("ok", &py_entry::ok)
    .def_ro("tag", &py_entry::tag, "The forward's tag (begin_forward / plan tag=; without one, the forward's index).")
    .def_ro("forward", &py_entry::forward, "The index of the entry's forward in its channel.")
    .def_ro("row_bytes", &py_entry::row_bytes, "capture_rows: bytes per row (0: captured whole).")
    .def_ro("rows", &py_entry::rows, "capture_rows: the rows the entry holds.")
    .def_prop_ro(
      "meta",
      [](const py_entry& x) -> nb::object {
        if (!x.meta || x.meta->user.empty()) { return nb::none(); }
        return nb::bytes(reinterpret_cast<const char*>(x.meta->user.data()), x.meta->user.size());
      },
      "The forward's meta= bytes (None: none).")
    .def_prop_ro(
      "requests",
      [](const py_entry& x) {
        nb::list l;
        if (x.meta) {
          for (const auto& r : x.meta->requests) { l.append(nb::make_tuple(r.request, r.first_row, r.rows)); }
        }
        return l;
      },
      "The forward's requests as (request, first_row, rows) tuples.")
    .def("rows_of", &py_entry::rows_of, nb::arg("request"),
         "The rows of one request of the forward (requests=), a [rows, row_bytes] uint8 view (no copy).")
    .def_prop_ro("released", &py_entry::released)
    .def_prop_ro("views", &py_entry::views)
    .def("numpy", [](const py_entry& x) { return x.array(false); }, nb::sig("def numpy(self) -> numpy.ndarray"),
         "The payload, a read-only numpy view of the staging (no copy): [rows, *row_shape] of the hook's dtype "
         "when the channel's schema declares the hook (BF16 / F8: the elements' bits, uint16 / uint8), else uint8 "
         "bytes.")
    .def("tensor", [](const py_entry& x) { return x.array(true); }, nb::sig("def tensor(self) -> object"),
         "The payload as a torch.Tensor over the staging (no copy; CPU): [rows, *row_shape] of the hook's dtype "
         "(bfloat16 included) when the schema declares the hook, else uint8 bytes.")
    .def_prop_ro(
      "name", [](const py_entry& x) { return x.spec() ? nb::cast(x.spec()->name) : nb::none(); },
      nb::sig("def name(self) -> str | None"), "The hook's name in the channel's schema (None: not declared).")
    .def_prop_ro(
      "dtype",
      [](const py_entry& x) { return x.spec() ? nb::cast(std::string{fd::dtype_name(x.spec()->type)}) : nb::none(); },
      nb::sig("def dtype(self) -> str | None"), "The hook's dtype (safetensors' name, 'BF16'; None: not declared).")
    .def_prop_ro(
      "shape",
      [](const py_entry& x) -> nb::object {
        if (x.spec() == nullptr || !x.ok) { return nb::none(); }
        nb::list l;
        for (auto d : x.schema->shape_of(fd::hook_id{x.hook}, x.size, x.row_bytes)) { l.append(d); }
        return nb::tuple(l);
      },
      nb::sig("def shape(self) -> tuple[int, ...] | None"),
      "[rows, *row_shape] from the schema (None: not declared, or not ok); LogicError if the size is not whole rows.")
    .def("tobytes", &py_entry::to_bytes)
    .def("release", &py_entry::release, release_doc)
    .def("__len__", [](const py_entry& x) { return x.size; })
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](py_entry& x, nb::args) { x.release(); })
    .def("__repr__", [](const py_entry& x) {
      return "<ferry.Entry hook=" + std::to_string(x.hook) + " seq=" + std::to_string(x.seq) +
             " size=" + std::to_string(x.size) + (x.released() ? " released>" : ">");
    });

  nb::class_<py_plan>(m, "Plan", "The entries of one forward captured into a graph (end_forward).")
    .def("__len__", &py_plan::size)
    .def_prop_ro("entries", [](const py_plan& p) {
      nb::list l;
      for (const auto& x : p.p.entries()) { l.append(nb::make_tuple(x.hook.value, x.bytes, x.dynamic)); }
      return l;
    });

}

}  // namespace ferry::python
