// SPDX-License-Identifier: Apache-2.0
// A completed entry as the consumer sees it: its bytes in pinned host staging, valid until the view is
// released (destroyed, or release()). Move-only. Delivered by the channel's callback or try_pop().
#pragma once

#include <ferry/d2h/detail/staging.hpp>
#include <ferry/d2h/errors.hpp>
#include <ferry/d2h/forward_info.hpp>
#include <ferry/d2h/types.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

namespace ferry::d2h {

namespace detail {
struct access;
}

/// How a delivered entry ended.
enum class entry_status {
  ok,
  size_overflow,    ///< dynamic entry: GPU-resolved size > reservation; no bytes (bytes() throws)
  selection_error,  ///< capture_rows: the kernel refused the row selection (row_selection.hpp); no bytes (bytes()
                    ///< throws)
};

/// One delivered entry (move-only). An empty (default-constructed or moved-from) view holds nothing.
class entry_view {
 public:
  entry_view() = default;
  entry_view(const entry_view&) = delete;
  entry_view& operator=(const entry_view&) = delete;
  entry_view(entry_view&& o) noexcept { *this = std::move(o); }
  entry_view& operator=(entry_view&& o) noexcept
  {
    if (this != &o) {
      release();
      pool_ = std::move(o.pool_);
      region_ = o.region_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = o.size_;
      reserved_ = o.reserved_;
      hook_ = o.hook_;
      seq_ = o.seq_;
      status_ = o.status_;
      forward_ = o.forward_;
      row_bytes_ = o.row_bytes_;
      meta_ = std::move(o.meta_);
    }
    return *this;
  }
  ~entry_view() { release(); }

  [[nodiscard]] hook_id hook() const noexcept { return hook_; }
  [[nodiscard]] entry_seq seq() const noexcept { return seq_; }
  [[nodiscard]] std::uint64_t reserved_bytes() const noexcept { return reserved_; }
  /// Payload bytes (for a dynamic entry: the GPU-resolved size, also when it overflowed).
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] entry_status status() const noexcept { return status_; }
  [[nodiscard]] bool ok() const noexcept { return status_ == entry_status::ok; }
  [[nodiscard]] bool valid() const noexcept { return pool_ != nullptr || status_ != entry_status::ok; }

  // ---- attribution (forward_info.hpp) ----
  /// The index of the entry's forward in its channel (0, 1, 2, ...: eager forwards and planned replays). A
  /// forward's entries are delivered consecutively, in entry order.
  [[nodiscard]] std::uint64_t forward_index() const noexcept { return forward_; }
  /// The forward's tag (forward_meta::tag, set at begin_forward or plan); without one, forward_index().
  [[nodiscard]] std::uint64_t tag() const noexcept { return meta_ && meta_->tag ? *meta_->tag : forward_; }
  /// The forward's metadata as the engine gave it (null: none).
  [[nodiscard]] const forward_meta* meta() const noexcept { return meta_.get(); }
  /// The same, shared (it outlives the view: a binding keeps it after release()).
  [[nodiscard]] const std::shared_ptr<const forward_meta>& shared_meta() const noexcept { return meta_; }
  /// capture_rows: bytes per row (0: the entry was captured whole).
  [[nodiscard]] std::uint64_t row_bytes() const noexcept { return row_bytes_; }
  /// capture_rows: the rows the entry holds (size() / row_bytes(); 0 for a failed or whole entry).
  [[nodiscard]] std::uint64_t rows() const noexcept { return row_bytes_ != 0 && ok() ? size_ / row_bytes_ : 0; }
  /// The rows of request `request` (forward_meta::requests), a view into the payload (no copy). Throws
  /// logic_error when the entry has no rows (captured whole), the forward names no such request, or its rows
  /// lie past the entry's; the entry's own errors as bytes() does.
  [[nodiscard]] std::span<const std::byte> rows_of(std::uint64_t request) const
  {
    const std::span<const std::byte> all = bytes();
    FERRY_EXPECTS(row_bytes_ != 0, ferry::logic_error,
                  "d2h entry {} of hook {}: rows_of(request {}) expected a row entry (capture_rows), got one captured "
                  "whole", seq_.value, hook_.value, request);
    const request_rows* r = nullptr;
    if (meta_) {
      for (const auto& q : meta_->requests) {
        if (q.request == request) { r = &q; break; }
      }
    }
    FERRY_EXPECTS(r != nullptr, ferry::logic_error,
                  "d2h entry {} of hook {}: rows_of expected a request of forward {} (forward_meta::requests: {} "
                  "requests), got request {}", seq_.value, hook_.value, tag(), meta_ ? meta_->requests.size() : 0,
                  request);
    FERRY_EXPECTS(
        r->first_row <= rows() && r->rows <= rows() - r->first_row, ferry::logic_error,
        "d2h entry {} of hook {}: request {} expected rows [{}, {}) within the entry's {} rows, got past them",
        seq_.value, hook_.value, request, r->first_row, r->first_row + r->rows, rows());
    return all.subspan(static_cast<std::size_t>(r->first_row * row_bytes_),
                       static_cast<std::size_t>(r->rows * row_bytes_));
  }

  /// The payload. Throws size_overflow_error for a rejected dynamic entry, logic_error after release().
  [[nodiscard]] std::span<const std::byte> bytes() const
  {
    if (status_ == entry_status::size_overflow) { throw size_overflow_error(hook_, seq_, reserved_, size_); }
    if (status_ == entry_status::selection_error) { throw selection_error(hook_, seq_); }
    FERRY_EXPECTS(pool_ != nullptr || size_ == 0, ferry::logic_error,
                  "d2h entry {} of hook {}: expected a live view, got a released one", seq_.value, hook_.value);
    return {data_, static_cast<std::size_t>(size_)};
  }

  /// Give the staging bytes back (the destructor does it too).
  void release() noexcept
  {
    if (pool_) {
      pool_->release(region_);
      pool_.reset();
    }
    data_ = nullptr;
  }

 private:
  friend struct detail::access;  // the drainer constructs views
  struct parts {
    std::shared_ptr<detail::staging_pool> pool;
    std::uint64_t region;
    const std::byte* data;
    std::uint64_t size;
    std::uint64_t reserved;
    hook_id hook;
    entry_seq seq;
    entry_status status;
    std::uint64_t forward{0};
    std::uint64_t row_bytes{0};
    std::shared_ptr<const forward_meta> meta;
  };
  explicit entry_view(parts p) noexcept
    : pool_{std::move(p.pool)}, region_{p.region}, data_{p.data}, size_{p.size}, reserved_{p.reserved},
      hook_{p.hook}, seq_{p.seq}, status_{p.status}, forward_{p.forward}, row_bytes_{p.row_bytes},
      meta_{std::move(p.meta)}
  {
  }

  std::shared_ptr<detail::staging_pool> pool_;
  std::uint64_t region_{0};
  const std::byte* data_{nullptr};
  std::uint64_t size_{0};
  std::uint64_t reserved_{0};
  hook_id hook_{};
  entry_seq seq_{};
  entry_status status_{entry_status::ok};
  std::uint64_t forward_{0};
  std::uint64_t row_bytes_{0};
  std::shared_ptr<const forward_meta> meta_;
};

}  // namespace ferry::d2h
