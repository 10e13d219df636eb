// SPDX-License-Identifier: Apache-2.0
// Move-only owners of device, pinned (optionally mapped) and managed allocations.
// Destructors never throw. An owner never frees storage a queued copy may still read: callers
// that hand a buffer to asynchronous work keep the owner alive until that work's event completed.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace ferry::backend {

enum class memory_kind {
  device,         ///< device memory (cudaMalloc)
  pinned,         ///< page-locked host memory (cudaHostAlloc)
  pinned_mapped,  ///< page-locked host memory mapped into the device address space
  managed,        ///< unified memory (cudaMallocManaged)
};

[[nodiscard]] constexpr std::string_view to_string(memory_kind k) noexcept
{
  switch (k) {
    case memory_kind::device: return "device";
    case memory_kind::pinned: return "pinned";
    case memory_kind::pinned_mapped: return "pinned mapped";
    case memory_kind::managed: return "managed";
  }
  return "?";
}

template <backend B, memory_kind Kind>
class buffer {
 public:
  static constexpr memory_kind kind = Kind;

  buffer() = default;
  explicit buffer(std::size_t bytes, B b = B{}) : backend_{b}, size_{bytes}
  {
    FERRY_EXPECTS(bytes > 0, logic_error, "{} buffer: expected a size > 0 bytes, got 0", to_string(Kind));
    if constexpr (Kind == memory_kind::device) {
      data_ = backend_.allocate_device(bytes);
    } else if constexpr (Kind == memory_kind::pinned || Kind == memory_kind::pinned_mapped) {
      data_ = backend_.allocate_pinned(bytes, Kind == memory_kind::pinned_mapped);
      if constexpr (Kind == memory_kind::pinned_mapped) {
        try {
          device_data_ = backend_.mapped_device_pointer(data_);
        } catch (...) {
          backend_.free_pinned(data_);
          throw;
        }
      }
    } else {
      data_ = backend_.allocate_managed(bytes);
    }
    if constexpr (Kind != memory_kind::pinned_mapped) { device_data_ = data_; }
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  buffer(buffer&& o) noexcept
    : backend_{o.backend_},
      data_{std::exchange(o.data_, nullptr)},
      device_data_{std::exchange(o.device_data_, nullptr)},
      size_{std::exchange(o.size_, 0)}
  {
  }
  buffer& operator=(buffer&& o) noexcept
  {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      data_ = std::exchange(o.data_, nullptr);
      device_data_ = std::exchange(o.device_data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~buffer() { reset(); }

  /// The pointer as the host sees it (for device memory: a device address, not dereferenceable on the CPU
  /// except on the host backend).
  [[nodiscard]] void* data() const noexcept { return data_; }
  /// The pointer kernels use (differs from data() only for pinned mapped memory).
  [[nodiscard]] void* device_data() const noexcept { return device_data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return data_ == nullptr; }
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {static_cast<std::byte*>(data_), size_}; }
  template <class T>
  [[nodiscard]] T* as() const noexcept
  {
    return static_cast<T*>(data_);
  }
  template <class T>
  [[nodiscard]] T* device_as() const noexcept
  {
    return static_cast<T*>(device_data_);
  }

  /// Memory advice (managed memory only), e.g. preferred location host + accessed by device for a flag
  /// the CPU polls.
  void advise(mem_advice a, device_id d) const
    requires(Kind == memory_kind::managed)
  {
    backend_.mem_advise(data_, size_, a, d);
  }

  [[nodiscard]] const B& backend() const noexcept { return backend_; }

 private:
  void reset() noexcept
  {
    if (data_ == nullptr) { return; }
    if constexpr (Kind == memory_kind::device) {
      backend_.free_device(data_);
    } else if constexpr (Kind == memory_kind::managed) {
      backend_.free_managed(data_);
    } else {
      backend_.free_pinned(data_);
    }
    data_ = device_data_ = nullptr;
    size_ = 0;
  }

  B backend_{};
  void* data_{nullptr};
  void* device_data_{nullptr};
  std::size_t size_{0};
};

template <backend B>
using device_buffer = buffer<B, memory_kind::device>;
template <backend B>
using pinned_buffer = buffer<B, memory_kind::pinned>;
template <backend B>
using mapped_buffer = buffer<B, memory_kind::pinned_mapped>;
template <backend B>
using managed_buffer = buffer<B, memory_kind::managed>;

}  // namespace ferry::backend
