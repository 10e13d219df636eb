// SPDX-License-Identifier: Apache-2.0
// Stream capture into an executable graph (CUDA graphs; the host backend records and replays).
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/detail/unique_handle.hpp>
#include <ferry/backend/stream.hpp>

#include <utility>

namespace ferry::backend {

/// Move-only executable graph. Build it with capture(): everything `body(stream)` enqueues on `s`
/// between begin and end becomes the graph.
template <backend B>
class graph_exec {
 public:
  graph_exec() = default;

  /// Everything `body(s)` enqueues on `s` becomes the graph. When the body, the capture or the
  /// instantiation fails, the capture is ended (discarded) and the error propagates.
  template <class Body>
  [[nodiscard]] static graph_exec capture(stream_view<B> s, Body&& body)
  {
    return capture(s, std::forward<Body>(body), [](stream_view<B>) {});
  }

  /// Same; on failure `on_failure(s)` runs after the capture was ended (`s` no longer capturing) and before
  /// the error propagates, to restore what the body left mid-capture, e.g. a d2h channel's open forward:
  /// `[&](auto cs) { ch.abort_forward(cs); }`. An exception from on_failure is dropped (the first error
  /// matters).
  template <class Body, class OnFailure>
  [[nodiscard]] static graph_exec capture(stream_view<B> s, Body&& body, OnFailure&& on_failure)
  {
    const B& b = s.backend();
    const auto restore = [&]() noexcept {
      try {
        on_failure(s);
      } catch (...) {  // the original error matters
      }
    };
    b.capture_begin(s.handle());
    typename B::graph_type g{};
    try {
      body(s);
    } catch (...) {
      try {
        b.graph_destroy(b.capture_end(s.handle()));
      } catch (...) {  // the capture may already be invalidated; the original error matters
      }
      restore();
      throw;
    }
    try {
      g = b.capture_end(s.handle());
    } catch (...) {
      restore();
      throw;
    }
    graph_exec x;
    try {
      x.exec_ = exec_handle{b, b.graph_instantiate(g)};
    } catch (...) {
      b.graph_destroy(g);
      restore();
      throw;
    }
    b.graph_destroy(g);
    return x;
  }

  void launch(stream_view<B> s) const { exec_.backend().graph_launch(exec_.get(), s.handle()); }
  [[nodiscard]] explicit operator bool() const noexcept { return exec_.get() != typename B::graph_exec_type{}; }

 private:
  using exec_handle = detail::unique_handle<B, typename B::graph_exec_type, &B::graph_exec_destroy>;
  exec_handle exec_;  ///< move-only: so is the graph
};

}  // namespace ferry::backend
