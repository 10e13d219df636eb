// SPDX-License-Identifier: Apache-2.0
// A forward's metadata from Python (Channel.begin_forward / plan: tag=, requests=, meta=) as the core's
// d2h::forward_meta (ferry/d2h/forward_info.hpp); conversion only: the core keeps every rule about it.
//   tag       None | int in [0, 2^64)            the engine's step id (None: the forward's index)
//   requests  None | [request, ...]              request i holds row i of the forward's row entries
//             | [(request, first_row, rows), ...]
//   meta      None | bytes-like                  opaque bytes, delivered as given (Entry.meta)
#include "d2h_channel.hpp"

#include <string>

namespace ferry::python {

fd::forward_meta forward_meta_of(nb::handle tag, nb::handle requests, nb::handle meta, const char* who)
{
  fd::forward_meta m;
  if (!tag.is_none()) {
    uint_arg t;
    if (!nb::try_cast(tag, t)) {
      throw nb::type_error(
          ("ferry: " + std::string{who} + ": expected tag an int or None, got " + type_of(tag)).c_str());
    }
    m.tag = t.get(who, "tag");
  }
  if (!requests.is_none()) {
    if (!PySequence_Check(requests.ptr()) || PyUnicode_Check(requests.ptr()) || PyBytes_Check(requests.ptr())) {
      throw nb::type_error(("ferry: " + std::string{who} + ": expected requests a sequence of ints or of (request, "
                            "first_row, rows) tuples, got " + type_of(requests)).c_str());
    }
    const nb::sequence seq = nb::borrow<nb::sequence>(requests);
    std::uint64_t row = 0;
    for (nb::handle item : seq) {
      uint_arg r;
      if (nb::try_cast(item, r)) {
        m.requests.push_back({r.get(who, "a request id"), row++, 1});
        continue;
      }
      uint_arg t[3];
      const bool triple = PyTuple_Check(item.ptr()) != 0 && PyTuple_GET_SIZE(item.ptr()) == 3;
      for (int k = 0; triple && k < 3; ++k) {
        if (!nb::try_cast(nb::handle(PyTuple_GET_ITEM(item.ptr(), k)), t[k])) { t[0].too_large = true, k = 3; }
      }
      if (!triple || t[0].too_large) {
        throw nb::type_error(("ferry: " + std::string{who} + ": expected each request an int or a (request, first_row, "
                              "rows) tuple of ints, got " + type_of(item)).c_str());
      }
      m.requests.push_back({t[0].get(who, "request"), t[1].get(who, "first_row"), t[2].get(who, "rows")});
      row = m.requests.back().first_row + m.requests.back().rows;
    }
  }
  if (!meta.is_none()) {
    const std::string expected = "ferry: " + std::string{who} + ": expected meta a bytes-like object or None";
    const held_buffer in{meta, PyBUF_SIMPLE, expected};
    const auto* b = static_cast<const std::byte*>(in.view.buf);
    m.user.assign(b, b + in.view.len);
  }
  return m;
}

}  // namespace ferry::python
