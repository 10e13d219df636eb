// SPDX-License-Identifier: Apache-2.0
// A sink that assembles per-request samples from a channel's row entries (docs/api/engine.md; ferry.engine's
// format writers take its samples). Under continuous batching a request's rows are spread over every step it ran
// in (prefill chunks, then one row per decode step), each step one forward whose row entries (one per hook: a tap)
// carry the step's attribution: forward_meta::tag (the step, increasing), requests ((request, first_row, rows) in
// row order) and user bytes that start with each request's first position (int64 little-endian, in requests'
// order; then anything, e.g. the request ids).
//
//   sink::sample_assembler a{{.hooks = 4}};
//   fd::channel<B> ch{cfg, b, a, {}};                 // entries reach it on the drain thread, no copy but its own
//   a.add({.handle = 7, .id = "req-7", .lo = 0, .hi = 1 << 30, .keep = {0, 1, 2, 3}});   // before its first step
//   ... steps ...
//   a.finish(7, prompt_and_generated_tokens, "", last_step);                           // the engine says it ended
//   while (auto s = a.next(50ms)) write(*s);                                           // the writer's thread
//
// The drain thread copies each entry's rows once into its step's rows ([rows, hooks, row_bytes]); a request is
// ready once it finished and every step up to its last one was delivered (a step's entries arrive consecutively:
// a later step's entry completes the earlier ones; a step with all its hooks is complete), and next() builds its
// sample on the caller's thread: its segments in position order (a position run twice keeps the later run), the
// positions asked for that no delivered step holds as `missing`. Ready samples wait for next() up to
// `max_pending_bytes`: then policy block holds the drain thread (up to `timeout`, a stall), policy drop drops the
// sample (dropped_requests(): each one and its tokens, since drops are not a random subset).
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/sink/policy.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::sink {

/// One request that captures, registered before its first step.
struct sample_request {
  std::uint64_t handle{0};          ///< its id in forward_meta::requests
  std::string id;                   ///< its name (the engine's request id)
  std::int64_t lo{0};               ///< the positions [lo, hi) it asked for
  std::int64_t hi{0};
  std::vector<std::uint32_t> keep;  ///< the hooks its sample keeps, in the sample's order
  std::vector<std::int64_t> prompt;  ///< its prompt's tokens (the token ids of a sample that never finished)
  bool strict{false};               ///< a window: every position of [lo, hi) is due, even past an early stop
};

/// A request's sample: its rows in position order.
struct assembled_sample {
  std::uint64_t handle{0};
  std::string id;
  std::vector<std::uint32_t> keep;
  std::uint64_t row_bytes{0};
  std::vector<std::byte> hidden;        ///< [tokens, keep.size(), row_bytes]
  std::vector<std::int64_t> positions;  ///< [tokens], increasing
  std::vector<std::int64_t> token_ids;  ///< the sequence's token at each position (-1 past its end)
  std::vector<std::pair<std::int64_t, std::int64_t>> missing;  ///< ranges [a, b) asked for and not captured
  std::string reason;                   ///< why it is incomplete: the engine's reason, then failed entries
  bool complete{false};                 ///< nothing missing, no reason
};

struct sample_assembler_config {
  std::uint32_t hooks{0};  ///< the run's hooks 0 .. hooks - 1: one row entry each per step
  queue_policy policy{queue_policy::block};
  std::uint64_t max_pending_bytes{std::uint64_t{1} << 30};  ///< ready samples next() has not taken yet
  std::chrono::milliseconds timeout{60000};                 ///< block: the longest wait of the drain thread
};

struct sample_assembler_stats {
  std::uint64_t entries{0};          ///< entries delivered
  std::uint64_t failed_entries{0};   ///< delivered not ok (their requests' samples name them)
  std::uint64_t refused_entries{0};  ///< after close(), or rows of another shape than their step's
  std::uint64_t rows{0};             ///< rows filed
  std::uint64_t steps_held{0};       ///< now: steps whose rows wait for their requests' samples
  std::uint64_t bytes_held{0};       ///< now: those rows' bytes
  std::uint64_t samples_taken{0};    ///< samples next() returned
  std::uint64_t samples_dropped{0};  ///< policy drop
  std::uint64_t pending_bytes{0};    ///< now: ready samples' bytes not taken
  std::uint64_t stalls{0};           ///< policy block: the drain thread waited for next()
  std::uint64_t stall_timeouts{0};
};

/// Calls f(name, value) for each counter of `s`, in declaration order.
template <class F>
void for_each_stat(const sample_assembler_stats& s, F&& f)
{
  f("entries", s.entries);
  f("failed_entries", s.failed_entries);
  f("refused_entries", s.refused_entries);
  f("rows", s.rows);
  f("steps_held", s.steps_held);
  f("bytes_held", s.bytes_held);
  f("samples_taken", s.samples_taken);
  f("samples_dropped", s.samples_dropped);
  f("pending_bytes", s.pending_bytes);
  f("stalls", s.stalls);
  f("stall_timeouts", s.stall_timeouts);
}

namespace detail {
class sample_assembler_impl;
}

/// The assembler (move-only handle; a d2h::sink). Thread-safe: the drain thread delivers, the engine's thread adds
/// and finishes requests, one writer thread calls next(). Errors: logic_error for a request added twice or
/// finished unknown (naming it), for `hooks` 0, for a call on a moved-from handle.
class sample_assembler {
 public:
  explicit sample_assembler(sample_assembler_config cfg);
  sample_assembler(sample_assembler&&) noexcept;
  sample_assembler& operator=(sample_assembler&&) noexcept;
  ~sample_assembler();

  /// The channel's entry consumer (shares the assembler's state).
  [[nodiscard]] std::function<void(d2h::entry_view&&)> callback() const;
  /// Rows carry their own width: the channel's schema is not needed.
  void adopt_schema(const d2h::hook_schema&) const noexcept {}

  void add(sample_request r);
  /// The request ended: `sequence` its prompt and generated tokens (empty: unknown, its prompt), `reason` why it
  /// is incomplete ("": it finished), `last_step` the last step that held rows of it (-1: none). A request not
  /// added, or finished already, is ignored.
  void finish(std::uint64_t handle, std::vector<std::int64_t> sequence, std::string reason, std::int64_t last_step);
  /// The next ready sample, built on this thread; nullopt when none is ready within `wait`.
  [[nodiscard]] std::optional<assembled_sample> next(std::chrono::milliseconds wait);
  /// No more entries (close the channel first): every request not finished ends with "not finished when the
  /// capture closed", and every finished one is ready whatever was delivered; next() returns them. Idempotent;
  /// returns the counters.
  sample_assembler_stats close();
  [[nodiscard]] bool closed() const;
  /// Closed, and next() returned every sample.
  [[nodiscard]] bool done() const;
  /// Policy drop: every dropped sample (forwards: the steps it ran in; rows: its tokens), in dropping order.
  [[nodiscard]] std::vector<request_drop> dropped_requests() const;
  [[nodiscard]] sample_assembler_stats stats() const;

 private:
  [[nodiscard]] detail::sample_assembler_impl& impl() const;
  std::shared_ptr<detail::sample_assembler_impl> impl_;
};

}  // namespace ferry::sink
