// SPDX-License-Identifier: Apache-2.0
// ferry._ferry: the nanobind extension behind the `ferry` package, one init_<area> per file. One submodule
// per backend compiled in (`host` always, `cuda` with FERRY_PYTHON_CUDA), each with Channel, Publisher,
// Stream, Graph, Slot and Producer; backend-independent types (Entry, Plan, Buffer), the exceptions and the
// C ABI capsule live at the top.
#include "d2h_channel.hpp"
#include "errors.hpp"
#include "h2d.hpp"

namespace nb = nanobind;
namespace fp = ferry::python;

namespace ferry::python {
void init_capi(nb::module_& m);         // capi.cpp
void init_d2h_fields(nb::module_& m);   // d2h_config.cpp
void init_sink(nb::module_& m);         // sink.cpp
void init_shm_stream(nb::module_& m);   // shm_stream.cpp
void init_shm_reader(nb::module_& m);   // shm_reader.cpp
void init_sample_assembler(nb::module_& m);  // sample_assembler.cpp
void init_reduce(nb::module_& m);       // reduce.cpp
void init_sequential_file(nb::module_& m);  // sequential_file.cpp
template <class B>
void init_capture_fn(nb::module_& m);   // d2h_capture_fn.cpp
}  // namespace ferry::python

namespace {

template <class B>
void init_backend(nb::module_& m)
{
  fp::init_streams<B>(m);
  fp::init_d2h_channel<B>(m);
  fp::init_capture_fn<B>(m);
  fp::init_h2d<B>(m);
}

}  // namespace

NB_MODULE(_ferry, m)
{
  m.doc() = "ferry: GPU<->CPU transfer publication (D2H channel, H2D publisher); see docs/api/python.md";
  // Interpreter exit (gil.hpp, exit_hooks and exit_state): atexit runs before module teardown (every stream
  // still alive: a forward left open is ended here) and before finalization ends daemon threads.
  m.def("_on_interpreter_exit", &fp::on_interpreter_exit,
        "atexit hook: ends the forwards left open (one line each), then no ferry call releases the GIL (daemon "
        "threads end outside ferry).");
  nb::module_::import_("atexit").attr("register")(m.attr("_on_interpreter_exit"));
  // A daemon thread that still references a channel at exit keeps it alive past finalization: expected,
  // not a reference-counting bug, so nanobind's leak report at exit would only alarm.
  nb::set_leak_warnings(false);
  // The tensor reader of ferry/_torch_ops.so (tensor_reader.h), lent by ferry.torch_ops at its import.
  m.def(
    "_bind_tensor_reader",
    [](std::uintptr_t address) {
      const auto* r = reinterpret_cast<const ferry_tensor_reader*>(address);
      if (r == nullptr) {  // 0 unbinds: the attribute path again (tests compare the two)
        fp::tensor_reader_slot().store(nullptr, std::memory_order_release);
        return;
      }
      FERRY_EXPECTS(r->version == FERRY_TENSOR_READER_VERSION && r->struct_size >= sizeof(ferry_tensor_reader) &&
                      r->read != nullptr && r->version_of != nullptr,
                    ferry::logic_error,
                    "ferry._ferry._bind_tensor_reader: expected a tensor reader of version {}, got version {}",
                    FERRY_TENSOR_READER_VERSION, r->version);
      fp::tensor_reader_slot().store(r, std::memory_order_release);
    },
    nb::arg("address"),
    "Binds the tensor reader of ferry/_torch_ops.so (ferry.torch_ops does, at its import); 0 unbinds.");
  m.def("_tensor_reader_bound", [] { return fp::tensor_reader() != nullptr; });

  fp::init_errors(m);
  fp::init_d2h_entry(m);
  fp::init_d2h_batch(m);
  fp::init_d2h_fields(m);
  fp::init_h2d_types(m);
  fp::init_capi(m);
  fp::init_sink(m);
  fp::init_shm_stream(m);
  fp::init_shm_reader(m);
  fp::init_sample_assembler(m);
  fp::init_reduce(m);
  fp::init_sequential_file(m);

  nb::module_ host = m.def_submodule("host", "The host-emulated backend (no GPU needed).");
  init_backend<ferry::backend::host_backend>(host);
#if defined(FERRY_PYTHON_CUDA)
  nb::module_ cuda = m.def_submodule("cuda", "The CUDA backend.");
  init_backend<ferry::backend::cuda_backend>(cuda);
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
