// SPDX-License-Identifier: Apache-2.0
// ferry.ShmReader and ferry.ShmEntry: the reader of a shared-memory stream (ferry.sinks.shm_stream), a thin
// handle on ferry::sink::shm_reader (sink/shm_reader.hpp) for another process, which needs no GPU. Entries
// are zero-copy: numpy() is a read-only view of the stream's staging (tensor() a torch one), typed by the
// stream's hook schema where it declares the hook (the core's shm_entry::typed, arrays made by d2h_typed.hpp as
// for ferry.Entry), else uint8 bytes; valid while the entry (or the view) lives and until release(); an entry
// goes back to the producer when released, when its last reference dies, or as the `with` block ends. Its
// forward's attribution (reserved, requests, meta, rows, rows_of) is ferry.Entry's, from the core's shm_entry.
#include "arrays.hpp"
#include "d2h_typed.hpp"
#include "errors.hpp"

#include <ferry/sink/shm_reader.hpp>

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <optional>
#include <string>

namespace ferry::python {

namespace {

namespace fk = ferry::sink;
namespace fd = ferry::d2h;

const char* status_name(fd::entry_status s)
{
  switch (s) {
    case fd::entry_status::ok: return "ok";
    case fd::entry_status::size_overflow: return "size_overflow";
    case fd::entry_status::selection_error: return "selection_error";
  }
  return "unknown";
}

/// One entry; numpy() views share `held`: the entry goes back once release() was called (or the entry died)
/// AND its last view died.
struct py_shm_entry {
  struct holder {
    fk::shm_entry e;
  };
  std::shared_ptr<holder> held;  // the fields below stay readable after release()
  std::uint64_t index, seq, forward, tag, size, row_bytes, reserved, rows;
  std::uint32_t hook;
  fd::entry_status status;
  fk::shm_attribution attribution;
  std::shared_ptr<const fd::hook_schema> schema;  ///< the stream's, as the entry was read
  std::shared_ptr<const fd::forward_meta> meta;   ///< the forward's attribution (null: none, or overflow)
  std::exception_ptr attribution_error;           ///< overflow: the core's attribution_overflow_error

  explicit py_shm_entry(fk::shm_entry&& x)
    : held{std::make_shared<holder>()}, index{x.index()}, seq{x.seq().value}, forward{x.forward_index()},
      tag{x.tag()}, size{x.size()}, row_bytes{x.row_bytes()}, reserved{x.reserved_bytes()}, rows{x.rows()},
      hook{x.hook().value}, status{x.status()}, attribution{x.attribution()}, schema{x.schema()}
  {
    try {
      meta = x.shared_meta();
    } catch (const fk::attribution_overflow_error&) {
      attribution_error = std::current_exception();  // raised by requests / meta / rows_of, after release() too
    }
    held->e = std::move(x);
  }
  /// The forward's attribution (null: none); raises the core's attribution_overflow_error for an overflow entry.
  [[nodiscard]] const fd::forward_meta* attributed() const
  {
    if (attribution_error) { std::rethrow_exception(attribution_error); }
    return meta.get();
  }
  /// rows_of(request): the request's rows, a [rows, row_bytes] uint8 read-only view of the staging (no copy; the
  /// array holds the entry). The core's shm_entry::rows_of checks a row entry, a known request, rows in the entry.
  [[nodiscard]] nb::ndarray<nb::numpy, const std::uint8_t, nb::ndim<2>> rows_of(std::uint64_t request) const
  {
    const auto b = live("rows_of()").rows_of(request);
    auto* keep = new std::shared_ptr<holder>(held);
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<holder>*>(p); });
    const std::size_t shape[2] = {b.size() / row_bytes, row_bytes};
    return {reinterpret_cast<const std::uint8_t*>(b.data()), 2, shape, owner};
  }
  /// The hook's schema entry, or null (undeclared).
  [[nodiscard]] const fd::hook_spec* spec() const { return schema ? schema->find(fd::hook_id{hook}) : nullptr; }
  [[nodiscard]] const fk::shm_entry& live(const char* what) const
  {
    FERRY_EXPECTS(held != nullptr, ferry::logic_error,
                  "ShmEntry {} (hook {}, seq {}): expected a live entry, got a released one ({} after release())",
                  index, hook, seq, what);
    return held->e;
  }
  /// The payload over the staging (no copy; the array holds the entry): the hook's tensor where the schema
  /// declares it and not `raw` (the core's typed(): entry_shape_error for a size that does not fit), else bytes.
  [[nodiscard]] nb::object array(bool torch, bool raw) const
  {
    const fk::shm_entry& e = live(torch ? "tensor()" : "numpy()");
    if (!raw && e.spec() != nullptr) { return typed_array(e.typed(), held, torch); }
    return bytes_array(e.bytes(), held, torch);  // SizeOverflowError / Error for an entry without bytes
  }
  [[nodiscard]] nb::object array_numpy(bool raw) const { return array(false, raw); }
  [[nodiscard]] nb::object array_torch(bool raw) const { return array(true, raw); }
  [[nodiscard]] nb::bytes to_bytes() const
  {
    const auto b = live("tobytes()").bytes();
    return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }
};

struct py_shm_reader {
  fk::shm_reader r;
  py_shm_reader(const std::string& name, std::chrono::milliseconds t) : r{name, t} {}

  /// Up to `max` entries: waits up to `timeout` seconds (None: until one comes or the stream ends) for the
  /// first, the GIL released, in slices so Ctrl-C is honoured.
  std::vector<py_shm_entry> poll(std::size_t max, std::optional<double> timeout)
  {
    FERRY_EXPECTS(max > 0, ferry::logic_error, "ShmReader.poll: expected max_entries >= 1, got 0");
    if (timeout) { (void)seconds_arg(*timeout, "ShmReader.poll", "timeout", -HUGE_VAL, HUGE_VAL); }
    const auto start = std::chrono::steady_clock::now();
    const auto limit = timeout ? std::chrono::duration<double>(std::max(*timeout, 0.0))
                               : std::chrono::duration<double>::max();
    for (;;) {
      std::vector<fk::shm_entry> got;
      {
        gil_release g;
        const std::chrono::duration<double> left = limit - (std::chrono::steady_clock::now() - start);
        const std::chrono::duration<double> slice = std::clamp(left, std::chrono::duration<double>::zero(),
                                                               std::chrono::duration<double>(0.05));
        got = r.poll(max, std::chrono::duration_cast<std::chrono::microseconds>(slice));
      }
      if (!got.empty() || r.ended() || std::chrono::steady_clock::now() - start >= limit || interpreter_exiting()) {
        std::vector<py_shm_entry> out;
        out.reserve(got.size());
        for (auto& e : got) { out.emplace_back(std::move(e)); }
        return out;
      }
      if (PyErr_CheckSignals() != 0) { throw nb::python_error(); }
    }
  }
};

}  // namespace

void init_shm_reader(nb::module_& m)
{
  nb::class_<py_shm_entry>(m, "ShmEntry",
                           "One entry of a shared-memory stream: its bytes in the stream's staging until released.")
    .def_ro("index", &py_shm_entry::index, "Position in the stream (0, 1, ...).")
    .def_ro("hook", &py_shm_entry::hook)
    .def_ro("seq", &py_shm_entry::seq, "The channel's entry sequence number.")
    .def_ro("forward", &py_shm_entry::forward, "The channel's forward index.")
    .def_ro("tag", &py_shm_entry::tag, "The forward's tag (begin_forward / plan), else its index.")
    .def_ro("size", &py_shm_entry::size)
    .def_ro("row_bytes", &py_shm_entry::row_bytes, "capture_rows: bytes per row (0: captured whole).")
    .def_ro("reserved", &py_shm_entry::reserved, "The entry's reservation (a size_overflow entry's size exceeded it).")
    .def_ro("rows", &py_shm_entry::rows, "capture_rows: the rows the entry holds (0: whole, or not ok).")
    .def_prop_ro(
      "attribution",
      [](const py_shm_entry& x) {
        return std::string{x.attribution == fk::shm_attribution::present    ? "present"
                           : x.attribution == fk::shm_attribution::overflow ? "overflow"
                                                                            : "none"};
      },
      "The forward's attribution: 'present', 'none' (none given) or 'overflow' (larger than the stream's record "
      "region: requests, meta and rows_of raise AttributionOverflowError).")
    .def_prop_ro(
      "meta",
      [](const py_shm_entry& x) -> nb::object {
        const fd::forward_meta* m = x.attributed();
        if (m == nullptr || m->user.empty()) { return nb::none(); }
        return nb::bytes(reinterpret_cast<const char*>(m->user.data()), m->user.size());
      },
      nb::sig("def meta(self) -> bytes | None"), "The forward's meta= bytes (None: none).")
    .def_prop_ro(
      "requests",
      [](const py_shm_entry& x) {
        nb::list l;
        if (const fd::forward_meta* m = x.attributed()) {
          for (const auto& r : m->requests) { l.append(nb::make_tuple(r.request, r.first_row, r.rows)); }
        }
        return l;
      },
      nb::sig("def requests(self) -> list[tuple[int, int, int]]"),
      "The forward's requests as (request, first_row, rows) tuples, in the entry's row order.")
    .def("rows_of", &py_shm_entry::rows_of, nb::arg("request"),
         "The rows of one request of the forward (requests=), a read-only [rows, row_bytes] uint8 view (no copy).")
    .def_prop_ro("status", [](const py_shm_entry& x) { return std::string{status_name(x.status)}; },
                 "'ok', 'size_overflow' or 'selection_error' (the last two have no bytes).")
    .def_prop_ro("ok", [](const py_shm_entry& x) { return x.status == fd::entry_status::ok; })
    .def_prop_ro("released", [](const py_shm_entry& x) { return x.held == nullptr; })
    .def_prop_ro("views", [](const py_shm_entry& x) { return x.held ? x.held.use_count() - 1 : 0; })
    .def("numpy", &py_shm_entry::array_numpy, nb::arg("raw") = false,
         nb::sig("def numpy(self, raw: bool = False) -> numpy.ndarray"),
         "The payload, a read-only numpy view of the stream's staging (zero-copy): [rows, *row_shape] of the hook's "
         "dtype when the stream's schema declares the hook (BF16 / F8: the elements' bits, uint16 / uint8), else "
         "(or raw=True) uint8 bytes, 1-D.")
    .def("tensor", &py_shm_entry::array_torch, nb::arg("raw") = false,
         nb::sig("def tensor(self, raw: bool = False) -> object"),
         "The payload as a CPU torch.Tensor over the stream's staging (zero-copy; needs torch): [rows, *row_shape] "
         "of the hook's dtype (bfloat16 included) when the schema declares the hook, else (or raw=True) uint8 "
         "bytes. The mapping is read-only: an in-place op on it faults; clone() first.")
    .def_prop_ro(
      "name", [](const py_shm_entry& x) { return x.spec() ? nb::cast(x.spec()->name) : nb::none(); },
      nb::sig("def name(self) -> str | None"), "The hook's name in the stream's schema (None: not declared).")
    .def_prop_ro(
      "hook_name", [](const py_shm_entry& x) { return x.spec() ? nb::cast(x.spec()->name) : nb::none(); },
      nb::sig("def hook_name(self) -> str | None"), "The same as name.")
    .def_prop_ro(
      "dtype",
      [](const py_shm_entry& x) {
        return x.spec() ? nb::cast(std::string{fd::dtype_name(x.spec()->type)}) : nb::none();
      },
      nb::sig("def dtype(self) -> str | None"), "The hook's dtype (safetensors' name, 'BF16'; None: not declared).")
    .def_prop_ro(
      "shape",
      [](const py_shm_entry& x) -> nb::object {
        if (x.spec() == nullptr || x.status != fd::entry_status::ok) { return nb::none(); }
        nb::list l;
        for (auto d : x.schema->shape_of(fd::hook_id{x.hook}, x.size, x.row_bytes)) { l.append(d); }
        return nb::tuple(l);
      },
      nb::sig("def shape(self) -> tuple[int, ...] | None"),
      "[rows, *row_shape] from the schema (None: not declared, or not ok); LogicError if the size is not whole rows.")
    .def("tobytes", &py_shm_entry::to_bytes)
    .def("release", [](py_shm_entry& x) { x.held.reset(); },
         "Gives the entry back to the producer (once its numpy() views are gone too). Idempotent.")
    .def("__len__", [](const py_shm_entry& x) { return x.size; })
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](py_shm_entry& x, nb::args) { x.held.reset(); })
    .def("__repr__", [](const py_shm_entry& x) {
      return "<ferry.ShmEntry index=" + std::to_string(x.index) + " hook=" + std::to_string(x.hook) +
             " seq=" + std::to_string(x.seq) + " tag=" + std::to_string(x.tag) + " size=" + std::to_string(x.size) +
             (x.held ? ">" : " released>");
    });

  nb::class_<py_shm_reader>(m, "ShmReader",
                            "The reader of a shared-memory stream (ferry.sinks.shm_stream), in another process; no GPU "
                            "needed. One reader per stream at a time.")
    .def(
      "__init__",
      [](py_shm_reader* self, const std::string& name, double timeout) {
        const double t = seconds_arg(timeout, "ShmReader", "timeout");
        gil_release g;  // waits for the stream and its session
        new (self) py_shm_reader(name, std::chrono::milliseconds(static_cast<std::int64_t>(t * 1000.0)));
      },
      nb::arg("name"), nb::arg("timeout") = 5.0)
    .def("poll", &py_shm_reader::poll, nb::arg("max_entries") = 64, nb::arg("timeout") = 0.0,
         "Up to max_entries entries in stream order; waits up to `timeout` seconds (None: until one comes or the "
         "stream ends) for the first. [] when none came or the stream ended (`ended`).")
    .def(
      "next",
      [](py_shm_reader& p, std::optional<double> timeout) -> std::optional<py_shm_entry> {
        auto v = p.poll(1, timeout);
        if (v.empty()) { return std::nullopt; }
        return std::move(v.front());
      },
      nb::arg("timeout") = nb::none(), "The next entry, or None (timeout, or the end of the stream).")
    .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__next__", [](py_shm_reader& p) {
      auto v = p.poll(1, std::nullopt);
      if (v.empty()) { throw nb::stop_iteration(); }
      return std::move(v.front());
    })
    .def_prop_ro("ended", [](const py_shm_reader& p) { return p.r.ended(); },
                 "The producer closed the stream and every entry was read.")
    .def_prop_ro("name", [](const py_shm_reader& p) { return p.r.name(); })
    .def_prop_ro(
      "schema", [](const py_shm_reader& p) { return schema_dict(*p.r.schema()); },
      "The stream's hook schema, {hook: (name, dtype name, row_shape)}: {} until the producer published one (its "
      "own, or its channel's before the first entry). LogicError for a corrupted schema region.")
    .def("stats", [](const py_shm_reader& p) {
      const auto s = p.r.stats();
      nb::dict d;
      d["entries_read"] = s.entries_read;
      d["bytes_read"] = s.bytes_read;
      d["entries_released"] = s.entries_released;
      d["held"] = s.held;
      d["published"] = s.published;
      d["session"] = s.session;
      d["start_index"] = s.start_index;
      d["generation"] = s.generation;
      d["producer_pid"] = s.producer_pid;
      return d;
    })
    .def("close", [](py_shm_reader& p) { p.r.close(); },
         "Gives back what was released and frees the reader slot. Entries not released are the next reader's "
         "(policy 'block'); their views must not be used after it.")
    .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
    .def("__exit__", [](py_shm_reader& p, nb::args) { p.r.close(); });
}

}  // namespace ferry::python
