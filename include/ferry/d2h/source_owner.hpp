// SPDX-License-Identifier: Apache-2.0
// ferry::d2h::source_owner: who keeps a capture's source alive, and unchanged, until the copy that reads it.
// The channel holds it (channel::capture, capture_deferred) and gives it back through the backend's
// release_after: a GPU backend once the copy is enqueued (the source's allocator orders reuse on the
// stream), the host backend once its emulated copy ran. One home for the rules that a binding (Python, the
// C ABI, an engine's own wrapper) would otherwise restate: when a deferred source may be dropped, how it is
// checked before its flush, and when the host backend reads a source at the call.
#pragma once

#include <cstddef>
#include <memory>

namespace ferry::d2h {

/// The owner of one capture's source. Empty (the default): the caller keeps the source alive and unchanged
/// as the call's contract says (docs/api/d2h.md), and nothing is held.
struct source_owner {
  /// Checks `n` sources at once, given their owners' `keep.get()`: consecutive deferred entries of one batch
  /// whose owners share this function (so a binding can take its lock, e.g. Python's GIL, once per batch).
  /// Returns the index of the first source written since its capture, or `n` when none was. Called on the
  /// producer thread before anything of the batch is launched; must not call into the channel.
  using check_fn = std::size_t (*)(void* const* owners, std::size_t n);

  /// Held until the copy that reads the source was enqueued (GPU backends) or ran (host backend); when the
  /// forward is captured into a graph, until the channel closes (every replay reads the source again).
  /// Deferred entries that are dropped unlaunched (abort_forward, a failed call) give it back at once.
  std::shared_ptr<void> keep;
  /// Deferred capture only (may be null): asked before the flush that copies the source.
  check_fn unchanged{nullptr};
  /// The source is memory that host code writes directly, outside any stream (a NumPy array, a torch CPU
  /// tensor on the host backend). The host backend's copies run later on its stream thread, unordered with
  /// such writes, so in an eager forward it copies the bytes at the call (stream order on a GPU makes a
  /// later write invisible to the entry; this gives the host backend the same meaning). GPU backends, and
  /// a forward being captured (each replay reads the source itself), ignore it.
  bool host_written{false};
};

}  // namespace ferry::d2h
