// SPDX-License-Identifier: Apache-2.0
// ferry.EntryBatch: many delivered entries as one Python object (Channel.poll_batch, d2h_poll.cpp): their
// metadata as numpy columns, zero-copy per-entry views typed by the channel's schema (d2h_typed.hpp), and
// one release for all their staging. Conversion only: the entries are the core's entry_views, popped under
// one lock (d2h::channel::try_pop(out, max)).
#pragma once

#include "d2h_entry.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace ferry::python {

struct py_batch {
  using holder = staging_holder<std::vector<fd::entry_view>>;
  /// The metadata columns (kept after release(); numpy arrays over them share them).
  struct columns {
    std::vector<std::uint32_t> hooks;
    std::vector<std::uint64_t> seqs, sizes, tags, forwards, rows;
    std::vector<std::uint8_t> ok;
  };
  std::shared_ptr<holder> held;  ///< null once released
  std::shared_ptr<const columns> cols;
  std::shared_ptr<const fd::hook_schema> schema;  ///< its channel's, or null: none

  py_batch(std::vector<fd::entry_view>&& views, std::shared_ptr<graph_tie> channel,
           std::shared_ptr<const fd::hook_schema> hooks);
  [[nodiscard]] std::size_t size() const noexcept { return cols->hooks.size(); }
  /// Entry `i` (negative: from the end) as an array: numpy (typed where the schema declares its hook, else
  /// bytes) or, `torch`, a torch.Tensor. LogicError after release(), IndexError outside the batch.
  [[nodiscard]] nb::object view(long long i, bool torch) const;
  void release() noexcept { held.reset(); }
  [[nodiscard]] bool released() const noexcept { return held == nullptr; }
};

/// Registers EntryBatch in `m`.
void init_d2h_batch(nb::module_& m);

}  // namespace ferry::python
