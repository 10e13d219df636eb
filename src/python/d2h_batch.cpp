// SPDX-License-Identifier: Apache-2.0
// init_d2h_batch: ferry.EntryBatch (d2h_batch.hpp).
#include "d2h_batch.hpp"

#include <nanobind/stl/string.h>

#include <string>

namespace ferry::python {

namespace {

/// A read-only numpy column over `v` (no copy), based on the batch's columns.
template <class T>
nb::object column(const std::shared_ptr<const py_batch::columns>& cols, const std::vector<T>& v,
                  nb::dlpack::dtype dt = nb::dtype<T>())
{
  auto* keep = new std::shared_ptr<const py_batch::columns>(cols);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const py_batch::columns>*>(p); });
  const std::size_t shape[1] = {v.size()};
  return nb::cast(nb::ndarray<nb::numpy, nb::ro>(v.data(), 1, shape, owner, nullptr, dt));
}

}  // namespace

py_batch::py_batch(std::vector<fd::entry_view>&& views, std::shared_ptr<graph_tie> channel,
                   std::shared_ptr<const fd::hook_schema> hooks)
  : held{std::make_shared<holder>()}, schema{std::move(hooks)}
{
  auto c = std::make_shared<columns>();
  const std::size_t n = views.size();
  c->hooks.reserve(n), c->seqs.reserve(n), c->sizes.reserve(n), c->tags.reserve(n), c->forwards.reserve(n);
  c->rows.reserve(n), c->ok.reserve(n);
  for (const auto& v : views) {
    c->hooks.push_back(v.hook().value);
    c->seqs.push_back(v.seq().value);
    c->sizes.push_back(v.size());
    c->tags.push_back(v.tag());
    c->forwards.push_back(v.forward_index());
    c->rows.push_back(v.rows());
    c->ok.push_back(v.ok() ? 1 : 0);
  }
  cols = std::move(c);
  held->v = std::move(views);
  held->channel = std::move(channel);
}

nb::object py_batch::view(long long i, bool torch) const
{
  const auto n = static_cast<long long>(size());
  FERRY_EXPECTS(held != nullptr, ferry::logic_error,
                "EntryBatch of {} entries: expected a live batch, got a released one ({}({}) after release())", n,
                torch ? "tensor" : "view", i);
  const long long k = i < 0 ? i + n : i;
  if (k < 0 || k >= n) {
    throw nb::index_error(("EntryBatch: index " + std::to_string(i) + " outside a batch of " + std::to_string(n) +
                           " entries").c_str());
  }
  return entry_array(held->v[static_cast<std::size_t>(k)], schema.get(), held, torch);
}

void init_d2h_batch(nb::module_& m)
{
  nb::class_<py_batch>(m, "EntryBatch",
                       "Delivered D2H entries as one object (Channel.poll_batch): numpy columns (hooks, seqs, sizes, "
                       "tags, forwards, rows, ok), zero-copy views per entry (batch[i], view(i), tensor(i), "
                       "iteration), one release() for all their staging.")
    .def("__len__", &py_batch::size)
    .def("__getitem__", [](const py_batch& b, long long i) { return b.view(i, false); }, nb::arg("i"),
         nb::sig("def __getitem__(self, i: int) -> numpy.ndarray"))
    .def("view", [](const py_batch& b, long long i) { return b.view(i, false); }, nb::arg("i"),
         nb::sig("def view(self, i: int) -> numpy.ndarray"),
         "Entry i's payload, a read-only numpy view of the staging (no copy): typed by the channel's schema "
         "where it declares the hook (as Entry.numpy()), else uint8 bytes. It holds the batch's staging.")
    .def("tensor", [](const py_batch& b, long long i) { return b.view(i, true); }, nb::arg("i"),
         nb::sig("def tensor(self, i: int) -> object"),
         "Entry i's payload as a torch.Tensor over the staging (no copy; as Entry.tensor()).")
    .def(
      "__iter__",
      [](nb::handle self) {
        const auto n = nb::cast<const py_batch&>(self).size();
        nb::module_ builtins = nb::module_::import_("builtins");
        return nb::iter(builtins.attr("map")(self.attr("view"), builtins.attr("range")(n)));
      },
      nb::sig("def __iter__(self) -> collections.abc.Iterator[numpy.ndarray]"), "The views, in entry order.")
    .def_prop_ro("hooks", [](const py_batch& b) { return column(b.cols, b.cols->hooks); },
                 nb::sig("def hooks(self) -> numpy.ndarray"), "uint32 hook ids, in entry order.")
    .def_prop_ro("seqs", [](const py_batch& b) { return column(b.cols, b.cols->seqs); },
                 nb::sig("def seqs(self) -> numpy.ndarray"), "uint64 publication order numbers.")
    .def_prop_ro("sizes", [](const py_batch& b) { return column(b.cols, b.cols->sizes); },
                 nb::sig("def sizes(self) -> numpy.ndarray"), "uint64 payload bytes.")
    .def_prop_ro("tags", [](const py_batch& b) { return column(b.cols, b.cols->tags); },
                 nb::sig("def tags(self) -> numpy.ndarray"), "uint64 forward tags (begin_forward / plan tag=).")
    .def_prop_ro("forwards", [](const py_batch& b) { return column(b.cols, b.cols->forwards); },
                 nb::sig("def forwards(self) -> numpy.ndarray"), "uint64 forward indices in the channel.")
    .def_prop_ro("rows", [](const py_batch& b) { return column(b.cols, b.cols->rows); },
                 nb::sig("def rows(self) -> numpy.ndarray"), "uint64 rows of capture_rows entries (0: captured whole).")
    .def_prop_ro(
      "ok",
      [](const py_batch& b) {
        const nb::dlpack::dtype bool8{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool), 8, 1};
        return column(b.cols, b.cols->ok, bool8);
      },
      nb::sig("def ok(self) -> numpy.ndarray"), "bool: whether each entry was delivered ok (else view() raises).")
    .def_prop_ro("released", &py_batch::released)
    .def("release", &py_batch::release,
         "Gives every entry's staging back at once (once the views taken from the batch are gone too). Idempotent; "
         "the columns stay readable, the views raise LogicError.")
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](py_batch& b, nb::args) { b.release(); })
    .def("__repr__", [](const py_batch& b) {
      return "<ferry.EntryBatch " + std::to_string(b.size()) + " entries" + (b.released() ? " released>" : ">");
    });
}

}  // namespace ferry::python
