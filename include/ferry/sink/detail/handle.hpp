// SPDX-License-Identifier: Apache-2.0
// The move-only handle both sinks are (sink::safetensors, sink::shm_stream): a shared pointer to the sink's state
// (`Impl`, compiled into ferry::core), and the calls every sink has, each forwarded to it. A template so each
// sink's handle has its own config and counters; its members are defined and instantiated for each sink in
// src/sink/handle.cpp (a user's code never instantiates it).
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/sink/policy.hpp>

#include <functional>
#include <memory>
#include <vector>

namespace ferry::sink::detail {

template <class Impl, class Config, class Stats>
class handle {
 public:
  handle(handle&&) noexcept = default;
  /// Closes this sink first (quietly), then takes `o`'s.
  handle& operator=(handle&& o) noexcept;
  handle(const handle&) = delete;
  handle& operator=(const handle&) = delete;
  /// close() if not closed; an error is printed on stderr, never thrown.
  ~handle();

  /// The channel's callback (d2h::channel's callback_type), on the drain thread. It shares the sink's state: an
  /// entry delivered after close() (or after this handle died) is refused and counted.
  [[nodiscard]] std::function<void(d2h::entry_view&&)> callback() const;
  /// The callback itself: takes the entry (a consumer that pops views itself).
  void operator()(d2h::entry_view&& e) const;
  /// The hook schema of the channel the sink is attached to (the channel's one-call constructor offers it): a
  /// sink made without a schema of its own takes it, one with a schema keeps its own; the refusals are the
  /// sink's (its header).
  void adopt_schema(const d2h::hook_schema& channel_schema);
  /// A snapshot of the sink's counters (any thread).
  [[nodiscard]] Stats stats() const;
  /// Policy drop: what it took from each request so far, by request id (any thread; empty under block).
  [[nodiscard]] std::vector<request_drop> dropped_requests() const;
  /// Ends the sink (what each sink does: its header); idempotent. Throws the first error kept (the first call
  /// only). Close the channel first: entries delivered after close() are refused.
  Stats close();
  [[nodiscard]] bool closed() const;
  [[nodiscard]] const Config& cfg() const;

 protected:
  explicit handle(Config cfg);
  /// The state (logic_error naming the sink for a moved-from handle).
  [[nodiscard]] Impl& impl() const;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ferry::sink::detail
