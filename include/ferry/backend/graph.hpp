// SPDX-License-Identifier: Apache-2.0
// Stream capture into an executable graph (CUDA graphs; the host backend records and replays).
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/stream.hpp>

#include <utility>

namespace ferry::backend {

/// Move-only executable graph. Build it with capture(): everything `body(stream)` enqueues on `s`
/// between begin and end becomes the graph.
template <backend B>
class graph_exec {
 public:
  graph_exec() = default;
  graph_exec(const graph_exec&) = delete;
  graph_exec& operator=(const graph_exec&) = delete;
  graph_exec(graph_exec&& o) noexcept : backend_{o.backend_}, exec_{std::exchange(o.exec_, {})} {}
  graph_exec& operator=(graph_exec&& o) noexcept
  {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      exec_ = std::exchange(o.exec_, {});
    }
    return *this;
  }
  ~graph_exec() { reset(); }

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
    x.backend_ = b;
    try {
      x.exec_ = b.graph_instantiate(g);
    } catch (...) {
      b.graph_destroy(g);
      restore();
      throw;
    }
    b.graph_destroy(g);
    return x;
  }

  void launch(stream_view<B> s) const { backend_.graph_launch(exec_, s.handle()); }
  [[nodiscard]] explicit operator bool() const noexcept { return exec_ != typename B::graph_exec_type{}; }

 private:
  void reset() noexcept
  {
    if (exec_ != typename B::graph_exec_type{}) { backend_.graph_exec_destroy(std::exchange(exec_, {})); }
  }
  B backend_{};
  typename B::graph_exec_type exec_{};
};

}  // namespace ferry::backend
