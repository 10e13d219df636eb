// SPDX-License-Identifier: Apache-2.0
// ferry's error hierarchy and the RMM-style macros that raise it.
//
//   ferry::error                 base of everything ferry throws
//   ├── ferry::logic_error       contract violation by the caller (bad size, misuse, wrong thread...)
//   ├── ferry::out_of_memory     an allocation failed (device, pinned, managed, or a full ring on try_*)
//   ├── ferry::timeout_error     a blocking wait gave up (full ring with a timeout)
//   ├── ferry::invalidated_error an owner refused work after an earlier enqueue failure
//   └── ferry::backend_error     a backend call failed; carries code, call text and file:line
//       ├── ferry::cuda_error
//       ├── ferry::hip_error
//       └── ferry::host_error    the host-emulated device (and injected faults on it)
//
// Every message names the object, what was expected and what was found, and file:line.
#pragma once

#include <ferry/detail/format.hpp>  // dependency-free: this header compiles under g++, clang++, nvcc and hipcc

#include <stdexcept>
#include <string>
#include <string_view>

namespace ferry {

namespace detail {
/// "file:line" for error messages.
[[nodiscard]] inline std::string where(const char* file, int line) { return format("{}:{}", file, line); }
}  // namespace detail

/// Base of everything ferry throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A contract violation by the caller (bad size, misuse, wrong thread...).
class logic_error : public error {
 public:
  using error::error;
};

/// An allocation failed (device, pinned, managed), or a full ring on a fail-fast call.
class out_of_memory : public error {
 public:
  using error::error;
};

/// A blocking wait gave up (full ring with a timeout).
class timeout_error : public error {
 public:
  using error::error;
};

/// An owner refused work after an earlier enqueue failure.
class invalidated_error : public error {
 public:
  using error::error;
};

/// A failed backend call. `code()` is the backend's own status value (cudaError_t, hipError_t, or the
/// host backend's code), `call()` the call text as written at the call site, `where()` "file:line".
class backend_error : public error {
 public:
  /// `backend` "cuda"/"hip"/"host", `code` and `code_name` the runtime's status, `call` the call text,
  /// `where` "file:line", `detail` an optional explanation (the runtime's error string).
  backend_error(std::string_view backend, int code, std::string_view code_name, std::string_view call,
                std::string_view where, std::string_view detail = {})
    : error(detail::format("ferry: {} call '{}' failed at {}: {} ({}){}{}", backend, call, where, code_name, code,
                           std::string_view{detail.empty() ? "" : ": "}, detail)),
      code_{code},
      call_{call},
      where_{where}
  {
  }
  [[nodiscard]] int code() const noexcept { return code_; }
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] const std::string& where() const noexcept { return where_; }

 private:
  int code_;
  std::string call_;
  std::string where_;
};

/// A failed CUDA runtime call.
class cuda_error : public backend_error {
 public:
  using backend_error::backend_error;
};
/// A failed HIP runtime call.
class hip_error : public backend_error {
 public:
  using backend_error::backend_error;
};
/// A failed call on the host-emulated device (or a fault injected on it).
class host_error : public backend_error {
 public:
  using backend_error::backend_error;
};


}  // namespace ferry

#define FERRY_STRINGIFY_DETAIL(x) #x
#define FERRY_STRINGIFY(x) FERRY_STRINGIFY_DETAIL(x)

/// Throws `error_type` with a formatted message (fmt's "{}" syntax, ferry/detail/format.hpp) and file:line
/// when `cond` is false.
///   FERRY_EXPECTS(k > 0, ferry::logic_error, "d2h channel: publish_every must be >= 1, got {}", k);
#define FERRY_EXPECTS(cond, error_type, ...)                                                                       \
  do {                                                                                                             \
    if (!(cond)) [[unlikely]] {                                                                                    \
      throw error_type(                                                                                            \
          ::ferry::detail::format("ferry: {} [{}:{}]", ::ferry::detail::format(__VA_ARGS__), __FILE__, __LINE__)); \
    }                                                                                                              \
  } while (0)

/// Unconditionally throws `error_type` with a formatted message and file:line.
#define FERRY_FAIL(error_type, ...) \
  throw error_type(                 \
      ::ferry::detail::format("ferry: {} [{}:{}]", ::ferry::detail::format(__VA_ARGS__), __FILE__, __LINE__))
