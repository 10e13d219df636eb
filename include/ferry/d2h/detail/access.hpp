// SPDX-License-Identifier: Apache-2.0
// The channel's parts reach the private members of the public value types (forward_plan, write_ticket,
// entry_view) through this one friend: the producer records plans and opens tickets, the drainer makes views.
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/forward_plan.hpp>
#include <ferry/d2h/write_ticket.hpp>

#include <cstdint>
#include <memory>
#include <utility>

namespace ferry::d2h::detail {

/// Which forward a delivered entry belongs to (entry_meta::forward, its forward_log metadata) and its row size.
struct entry_attribution {
  std::uint64_t forward{0};
  std::uint64_t row_bytes{0};
  std::shared_ptr<const forward_meta> meta;
};

struct access {
  // ---- forward_plan (producer) ----
  static void start_recording(forward_plan& p, const void* owner)
  {
    p = forward_plan{};
    p.owner_ = owner;
  }
  static void record(forward_plan& p, const plan_entry& e) { p.entries_.push_back(e); }

  // ---- write_ticket (producer) ----
  static write_ticket open_ticket(const ring_ref& ref, hook_id hook, std::uint64_t bytes, placement where)
  {
    write_ticket t;
    t.ref_ = ref;
    t.hook_ = hook;
    t.bytes_ = bytes;
    t.where_ = where;
    t.live_ = true;
    return t;
  }
  [[nodiscard]] static bool live(const write_ticket& t) noexcept { return t.live_; }
  static void close_ticket(write_ticket& t) noexcept { t.live_ = false; }
  [[nodiscard]] static hook_id hook(const write_ticket& t) noexcept { return t.hook_; }
  [[nodiscard]] static std::uint64_t bytes(const write_ticket& t) noexcept { return t.bytes_; }
  [[nodiscard]] static placement where(const write_ticket& t) noexcept { return t.where_; }

  // ---- entry_view (drainer; sinks read the pool a view holds) ----
  /// The staging pool `v`'s bytes lie in (null for a view without bytes): a sink watching staging pressure.
  [[nodiscard]] static const std::shared_ptr<staging_pool>& staging_of(const entry_view& v) noexcept { return v.pool_; }
  /// A delivered entry whose payload lies in staging region `region` at `data`.
  [[nodiscard]] static entry_view ok_view(std::shared_ptr<staging_pool> pool, std::uint64_t region,
                                          const std::byte* data, std::uint64_t size, std::uint64_t reserved,
                                          hook_id hook, entry_seq seq, entry_attribution at = {}) noexcept
  {
    return entry_view{entry_view::parts{std::move(pool), region, data, size, reserved, hook, seq, entry_status::ok,
                                        at.forward, at.row_bytes, std::move(at.meta)}};
  }
  /// A rejected dynamic entry (GPU-resolved `size` > `reserved`): no bytes.
  [[nodiscard]] static entry_view overflow_view(std::uint64_t size, std::uint64_t reserved, hook_id hook,
                                                entry_seq seq, entry_attribution at = {}) noexcept
  {
    return entry_view{entry_view::parts{nullptr, 0, nullptr, size, reserved, hook, seq, entry_status::size_overflow,
                                        at.forward, at.row_bytes, std::move(at.meta)}};
  }
  /// A row-selected entry whose selection the kernel refused (its size slot holds selection_error_size).
  [[nodiscard]] static entry_view selection_error_view(std::uint64_t reserved, hook_id hook, entry_seq seq,
                                                       entry_attribution at = {}) noexcept
  {
    return entry_view{entry_view::parts{nullptr, 0, nullptr, 0, reserved, hook, seq, entry_status::selection_error,
                                        at.forward, at.row_bytes, std::move(at.meta)}};
  }
};

}  // namespace ferry::d2h::detail
