// SPDX-License-Identifier: Apache-2.0
// Streams: a move-only owner and a non-owning view that refuses a null handle.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/detail/unique_handle.hpp>
#include <ferry/error.hpp>

namespace ferry::backend {

/// Non-owning, trivially copyable reference to a stream of backend B. Never null: ferry does not
/// accept the legacy default stream (its implicit synchronization would hide ordering bugs).
template <backend B>
class stream_view {
 public:
  using handle_type = typename B::stream_type;

  stream_view(B b, handle_type h) : backend_{b}, handle_{h}
  {
    FERRY_EXPECTS(h != handle_type{}, logic_error,
                  "stream_view: expected a created {} stream, got the null/default stream", B::name());
  }

  [[nodiscard]] handle_type handle() const noexcept { return handle_; }
  [[nodiscard]] const B& backend() const noexcept { return backend_; }
  void synchronize() const { backend_.stream_synchronize(handle_); }
  [[nodiscard]] bool ready() const { return backend_.stream_query(handle_); }
  [[nodiscard]] bool is_capturing() const { return backend_.stream_is_capturing(handle_); }

  friend bool operator==(const stream_view& a, const stream_view& b) noexcept { return a.handle_ == b.handle_; }

 private:
  B backend_;
  handle_type handle_;
};

/// The legacy default stream (handle 0), named where ferry enqueues work for a launch it does not own:
/// d2h::channel::plan(p, default_stream) arms a graph replay that the caller launches there (torch's
/// CUDAGraph.replay() on torch's default stream). Nowhere else: a stream_view is never null.
struct default_stream_t {
  explicit constexpr default_stream_t() = default;
};
inline constexpr default_stream_t default_stream{};

/// Owning stream (non-blocking with respect to the legacy default stream). Move-only; the destructor
/// never throws and lets queued work finish, as cudaStreamDestroy does.
template <backend B>
class stream {
 public:
  explicit stream(B b = B{}) : h_{b, b.stream_create()} {}

  [[nodiscard]] stream_view<B> view() const { return stream_view<B>{h_.backend(), handle()}; }
  operator stream_view<B>() const { return view(); }  // NOLINT(google-explicit-constructor)
  [[nodiscard]] typename B::stream_type handle() const noexcept { return h_.get(); }
  void synchronize() const { h_.backend().stream_synchronize(handle()); }

 private:
  detail::unique_handle<B, typename B::stream_type, &B::stream_destroy> h_;  ///< move-only: so is the stream
};

}  // namespace ferry::backend
