// SPDX-License-Identifier: Apache-2.0
// init_h2d: ferry.Publisher, Slot, Producer and Buffer.
#include "h2d.hpp"
#include "h2d_scopes.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace ferry::python {

void init_h2d_types(nb::module_& m)
{
  nb::class_<py_buffer>(m, "Buffer", "A declared H2D buffer (Publisher.declare).")
    .def("__repr__",
         [](const py_buffer& b) {
           return "<ferry.Buffer '" + b.name + "' " + nb::cast<std::string>(nb::str(b.np_dtype)) + " capacity=" +
                  std::to_string(b.capacity) + " " + b.unit + (b.unit == "rows" ? " of " + std::to_string(b.row) : "") +
                  ">";
         })
    .def_ro("name", &py_buffer::name)
    .def_ro("capacity", &py_buffer::capacity)
    .def_ro("unit", &py_buffer::unit)
    .def_ro("dtype", &py_buffer::np_dtype)
    .def_prop_ro("shape", [](const py_buffer& b) {
      nb::list l;
      for (auto s : b.shape()) { l.append(s); }
      return nb::tuple(l);
    })
    .def_prop_ro("nbytes", &py_buffer::bytes);

}

template <class B>
void init_h2d(nb::module_& m)
{
  using P = py_publisher<B>;
  nb::class_<py_slot<B>>(m, "Slot", "One forward epoch of a runner slot (Publisher.begin); a context manager.")
    .def("finish", &py_slot<B>::finish)
    .def_prop_ro("active", [](const py_slot<B>& s) { return s.g.has_value(); })
    .def_prop_ro("slot", [](const py_slot<B>& s) { return s.g ? static_cast<long>(s.g->slot()) : -1L; })
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](py_slot<B>& s, nb::args) {
      if (s.g) { s.finish(); }
    });

  nb::class_<py_producer<B>>(m, "Producer", "A group's producer scope (Publisher.producer); a context manager.")
    .def("source", &py_producer<B>::source, nb::arg("buffer"),
         nb::sig("def source(self, buffer: ferry._ferry.Buffer) -> numpy.ndarray"),
         "A zero-copy view of the slot's pinned source of buffer; writable until the scope closes, then read-only.")
    .def("set_count", &py_producer<B>::set_count, nb::arg("buffer"), nb::arg("count"))
    .def("write", &py_producer<B>::write, nb::arg("buffer"), nb::arg("array"))
    .def("close", &py_producer<B>::close)
    .def_prop_ro("group", [](const py_producer<B>& p) { return p.group; })
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](py_producer<B>& p, nb::args) { p.close(); });

  nb::class_<P>(m, "Publisher", "H2D publisher: per-forward metadata into fixed device addresses.")
    .def(nb::init<int>(), nb::arg("device") = 0)
    .def("declare", &P::declare, nb::arg("name"), nb::arg("groups"), nb::arg("dtype") = "uint8",
         nb::arg("capacity"), nb::arg("unit") = "elements", nb::arg("row").none() = nb::none(),
         nb::arg("dst").none() = nb::none(),
         // capacity has no default but follows dtype's (positional use: declare(name, groups, dtype, capacity))
         nb::sig("def declare(self, name: str, groups: str | typing.Sequence[str], dtype: object = 'uint8', "
                 "capacity: int = ..., unit: str = 'elements', row: int | None = None, dst: object | None = None) "
                 "-> ferry._ferry.Buffer"))
    .def("initialize", &P::initialize, nb::arg("slots") = 2, nb::arg("stream").none() = nb::none(),
         nb::arg("upload").none() = nb::none(), nb::arg("debug_sources").none() = nb::none())
    .def(
      "begin",
      [](nb::handle self, uint_arg slot) {
        auto& p = nb::cast<P&>(self);
        auto s = std::make_unique<py_slot<B>>();
        s->owner = nb::borrow(self);
        s->g.emplace(p.begin(slot));
        return s.release();
      },
      nb::arg("slot"), nb::rv_policy::take_ownership)
    .def(
      "producer",
      [](nb::handle self, const std::string& group, std::optional<uint_arg> slot) {
        auto& p = nb::cast<P&>(self);
        auto pr = std::make_unique<py_producer<B>>();
        pr->owner = nb::borrow(self);
        pr->group = group;
        pr->g.emplace(p.producer(group, slot));
        return pr.release();
      },
      nb::arg("group"), nb::arg("slot").none() = nb::none(), nb::rv_policy::take_ownership,
      "The group's producer scope in the active slot; slot: the slot expected active (else LogicError, nothing "
      "held).")
    .def("set_count", &P::set_count, nb::arg("buffer"), nb::arg("count"))
    .def("publish", &P::publish, nb::arg("group"), nb::arg("stream").none() = nb::none())
    .def("stage", &P::stage, nb::arg("group"))
    .def("capture_upload", &P::capture_upload, nb::arg("group"), nb::arg("slot"),
         nb::arg("stream").none() = nb::none())
    .def("recover", &P::recover)
    .def("device_pointer", &P::device_pointer, nb::arg("buffer"))
    .def(
      "device_array",
      [](nb::handle self, const py_buffer& pb) -> nb::object {
        auto& p = nb::cast<P&>(self);
        const auto& b = p.buffer(pb, "Publisher.device_array");
        void* ptr = reinterpret_cast<void*>(p.device_pointer(b));
        FERRY_EXPECTS(ptr != nullptr, ferry::logic_error,
                      "Publisher.device_array('{}'): expected an initialized publisher (its device memory exists after "
                      "initialize()), got none",
                      b.name);
        if constexpr (is_host<B>) {  // read-only: the destination is written by publications only
          return nb::cast(buffer_view<nb::ndarray<nb::numpy, nb::ro>>(b, ptr, self, nb::device::cpu::value, 0));
        } else {
          return nb::cast(buffer_view<nb::ndarray<>>(b, ptr, self, traits<B>::dl_device, p.device()));
        }
      },
      nb::arg("buffer"))
    .def("info", &P::info, nb::arg("group"))
    .def_prop_ro("invalidated", [](P& p) { return p.get().invalidated(); })
    .def_prop_ro("debug_sources", [](P& p) { return p.get().debug_sources(); })
    .def_prop_ro("invalidation_reason", [](P& p) { return p.get().invalidation_reason(); })
    .def_prop_ro("device", &P::device)
    .def("__repr__",  // "#id" names the publisher in errors (a foreign Buffer)
         [](const P& p) {
           return "<ferry.Publisher #" + std::to_string(p.id()) + " " + traits<B>::name + " device " +
                  std::to_string(p.device()) + ">";
         })
    .def_prop_ro_static("backend", [](nb::handle) { return traits<B>::name; });
}

template void init_h2d<fb::host_backend>(nb::module_&);
#if defined(FERRY_PYTHON_CUDA)
template void init_h2d<fb::cuda_backend>(nb::module_&);
#endif

}  // namespace ferry::python
