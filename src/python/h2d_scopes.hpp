// SPDX-License-Identifier: Apache-2.0
// ferry.Slot and ferry.Producer (bound by h2d.cpp): the scopes of one forward epoch and of one group's
// producer. The rules (slot, epoch, reentry, who may write which source) are the core's guards
// (ferry/h2d/detail/guards.hpp); these classes convert. A source view handed out by Producer.source() is a
// zero-copy numpy view of the slot's pinned source, writable while its scope is open: close() makes every view
// it handed out read-only (numpy's writeable flag), since a write after the scope, once the group is published,
// would change what the upload reads (docs/api/h2d.md, "When a source may be written").
#pragma once

#include "h2d.hpp"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace ferry::python {

template <class B>
struct py_slot {
  nb::object owner;  // the Publisher
  std::optional<fh::slot_guard<B>> g;
  void finish()
  {
    FERRY_EXPECTS(g.has_value(), ferry::logic_error, "Slot.finish: expected an active slot, got a finished one");
    auto guard = std::move(g);
    g.reset();
    gil_release rel;
    guard->finish();
  }
};

template <class B>
struct py_producer {
  nb::object owner;  // the Publisher
  std::string group;
  std::optional<fh::producer_guard<B>> g;
  std::vector<nb::weakref> views;  // every array source() handed out (made read-only at close)

  py_producer() = default;
  py_producer(const py_producer&) = delete;
  py_producer& operator=(const py_producer&) = delete;
  ~py_producer()
  {
    if (!interpreter_exiting()) { lock_views(); }
  }

  fh::producer_guard<B>& live(const char* what)
  {
    FERRY_EXPECTS(g.has_value(), ferry::logic_error,
                  "Producer('{}').{}: expected an open producer scope, got a closed one", group, what);
    return *g;
  }
  /// A writable zero-copy view of the source, read-only once the scope closes.
  [[nodiscard]] nb::object source(const py_buffer& pb)
  {
    auto& pub = nb::cast<py_publisher<B>&>(owner);
    const auto& b = pub.buffer(pb, "Producer.source");
    auto span = live("source").template source<std::byte>(fh::buffer_handle{b.index});
    nb::object view = buffer_view<nb::ndarray<nb::numpy>>(b, span.data(), owner, nb::device::cpu::value, 0).cast();
    views.emplace_back(view);
    return view;
  }
  void set_count(const py_buffer& pb, uint_arg n)
  {
    const auto h = nb::cast<py_publisher<B>&>(owner).handle(pb, "Producer.set_count");
    live("set_count").set_count(h, n.get("Producer.set_count", "count"));
  }
  /// Copies `array` (host, C-contiguous, the buffer's dtype) into the source and sets the count.
  void write(const py_buffer& pb, nb::handle obj)
  {
    auto& pub = nb::cast<py_publisher<B>&>(owner);
    const auto& b = pub.buffer(pb, "Producer.write");
    const std::string who = "Producer('" + group + "').write('" + b.name + "')";
    const any_array a = as_array(obj, "Producer.write");
    FERRY_EXPECTS(a.device_type() == nb::device::cpu::value, ferry::logic_error,
                  "{}: expected a host array (the pinned source), got DLPack device type {}", who, a.device_type());
    FERRY_EXPECTS(c_contiguous(a), ferry::logic_error, "{}: expected a C-contiguous array, got a strided one", who);
    FERRY_EXPECTS(a.dtype() == b.dtype, ferry::logic_error, "{}: expected dtype {}, got {}", who, dtype_str(b.dtype),
                  dtype_str(a.dtype()));
    std::size_t count = 0;
    if (b.unit == "rows") {
      FERRY_EXPECTS(a.ndim() == 2 && a.shape(1) == b.row, ferry::logic_error,
                    "{}: expected shape (n, {}), got a {}-d array", who, b.row, a.ndim());
      count = a.shape(0);
    } else {
      count = b.unit == "bytes" ? a.nbytes() : a.size();
    }
    FERRY_EXPECTS(a.nbytes() <= b.bytes(), ferry::logic_error, "{}: expected at most {} bytes (capacity), got {}", who,
                  b.bytes(), a.nbytes());
    auto span = live("write").template source<std::byte>(fh::buffer_handle{b.index});
    std::memcpy(span.data(), a.data(), a.nbytes());
    g->set_count(fh::buffer_handle{b.index}, count);
  }
  /// Ends the scope (the core releases the group's members) and makes every view source() gave read-only.
  void close()
  {
    g.reset();
    lock_views();
  }

 private:
  void lock_views() noexcept
  {
    for (auto& w : views) {
      try {
        nb::object v = w();
        if (!v.is_none()) { nb::setattr(v.attr("flags"), "writeable", nb::bool_(false)); }
      } catch (const nb::python_error&) {  // a view that cannot be flagged (never expected): nothing to undo
      }
    }
    views.clear();
  }
};

}  // namespace ferry::python
