// SPDX-License-Identifier: Apache-2.0
// The producer's deferred batch and the sources it holds. capture_deferred() only records (hook, source,
// bytes, owner) here, on the CPU; the batch is copied by ONE gather launch at its flush point
// (producer::flush_deferred): the batch limit (tuning::gather_batch, at most gather_max_entries), end_forward,
// an explicit flush, and any immediate capture or begin_write (entry order is preserved: the gather is
// enqueued before the next writer). Contract (docs/api/d2h.md, "Deferred capture"): a deferred source stays
// allocated and unmodified from capture until its flush has been enqueued on the same stream; a source_owner
// given with it is held until then and asked, before the flush, whether the source is unchanged.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/types.hpp>
#include <ferry/d2h/detail/gather.hpp>
#include <ferry/d2h/reducer.hpp>
#include <ferry/d2h/row_selection.hpp>
#include <ferry/d2h/source_owner.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/error.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace ferry::d2h::detail {

/// A capture's source as the producer holds it: where its copy reads (`src`: the caller's memory, or the
/// host backend's snapshot of it) and what to give back once that copy no longer needs it.
struct held_source {
  const void* src{nullptr};
  source_owner owner;
  std::shared_ptr<void> snapshot;  ///< the host backend's copy of a host-written source (eager forward)
};

/// The host snapshot rule, its only home (source_owner::host_written): on the host backend, in an eager
/// forward, a host-written source is copied at the call and the entry's copy reads that snapshot; anywhere
/// else the copy reads the source itself. operator new's 16-byte alignment keeps the vector copy forms.
template <ferry::backend::backend B>
[[nodiscard]] held_source hold_source(const void* src, std::uint64_t bytes, source_owner owner, bool capturing)
{
  held_source h{src, std::move(owner), {}};
  if constexpr (std::is_same_v<typename B::tag, ferry::backend::host_tag>) {
    if (h.owner.host_written && !capturing && bytes != 0) {
      std::shared_ptr<std::byte[]> buf(new std::byte[bytes]);
      std::memcpy(buf.get(), src, bytes);
      h.src = buf.get();
      h.snapshot = std::move(buf);
    }
  }
  return h;
}

/// A row batch's shared part (capture_rows_deferred): every entry of the batch reads `sel` over `n_rows` rows.
/// `read` is what the gather reads (the selection, or the host backend's snapshot of its arrays: `arrays`).
/// A reduced batch (capture_reduced_deferred) also shares its reducer `r` (one record per row) and input type `in`.
struct row_batch {
  row_selection sel{};
  std::uint64_t n_rows{0};
  row_selection read{};
  std::array<held_source, 3> arrays{};
  std::optional<reducer> r{};
  reduce_input in{reduce_input::f32};
};

/// What record_deferred needs of a row entry (capture_rows_deferred, capture_reduced_deferred); `sel` null: a whole
/// entry. A reduced entry: `r` its reducer, `in` and `width` its rows' type and elements, `row_bytes` its records'.
struct deferred_rows {
  const row_selection* sel{nullptr};
  std::uint64_t n_rows{0};
  std::uint64_t row_bytes{0};
  const reducer* r{nullptr};
  reduce_input in{reduce_input::f32};
  std::uint64_t width{0};
  /// Whether an entry of this part joins a batch of `b` (null: a batch of whole entries).
  [[nodiscard]] bool joins(const row_batch* b) const noexcept
  {
    if ((sel != nullptr) != (b != nullptr)) { return false; }
    if (b == nullptr) { return true; }
    return b->sel == *sel && b->n_rows == n_rows && (r != nullptr) == b->r.has_value() &&
           (r == nullptr || (*r == *b->r && in == b->in));
  }
};

/// The deferred entries recorded since the last flush, in entry order: whole entries (capture_deferred, bounce
/// captures: ONE gather_publish) or row entries sharing one selection (capture_rows_deferred: ONE
/// gather_rows_publish); an entry of the other kind, or of another selection, flushes the batch first.
class deferred_batch {
 public:
  struct entry {
    hook_id hook{};
    std::uint64_t bytes{0};
    std::uint64_t reserved{0};
    bool bounced{false};  ///< a bounce capture (its source is a channel-owned bounce slot)
    held_source source;
    std::uint64_t row_bytes{0};  ///< a row entry: bytes per row (the batch's rows()); reduced: per record
    std::uint32_t width{0};      ///< a reduced entry: elements per source row
  };

  /// `limit` entries at most (deferred_limit), spanning at most `ring_bytes`.
  deferred_batch(std::uint32_t limit, std::uint64_t ring_bytes) noexcept : limit_{limit}, ring_bytes_{ring_bytes} {}

  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  [[nodiscard]] std::uint32_t size() const noexcept { return n_; }
  [[nodiscard]] std::uint32_t limit() const noexcept { return limit_; }
  [[nodiscard]] const entry& operator[](std::uint32_t i) const noexcept { return e_[i]; }
  /// A row batch's selection (null: a batch of whole entries).
  [[nodiscard]] const row_batch* rows() const noexcept { return rows_ ? &*rows_ : nullptr; }
  /// Dynamic entries recorded (every entry of a row batch).
  [[nodiscard]] std::uint32_t dynamic_count() const noexcept { return rows_ ? n_ : 0; }

  /// Whether an entry of `reserved` bytes (a row entry of `part`'s selection and reducer when it has them) must
  /// go into a new batch: the batch holds `limit` entries, is of another kind, selection or reducer, or with it
  /// could span more than the ring (its entries plus at most one wrap padding, shorter than the largest entry),
  /// which no reservation could hold.
  [[nodiscard]] bool needs_flush_before(std::uint64_t reserved, const deferred_rows& part = {}) const noexcept
  {
    if (n_ == 0) { return false; }
    if (n_ >= limit_) { return true; }
    if (!part.joins(rows())) { return true; }
    return sum_ + reserved + std::max(max_, reserved) > ring_bytes_;
  }
  /// Whether recording an entry of `reserved` bytes flushes the batch (before it, or after it: it fills the
  /// batch). The recorded sources are checked (check_sources) before such a call changes anything.
  [[nodiscard]] bool record_flushes(std::uint64_t reserved, const deferred_rows& part = {}) const noexcept
  {
    return needs_flush_before(reserved, part) || n_ + 1U >= limit_;
  }

  void push(hook_id hook, std::uint64_t bytes, std::uint64_t reserved, held_source src, bool bounced,
            std::uint64_t row_bytes = 0, std::uint32_t width = 0)
  {
    e_[n_++] = entry{hook, bytes, reserved, bounced, std::move(src), row_bytes, width};
    sum_ += reserved;
    max_ = std::max(max_, reserved);
  }
  /// The first entry of a row batch: its shared selection (call before push, on an empty batch).
  void start_rows(row_batch&& r) { rows_.emplace(std::move(r)); }
  /// Takes a row batch's selection arrays (the flush gives them back once the gather no longer needs them).
  [[nodiscard]] std::array<held_source, 3> take_selection() noexcept
  {
    return rows_ ? std::exchange(rows_->arrays, {}) : std::array<held_source, 3>{};
  }

  /// Asks the owners' check functions whether every recorded source is unchanged since its capture (one
  /// call per run of consecutive owners sharing a function); logic_error naming the first written one. Run
  /// before the call that flushes changes anything, so nothing of the batch is launched when it throws.
  void check_sources(const char* what) const
  {
    std::array<void*, gather_max_entries> owners{};
    for (std::uint32_t i = 0; i < n_;) {
      const source_owner::check_fn f = e_[i].source.owner.unchanged;
      std::uint32_t j = i;
      for (; j < n_ && e_[j].source.owner.unchanged == f; ++j) { owners[j - i] = e_[j].source.owner.keep.get(); }
      const std::size_t bad = f != nullptr ? f(owners.data(), j - i) : j - i;
      FERRY_EXPECTS(bad >= j - i, ferry::logic_error,
                    "d2h channel {}: the source of deferred hook {} was written in place after its capture_deferred "
                    "and before its flush (the gather would copy the new bytes): expected it unmodified until the "
                    "flush; capture hook {} immediately instead. Nothing of its batch was launched (abort_forward "
                    "drops the forward)",
                    what, e_[i + bad].hook.value, e_[i + bad].hook.value);
      i = j;
    }
  }

  /// Takes the sources of every entry (the flush gives them back once the gather no longer needs them) and
  /// empties the batch.
  template <class F>
  void take_sources(F&& give_back)
  {
    for (std::uint32_t i = 0; i < n_; ++i) { give_back(std::move(e_[i].source)); }
    clear();
  }
  /// Drops every entry but the bounced ones (abort_forward: the user's deferred sources may be gone, the
  /// staging slots are the channel's and their copies were launched); the dropped owners go back at once.
  void keep_bounced() noexcept
  {
    std::uint32_t k = 0;
    sum_ = 0;
    max_ = 0;
    for (std::uint32_t i = 0; i < n_; ++i) {
      if (!e_[i].bounced) {
        e_[i].source = held_source{};
        continue;
      }
      if (k != i) { e_[k] = std::move(e_[i]); }
      sum_ += e_[k].reserved;
      max_ = std::max(max_, e_[k].reserved);
      ++k;
    }
    n_ = k;
    if (n_ == 0) { rows_.reset(); }  // a row batch has no bounced entry
  }
  /// Empties the batch; owners still held go back at once (never launched).
  void clear() noexcept
  {
    for (std::uint32_t i = 0; i < n_; ++i) { e_[i].source = held_source{}; }
    n_ = 0;
    sum_ = 0;
    max_ = 0;
    rows_.reset();
  }

 private:
  std::array<entry, gather_max_entries> e_{};
  std::uint32_t n_{0};
  std::uint32_t limit_;
  std::uint64_t ring_bytes_;
  std::uint64_t sum_{0};  ///< reserved bytes of the batch
  std::uint64_t max_{0};  ///< largest reserved entry of the batch
  std::optional<row_batch> rows_;  ///< a row batch's selection
};

/// The batch limit: tuning::gather_batch, at most gather_max_entries, the FIFO's capacity and the size ring's
/// slots (a row batch's entries are dynamic). Apart from K: the gather releases when the entries since the last
/// release reach K (producer::launch_deferred), whatever the batch holds.
[[nodiscard]] constexpr std::uint32_t deferred_limit(const config& cfg, std::size_t fifo_capacity) noexcept
{
  const std::uint64_t n = std::max<std::uint32_t>(1, cfg.tuning.gather_batch);
  const std::uint64_t slots = std::max<std::uint32_t>(1, cfg.tuning.size_slots);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>({n, gather_max_entries, fifo_capacity, slots}));
}

/// Whether capture() of a static entry of `bytes` is a bounce capture (tuning::bounce_capture_max_bytes
/// `max_bytes`, 0: off): it joins the deferred batch (producer::capture_bounced).
[[nodiscard]] constexpr bool bounce_capture(std::uint64_t max_bytes, std::uint64_t bytes) noexcept
{
  return max_bytes != 0 && bytes <= max_bytes;
}

}  // namespace ferry::d2h::detail
