// SPDX-License-Identifier: Apache-2.0
// _ferry.SequentialFile: a thin handle on ferry::sink::sequential_file (sink/sequential_file.hpp), a Python file
// object that pyarrow's IPC writer writes through (pyarrow.PythonFile): ferry.arrow's shards and ferry.engine's Arrow
// samples go to the medium through the safetensors sink's writer. Conversion only: write() takes any contiguous
// buffer (bytes, pyarrow.Buffer, numpy) and copies it with the GIL released.
#include "errors.hpp"

#include <ferry/sink/sequential_file.hpp>

#include <nanobind/stl/string.h>

#include <span>
#include <string>

namespace ferry::python {

namespace fk = ferry::sink;

void init_sequential_file(nb::module_& m)
{
  nb::class_<fk::sequential_file> c(m, "SequentialFile",
                                     "SequentialFile(path, *, durable=False): a file written front to back through "
                                     "ferry's sink writer (O_DIRECT where the filesystem allows when durable; close() "
                                     "syncs it then). A Python file object for pyarrow.PythonFile(f, mode='w').");
  c.def(
     "__init__",
     [](fk::sequential_file* self, const std::string& path, bool durable) {
       new (self) fk::sequential_file(path, durable);
     },
     nb::arg("path"), nb::kw_only(), nb::arg("durable") = false)
    .def(
      "write",
      [](fk::sequential_file& f, nb::handle data) {
        Py_buffer view;
        if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_SIMPLE) != 0) { throw nb::python_error(); }
        const auto n = static_cast<std::size_t>(view.len);
        try {
          nb::gil_scoped_release unlocked;
          f.write(std::span<const std::byte>{static_cast<const std::byte*>(view.buf), n});
        } catch (...) {
          PyBuffer_Release(&view);
          throw;
        }
        PyBuffer_Release(&view);
        return n;
      },
      nb::arg("data"), "Appends a contiguous buffer; returns its length. OSError: a write of this file failed.")
    .def(
      "close",
      [](fk::sequential_file& f) {
        nb::gil_scoped_release unlocked;
        f.close();
      },
      "Every byte in the file (synced when durable); again: nothing.")
    .def("flush", [](fk::sequential_file&) {}, "Nothing: close() puts every byte in the file.")
    .def("tell", &fk::sequential_file::size, "Bytes written so far.")
    .def("writable", [](fk::sequential_file&) { return true; })
    .def("readable", [](fk::sequential_file&) { return false; })
    .def("seekable", [](fk::sequential_file&) { return false; })
    .def_prop_ro("closed", &fk::sequential_file::closed)
    .def_prop_ro("name", [](fk::sequential_file& f) { return f.path().string(); });
}

}  // namespace ferry::python
