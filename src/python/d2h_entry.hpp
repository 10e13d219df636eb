// SPDX-License-Identifier: Apache-2.0
// ferry.Entry (one delivered D2H entry, zero-copy numpy views of its pinned staging) and ferry.Plan (the
// entries of a forward captured into a graph); backend-independent.
#pragma once

#include "d2h_typed.hpp"
#include "stream.hpp"

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/errors.hpp>
#include <ferry/d2h/forward_plan.hpp>
#include <ferry/error.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>

namespace ferry::python {

namespace nb = nanobind;
namespace fd = ferry::d2h;

/// Staging held from Python: delivered views (one entry_view, or a batch's vector of them) and their channel's
/// tie. The last holder of a closed channel frees its pinned staging, and a free waits for the host streams,
/// some of whose operations need the GIL (a torch op's tensor released on a stream thread): a deadlock with
/// the GIL held. Released without it here, as close() releases it.
template <class Views>
struct staging_holder {
  Views v;
  std::shared_ptr<graph_tie> channel;  ///< its channel's tie (stream.hpp): dead once the channel closed
  staging_holder() = default;
  staging_holder(const staging_holder&) = delete;
  staging_holder& operator=(const staging_holder&) = delete;
  ~staging_holder()
  {
    if (channel != nullptr && !channel->alive() && PyGILState_Check() != 0) {
      gil_release g;
      Views gone = std::move(v);
    }
  }
};

/// One delivered entry. Views (numpy(), tensor()) share `held`: the staging bytes go back when release() was
/// called (or the entry died) AND the last view died.
struct py_entry {
  using holder = staging_holder<fd::entry_view>;
  std::shared_ptr<holder> held;
  std::uint32_t hook{0};
  std::uint64_t seq{0};
  std::uint64_t size{0};
  std::uint64_t reserved{0};
  bool ok{true};
  std::uint64_t tag{0}, forward{0}, row_bytes{0}, rows{0};  ///< attribution (d2h/forward_info.hpp)
  std::shared_ptr<const fd::forward_meta> meta;
  std::shared_ptr<const fd::hook_schema> schema;  ///< its channel's (typed views), or null: none

  py_entry(fd::entry_view&& v, std::shared_ptr<graph_tie> channel, std::shared_ptr<const fd::hook_schema> hooks = {})
    : held{std::make_shared<holder>()}, hook{v.hook().value}, seq{v.seq().value}, size{v.size()},
      reserved{v.reserved_bytes()}, ok{v.ok()}, tag{v.tag()}, forward{v.forward_index()}, row_bytes{v.row_bytes()},
      rows{v.rows()}, meta{v.shared_meta()}, schema{std::move(hooks)}
  {
    held->v = std::move(v);
    held->channel = std::move(channel);
  }
  /// rows_of(request): the request's rows, a [rows, row_bytes] uint8 view of the staging (no copy).
  [[nodiscard]] nb::ndarray<nb::numpy, const std::uint8_t, nb::ndim<2>> rows_of(std::uint64_t request) const
  {
    FERRY_EXPECTS(held != nullptr, ferry::logic_error,
                  "d2h entry {} of hook {}: expected a live entry, got a released one (rows_of() after release())", seq,
                  hook);
    auto bytes = held->v.rows_of(request);  // the core's checks: a row entry, a known request, rows in the entry
    auto* keep = new std::shared_ptr<holder>(held);
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<holder>*>(p); });
    const std::size_t shape[2] = {bytes.size() / row_bytes, row_bytes};
    return {reinterpret_cast<const std::uint8_t*>(bytes.data()), 2, shape, owner};
  }

  /// The payload over the staging (no copy): typed by the channel's schema where it names the hook
  /// (d2h_typed.hpp: entry_array), else its bytes; `torch`: a torch.Tensor, else numpy.
  [[nodiscard]] nb::object array(bool torch) const
  {
    FERRY_EXPECTS(held != nullptr, ferry::logic_error,
                  "d2h entry {} of hook {}: expected a live entry, got a released one ({}() after release())", seq,
                  hook, torch ? "tensor" : "numpy");
    return entry_array(held->v, schema.get(), held, torch);  // size_overflow_error for a rejected dynamic entry
  }
  /// The hook's schema entry, or null (undeclared).
  [[nodiscard]] const fd::hook_spec* spec() const { return schema ? schema->find(fd::hook_id{hook}) : nullptr; }
  [[nodiscard]] nb::bytes to_bytes() const
  {
    FERRY_EXPECTS(held != nullptr, ferry::logic_error,
                  "d2h entry {} of hook {}: expected a live entry, got a released one (tobytes() after release())",
                  seq, hook);
    auto b = held->v.bytes();
    return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }
  void release() noexcept { held.reset(); }
  [[nodiscard]] bool released() const noexcept { return held == nullptr; }
  /// numpy views alive (besides the entry itself).
  [[nodiscard]] long views() const noexcept { return held ? held.use_count() - 1 : 0; }
};

/// A forward_plan captured by end_forward() in graph mode.
struct py_plan {
  fd::forward_plan p;
  [[nodiscard]] std::size_t size() const noexcept { return p.size(); }
};

/// A shutdown_report as a dict (Channel.close's result, ShutdownError.report).
[[nodiscard]] nb::dict report_dict(const fd::shutdown_report& r);

/// Registers Entry and Plan in `m`.
void init_d2h_entry(nb::module_& m);

}  // namespace ferry::python
