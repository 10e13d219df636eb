// SPDX-License-Identifier: Apache-2.0
// _ferry.record_layout: the records of a reducer (ferry/d2h/reducer.hpp: record_bytes, record_fields) as Python
// reads them (ferry/reduce.py decodes a reduced entry with it). Conversion only: the layout is the core's.
#include "errors.hpp"

#include <ferry/d2h/reducer.hpp>
#include <ferry/error.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace nb = nanobind;

namespace ferry::python {

namespace fd = ferry::d2h;

namespace {
/// The reducer `spec` names (the core's parse_reducer); logic_error for another spec.
fd::reducer reducer_of(const std::string& spec)
{
  fd::reducer r;
  FERRY_EXPECTS(fd::parse_reducer(spec, r), ferry::logic_error,
                "ferry.reduce: expected a reducer 'topk(K)', 'fp8_e4m3', 'mean' or 'stats', got '{}'", spec);
  return r;
}
}  // namespace

void init_reduce(nb::module_& m)
{
  m.def(
      "is_reducer",
      [](const std::string& spec) {
        fd::reducer r;
        return fd::parse_reducer(spec, r);
      },
      nb::arg("spec"), "Whether `spec` names a reducer ('topk(K)', 'fp8_e4m3', 'mean', 'stats': reducer.hpp).");
  m.def(
      "record_unit",
      [](const std::string& spec) {
        const fd::reducer r = reducer_of(spec);
        return std::string{fd::record_per_row(r) ? "row" : fd::records_per_item(r, 2) == 1 ? "item" : "entry"};
      },
      nb::arg("spec"), "What one record of reducer `spec` stands for: 'row', 'item' (a request's window) or 'entry'.");
  m.def(
      "record_layout",
      [](const std::string& spec, std::uint64_t width) {
        const fd::reducer r = reducer_of(spec);
        FERRY_EXPECTS(width > 0, ferry::logic_error, "ferry.reduce: {}: expected a row width >= 1, got 0", spec);
        const fd::record_layout l = fd::record_fields(r, width);
        std::vector<std::tuple<std::string, std::string, std::uint64_t, std::uint64_t, bool>> fields;
        for (std::uint32_t i = 0; i < l.n; ++i) {
          const auto& f = l.fields[i];
          fields.emplace_back(std::string{f.name}, std::string{f.dtype}, f.offset, f.count, f.scalar);
        }
        return std::make_tuple(fd::record_bytes(r, width), std::move(fields));
      },
      nb::arg("spec"), nb::arg("width"),
      "(record_bytes, [(name, dtype, offset, count, scalar)]) of one record of the reducer `spec` over rows of `width` "
      "elements (ferry/d2h/reducer.hpp).");
}

}  // namespace ferry::python
