// SPDX-License-Identifier: Apache-2.0
// init_streams: ferry.Stream (an owning stream of one backend) and ferry.Graph (Stream.end_capture).
#include "stream.hpp"

namespace ferry::python {

template <class B>
void init_streams(nb::module_& m)
{
  auto stream_cls =
    nb::class_<py_stream<B>>(m, "Stream", "An owning stream of this backend.")
    .def(nb::init<int>(), nb::arg("device") = 0)
    .def_prop_ro("handle", [](const py_stream<B>& s) { return reinterpret_cast<std::uintptr_t>(s.handle()); })
    .def_prop_ro("device", [](const py_stream<B>& s) { return s.dev; })
    .def("synchronize",
         [](const py_stream<B>& s) {
           auto h = s.handle();
           gil_release g;
           B{}.stream_synchronize(h);
         })
    .def("close",
         [](py_stream<B>& s) {
           gil_release g;
           s.s.reset();
         })
    .def("begin_capture",
         [](const py_stream<B>& s) {
           auto h = s.handle();
           gil_release g;
           B{}.capture_begin(h);  // refused (already capturing): the capture in progress keeps its ties
           capture_ties::get().begin(reinterpret_cast<std::uintptr_t>(h));  // whose work the graph captures
         })
    .def("end_capture", [](const py_stream<B>& s) {
      auto h = s.handle();
      const auto key = reinterpret_cast<std::uintptr_t>(h);
      gil_release g;
      B b{};
      typename B::graph_type graph{};
      try {
        graph = b.capture_end(h);
      } catch (...) {
        bool capturing = false;  // refused with the capture going on (a stream that joined another's): ties kept
        try {
          capturing = b.stream_is_capturing(h);
        } catch (...) {
        }
        if (!capturing) { (void)capture_ties::get().end(key); }
        throw;
      }
      auto ties = capture_ties::get().end(key);
      auto exec = b.graph_instantiate(graph);
      b.graph_destroy(graph);
      auto* x = new py_graph<B>;
      x->exec = exec;
      x->ties = std::move(ties);
      return x;
    }, nb::rv_policy::take_ownership);
  if constexpr (!is_host<B>) {  // the CUDA stream protocol: (version, cudaStream_t)
    stream_cls.def("__cuda_stream__", [](const py_stream<B>& s) {
      return nb::make_tuple(0, reinterpret_cast<std::uintptr_t>(s.handle()));
    });
  }

  nb::class_<py_graph<B>>(m, "Graph", "An executable graph captured with Stream.begin_capture/end_capture.")
    .def("launch", [](const py_graph<B>& x, nb::handle stream) {
      auto s = resolve_stream<B>(stream, 0, "Graph.launch");
      gil_release g;
      // Every tie held shared until the launch is enqueued: its owner's memory is not freed meanwhile.
      std::vector<std::shared_lock<std::shared_mutex>> held;
      held.reserve(x.ties.size());
      for (const auto& t : x.ties) {
        held.emplace_back(t->mu);
        FERRY_EXPECTS(t->alive(), ferry::logic_error,
                      "Graph.launch: expected every channel and publisher whose work the graph captured alive, got "
                      "{} {} (the graph's kernels would write its freed memory); launch a graph only before its "
                      "channels close, and capture a new one for a new channel",
                      t->name, t->dead.load());
      }
      B{}.graph_launch(x.exec, s.handle());
    }, nb::arg("stream"));
  m.def("device_count", [] { return B{}.device_count(); });
}

template void init_streams<fb::host_backend>(nb::module_&);
#if defined(FERRY_PYTHON_CUDA)
template void init_streams<fb::cuda_backend>(nb::module_&);
#endif

}  // namespace ferry::python
