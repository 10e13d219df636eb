// SPDX-License-Identifier: Apache-2.0
// ferry._ferry: the nanobind extension behind the `ferry` package. One submodule per backend compiled in
// (`host` always, `cuda` with FERRY_PYTHON_CUDA), each with Channel, Publisher, Stream, Graph, Slot and
// Producer; backend-independent types (Entry, Plan, Buffer) and the exceptions live at the top.
#include "d2h.hpp"
#include "h2d.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
namespace fp = ferry::python;

namespace {

PyObject* make_exception(nb::module_& m, const char* name, PyObject* base, const char* doc,
                         PyObject* extra_base = nullptr)
{
  const std::string qual = std::string{"ferry."} + name;
  nb::object bases = extra_base != nullptr ? nb::make_tuple(nb::handle(base), nb::handle(extra_base))
                                           : nb::make_tuple(nb::handle(base));
  PyObject* t = PyErr_NewExceptionWithDoc(qual.c_str(), doc, bases.ptr(), nullptr);
  if (t == nullptr) { throw nb::python_error(); }
  m.attr(name) = nb::handle(t);
  return t;
}

template <class B>
void bind_backend(nb::module_& m)
{
  fp::bind_d2h<B>(m);
  fp::bind_h2d<B>(m);
  m.def("device_count", [] { return B{}.device_count(); });
}

}  // namespace

NB_MODULE(_ferry, m)
{
  m.doc() = "ferry: GPU<->CPU transfer publication (D2H channel, H2D publisher); see docs/api/python.md";
  // Interpreter exit (common.hpp, exit_state): atexit runs before finalization ends daemon threads.
  m.def("_on_interpreter_exit", &fp::on_interpreter_exit,
        "atexit hook: from now on no ferry call releases the GIL (daemon threads end outside ferry).");
  nb::module_::import_("atexit").attr("register")(m.attr("_on_interpreter_exit"));
  // A daemon thread that still references a channel at exit keeps it alive past finalization: expected,
  // not a reference-counting bug, so nanobind's leak report at exit would only alarm.
  nb::set_leak_warnings(false);

  auto& e = fp::errors();
  e.error = make_exception(m, "Error", PyExc_Exception, "Base of every error ferry raises.");
  e.logic = make_exception(m, "LogicError", e.error, "A contract violation by the caller (bad input, misuse).");
  e.oom = make_exception(m, "OutOfMemory", e.error, "An allocation failed, or a full ring with on_full='fail_fast'.",
                         PyExc_MemoryError);
  e.timeout = make_exception(m, "TimeoutError", e.error, "A blocking wait gave up.", PyExc_TimeoutError);
  e.invalidated =
    make_exception(m, "InvalidatedError", e.error, "An owner refuses work after an earlier backend failure.");
  e.backend = make_exception(m, "BackendError", e.error, "A backend (CUDA, host) call failed.");
  e.shutdown = make_exception(m, "ShutdownError", e.error,
                              "Channel.close() could not drain every reserved entry; .report lists them.");
  e.size_overflow = make_exception(m, "SizeOverflowError", e.error,
                                   "A dynamic entry's GPU-resolved size exceeded its reservation.");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    auto& x = fp::errors();
    try {
      std::rethrow_exception(p);
    } catch (const ferry::d2h::shutdown_error& err) {
      nb::object inst = nb::handle(x.shutdown)(err.what());
      inst.attr("report") = fp::py_channel<ferry::backend::host_backend>::report_dict(err.report());
      PyErr_SetObject(x.shutdown, inst.ptr());
    } catch (const ferry::d2h::size_overflow_error& err) {
      PyErr_SetString(x.size_overflow, err.what());
    } catch (const ferry::logic_error& err) {
      PyErr_SetString(x.logic, err.what());
    } catch (const ferry::out_of_memory& err) {
      PyErr_SetString(x.oom, err.what());
    } catch (const ferry::timeout_error& err) {
      PyErr_SetString(x.timeout, err.what());
    } catch (const ferry::invalidated_error& err) {
      PyErr_SetString(x.invalidated, err.what());
    } catch (const ferry::backend_error& err) {
      PyErr_SetString(x.backend, err.what());
    } catch (const ferry::error& err) {
      PyErr_SetString(x.error, err.what());
    }
  });

  nb::class_<fp::py_entry>(m, "Entry", "One delivered D2H entry: its bytes in pinned staging until released.")
    .def_ro("hook", &fp::py_entry::hook)
    .def_ro("seq", &fp::py_entry::seq)
    .def_ro("size", &fp::py_entry::size)
    .def_ro("reserved", &fp::py_entry::reserved)
    .def_ro("ok", &fp::py_entry::ok)
    .def_prop_ro("released", &fp::py_entry::released)
    .def_prop_ro("views", &fp::py_entry::views)
    .def("numpy", &fp::py_entry::numpy)
    .def("tobytes", &fp::py_entry::to_bytes)
    .def("release", &fp::py_entry::release)
    .def("__len__", [](const fp::py_entry& x) { return x.size; })
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](fp::py_entry& x, nb::args) { x.release(); })
    .def("__repr__", [](const fp::py_entry& x) {
      return "<ferry.Entry hook=" + std::to_string(x.hook) + " seq=" + std::to_string(x.seq) +
             " size=" + std::to_string(x.size) + (x.released() ? " released>" : ">");
    });

  nb::class_<fp::py_plan>(m, "Plan", "The entries of one forward captured into a graph (end_forward).")
    .def("__len__", &fp::py_plan::size)
    .def_prop_ro("entries", [](const fp::py_plan& p) {
      nb::list l;
      for (const auto& x : p.p.entries()) { l.append(nb::make_tuple(x.hook.value, x.bytes, x.dynamic)); }
      return l;
    });

  nb::class_<fp::py_buffer>(m, "Buffer", "A declared H2D buffer (Publisher.declare).")
    .def_ro("name", &fp::py_buffer::name)
    .def_ro("capacity", &fp::py_buffer::capacity)
    .def_ro("unit", &fp::py_buffer::unit)
    .def_ro("dtype", &fp::py_buffer::np_dtype)
    .def_prop_ro("shape", [](const fp::py_buffer& b) {
      nb::list l;
      for (auto s : b.shape()) { l.append(s); }
      return nb::tuple(l);
    })
    .def_prop_ro("nbytes", &fp::py_buffer::bytes);

  // The C ABI for native modules (ferry_capi.h): a capsule holding a static function table.
  m.attr("_capi") = nb::steal(PyCapsule_New(const_cast<ferry_capi*>(fp::capi_table()), FERRY_CAPI_NAME, nullptr));

  nb::module_ host = m.def_submodule("host", "The host-emulated backend (no GPU needed).");
  bind_backend<ferry::backend::host_backend>(host);
#if defined(FERRY_PYTHON_CUDA)
  nb::module_ cuda = m.def_submodule("cuda", "The CUDA backend.");
  bind_backend<ferry::backend::cuda_backend>(cuda);
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
