// SPDX-License-Identifier: Apache-2.0
// _ferry.SequentialFile: a thin handle on ferry::sink::sequential_file (sink/sequential_file.hpp), a Python file
// object that pyarrow's IPC writer writes through (pyarrow.PythonFile): ferry.arrow's shards and ferry.engine's Arrow
// samples go to the medium through the safetensors sink's writer. Conversion only: write() takes any contiguous
// buffer (bytes, pyarrow.Buffer, numpy) and copies it with the GIL released. And _ferry.widen_to_f32, the
// Arrow layouts' float32 from BF16 / F16 captures (sink/widen.hpp), with the GIL released.
#include "arrays.hpp"  // held_buffer
#include "errors.hpp"

#include <ferry/sink/sequential_file.hpp>
#include <ferry/sink/widen.hpp>

#include <nanobind/stl/string.h>

#include <span>
#include <string>

namespace ferry::python {

namespace fk = ferry::sink;

namespace {
/// "<what>: expected a C-contiguous[ writable] buffer": held_buffer's TypeError (with ", got <type>").
std::string contiguous(const char* what, int flags)
{
  return std::string{what} + ": expected a C-contiguous" + ((flags & PyBUF_WRITABLE) != 0 ? " writable" : "") +
         " buffer";
}
/// (copy, wait) seconds of a sequential_file_times.
nb::tuple times_tuple(const fk::sequential_file_times& t) { return nb::make_tuple(t.copy_seconds, t.wait_seconds); }
}  // namespace

void init_sequential_file(nb::module_& m)
{
  const fk::write_tuning dflt{};
  nb::class_<fk::file_writer>(m, "FileWriter",
                              "FileWriter(*, io_threads, write_buffers, write_bytes): the buffers and I/O threads "
                              "that SequentialFiles given it share (a run's shards reuse them warm; one may close on "
                              "another thread while the next is written): write_buffers page-aligned buffers of "
                              "write_bytes, io_threads writing full ones at once (sink::write_tuning; every value "
                              "equally correct, LogicError out of range). The first write error of any of its files "
                              "ends it: their later writes and closes raise it.")
    .def(
      "__init__",
      [](fk::file_writer* self, std::size_t io_threads, std::size_t write_buffers, std::size_t write_bytes) {
        new (self) fk::file_writer(fk::write_tuning{io_threads, write_buffers, write_bytes});
      },
      nb::kw_only(), nb::arg("io_threads") = dflt.io_threads, nb::arg("write_buffers") = dflt.write_buffers,
      nb::arg("write_bytes") = dflt.write_bytes)
    .def_prop_ro(
      "times", [](const fk::file_writer& w) { return times_tuple(w.times()); },
      "(copy, wait): seconds its files' write() calls spent copying, and waiting for a buffer, over all of them.")
    .def_prop_ro("max_open", &fk::file_writer::max_open,
                 "How many of its files may be open at once (write_buffers - 1; one more is a LogicError).");
  nb::class_<fk::sequential_file> c(m, "SequentialFile",
                                     "SequentialFile(path, *, durable=False, writer=None): a file written front to "
                                     "back through ferry's sink writer (O_DIRECT where the filesystem allows when "
                                     "durable; close() syncs it then), its own or `writer`'s (a FileWriter). A Python "
                                     "file object for pyarrow.PythonFile(f, mode='w').");
  c.def(
     "__init__",
     [](fk::sequential_file* self, const std::string& path, bool durable, const fk::file_writer* writer) {
       new (self) fk::sequential_file(path, durable, writer != nullptr ? *writer : fk::file_writer{});
     },
     nb::arg("path"), nb::kw_only(), nb::arg("durable") = false, nb::arg("writer").none() = nb::none())
    .def(
      "write",
      [](fk::sequential_file& f, nb::handle data) {
        const held_buffer in{data, PyBUF_SIMPLE, contiguous("SequentialFile.write: data", PyBUF_SIMPLE)};
        const auto n = static_cast<std::size_t>(in.view.len);
        nb::gil_scoped_release unlocked;
        f.write(std::span<const std::byte>{static_cast<const std::byte*>(in.view.buf), n});
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
    .def_prop_ro(
      "times", [](fk::sequential_file& f) { return times_tuple(f.times()); },
      "(copy, wait): seconds write() spent copying into the writer's buffers, and waiting for one the I/O threads "
      "had not given back (the medium the limit); with a shared FileWriter, over all of its files.")
    .def_prop_ro("name", [](fk::sequential_file& f) { return f.path().string(); });
  m.def(
    "widen_to_f32",
    [](nb::handle src, const std::string& dtype, nb::handle out) {
      FERRY_EXPECTS(dtype == "BF16" || dtype == "F16", ferry::logic_error,
                    "ferry.widen_to_f32: expected dtype 'BF16' or 'F16', got '{}'", dtype);
      const held_buffer in{src, PyBUF_C_CONTIGUOUS, contiguous("ferry.widen_to_f32: src", PyBUF_C_CONTIGUOUS)};
      constexpr int w = PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE;
      const held_buffer to{out, w, contiguous("ferry.widen_to_f32: out", w)};
      nb::gil_scoped_release unlocked;
      fk::widen_to_f32({static_cast<const std::uint16_t*>(in.view.buf), static_cast<std::size_t>(in.view.len) / 2},
                       dtype == "BF16" ? fk::widen_from::bf16 : fk::widen_from::f16,
                       {static_cast<float*>(to.view.buf), static_cast<std::size_t>(to.view.len) / 4});
    },
    nb::arg("src"), nb::arg("dtype"), nb::arg("out"),
    "out (float32, C-contiguous) = src's BF16 or F16 values (C-contiguous 16-bit) widened exactly; LogicError "
    "when out does not hold one float per value.");
}

}  // namespace ferry::python
