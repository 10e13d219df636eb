// SPDX-License-Identifier: Apache-2.0
// The move-only owner of one backend handle, shared by event, stream and graph_exec.
#pragma once

#include <utility>

namespace ferry::backend::detail {

/// Owns `Handle` (a value-initialized one means "none") with the backend that created it. `Destroy` is the
/// backend's noexcept release member (&B::event_destroy, &B::stream_destroy, &B::graph_exec_destroy); it
/// runs on the owned handle when the owner is destroyed or assigned to. A move leaves "none" behind.
template <class B, class Handle, auto Destroy>
class unique_handle {
 public:
  unique_handle() = default;
  unique_handle(B b, Handle h) : backend_{b}, handle_{h} {}
  unique_handle(const unique_handle&) = delete;
  unique_handle& operator=(const unique_handle&) = delete;
  unique_handle(unique_handle&& o) noexcept : backend_{o.backend_}, handle_{std::exchange(o.handle_, {})} {}
  unique_handle& operator=(unique_handle&& o) noexcept
  {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      handle_ = std::exchange(o.handle_, {});
    }
    return *this;
  }
  ~unique_handle() { reset(); }

  [[nodiscard]] const B& backend() const noexcept { return backend_; }
  [[nodiscard]] Handle get() const noexcept { return handle_; }

 private:
  void reset() noexcept
  {
    if (handle_ != Handle{}) { (backend_.*Destroy)(std::exchange(handle_, {})); }
  }
  B backend_{};
  Handle handle_{};
};

}  // namespace ferry::backend::detail
