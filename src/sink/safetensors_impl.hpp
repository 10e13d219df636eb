// SPDX-License-Identifier: Apache-2.0
// The safetensors sink's state behind its handle (sink/safetensors.hpp): the bounded writer queue the drain
// thread fills (deliver(): forwards tracked, policies block and drop), the writer thread that empties it into
// the shard_writer, flush and close handshakes, the first error kept, the counters.
#pragma once

#include "drop_ledger.hpp"
#include "shard_writer.hpp"

#include <ferry/detail/close_quietly.hpp>
#include <ferry/sink/safetensors.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace ferry::sink::detail {

/// One item of the writer queue: an entry, or an order (drop a forward, flush, stop). An entry holds its
/// staging (`view`, policy block) or a copy of its bytes (`copy`, policy drop: the staging went back at once).
struct queued {
  enum class kind : std::uint8_t { entry, drop, flush, stop };
  kind k{kind::entry};
  d2h::entry_view view{};
  std::uint64_t forward{0};
  std::uint64_t tag{0};
  std::uint64_t bytes{0};
  std::chrono::steady_clock::time_point at{};
  bool owned{false};             ///< the bytes are `copy` (hook and row_bytes below), not the view's
  std::vector<std::byte> copy{};
  d2h::hook_id hook{};
  std::uint64_t row_bytes{0};
};

class safetensors_impl {
  using clock = std::chrono::steady_clock;

 public:
  explicit safetensors_impl(safetensors_config cfg) : cfg_{std::move(cfg)}
  {
    const std::string dir = cfg_.directory.string();
    FERRY_EXPECTS(!cfg_.directory.empty(), ferry::logic_error,
                  "safetensors sink: expected a directory, got an empty path");
    FERRY_EXPECTS(cfg_.shard_bytes >= 1 && cfg_.max_queue_bytes >= 1, ferry::logic_error,
                  "safetensors sink {}: expected shard_bytes >= 1 and max_queue_bytes >= 1, got {} and {}", dir,
                  cfg_.shard_bytes, cfg_.max_queue_bytes);
    FERRY_EXPECTS(cfg_.block_timeout.count() >= 0, ferry::logic_error,
                  "safetensors sink {}: expected block_timeout >= 0 ms, got {} ms", dir, cfg_.block_timeout.count());
    const safetensors_tuning& t = cfg_.tuning;
    write_pipeline::check_shape("safetensors sink " + dir, t.io_threads, t.write_buffers, t.write_bytes);
    FERRY_EXPECTS(t.open_shards <= max_open_shards, ferry::logic_error,
                  "safetensors sink {}: expected tuning open_shards in [0, {}] (0: two on tmpfs, else one), got {}",
                  dir, max_open_shards, t.open_shards);
    prepare_run_dir(cfg_.directory, cfg_.overwrite);
    writer_.emplace(
        writer_options{cfg_.directory, cfg_.schema, cfg_.shard_bytes, cfg_.fsync, cfg_.direct_io, cfg_.tuning,
                       &test_hold_finisher},
        c_);
    thread_ = std::thread([this] { run(); });
    if (cfg_.policy == queue_policy::drop) { copier_ = std::thread([this] { copy_run(); }); }
  }
  safetensors_impl(const safetensors_impl&) = delete;
  safetensors_impl& operator=(const safetensors_impl&) = delete;
  ~safetensors_impl() { close_quietly(); }

  /// The drain thread's call: the entry is queued, dropped (policy drop), or refused.
  void deliver(d2h::entry_view&& v);

  /// The schema of the channel the sink is attached to (safetensors::adopt_schema): taken when the sink has
  /// none of its own, before its first entry (index.json rewritten with it); the sink's own otherwise.
  void adopt_schema(const d2h::hook_schema& channel_schema)
  {
    std::lock_guard lk{mu_};
    const std::string dir = cfg_.directory.string();
    if (!cfg_.schema.empty()) { return; }
    FERRY_EXPECTS(!channel_schema.empty(), ferry::logic_error,
                  "safetensors sink {}: expected a schema (safetensors_config::schema, or its channel's), got none "
                  "from either", dir);
    // Nothing queued, no flush in flight, no entry seen: the writer thread is waiting and never touched writer_.
    FERRY_EXPECTS(!stopping_ && !in_valid_ && q_.empty() && cq_.empty() && flush_asked_ == flush_done_,
                  ferry::logic_error,
                  "safetensors sink {}: expected to take its channel's schema before its first entry (and before "
                  "close()), got it {}",
                  dir, stopping_ ? "after close()" : "after entries were delivered");
    cfg_.schema = channel_schema;
    writer_.emplace(
        writer_options{cfg_.directory, cfg_.schema, cfg_.shard_bytes, cfg_.fsync, cfg_.direct_io, cfg_.tuning,
                       &test_hold_finisher},
        c_);
  }

  /// Completes the open forward and publishes the shard; returns once the writer did. Throws the error that
  /// ended the run, if one did.
  void flush()
  {
    std::unique_lock lk{mu_};
    FERRY_EXPECTS(!stopping_, ferry::logic_error,
                  "safetensors sink {}: flush() expected an open sink, got a closed one", cfg_.directory.string());
    const std::uint64_t id = ++flush_asked_;
    push_locked(queued{.k = queued::kind::flush, .at = clock::now()});
    done_.wait(lk, [&] { return flush_done_ >= id; });
    if (fatal_) { std::rethrow_exception(fatal_); }
  }

  [[nodiscard]] safetensors_stats stats() const
  {
    safetensors_stats s;
    {
      std::lock_guard lk{mu_};
      s.queue_entries = q_entries_;
      s.queue_bytes = q_bytes_;
      s.queue_high_watermark = q_high_;
      for (const auto& q : q_) {
        if (q.k == queued::kind::entry) {
          s.writer_lag_seconds = std::chrono::duration<double>(clock::now() - q.at).count();
          break;
        }
      }
      s.failed = failed_;
      s.first_error = first_text_;
    }
    s.forwards_written = c_.forwards_written;
    s.tensors_written = c_.tensors_written;
    s.bytes_written = c_.bytes_written;
    s.shards_written = c_.shards_written;
    s.stalls = c_.stalls;
    s.stall_timeouts = c_.stall_timeouts;
    s.dropped_forwards = c_.dropped_forwards;
    s.dropped_entries = c_.dropped_entries;
    s.dropped_bytes = c_.dropped_bytes;
    s.failed_entries = c_.failed_entries;
    s.refused_entries = c_.refused_entries;
    s.lost_forwards = c_.lost_forwards;
    s.relocations = c_.relocations;
    s.lent_entries = c_.lent_entries;
    s.open_shards = c_.open_shards;
    s.writer_copy_seconds = pipeline_counters::seconds(c_.io.copy_ns);
    s.writer_wait_seconds = pipeline_counters::seconds(c_.io.wait_ns);
    s.writer_idle_seconds = pipeline_counters::seconds(c_.io.idle_ns);
    s.writer_publish_seconds = pipeline_counters::seconds(c_.io.publish_ns);
    return s;
  }

  [[nodiscard]] std::vector<request_drop> dropped_requests() const
  {
    std::lock_guard lk{mu_};
    return drops_.snapshot();
  }

  /// Stops the writer after everything queued (the last shard, index.json complete). The first call throws
  /// the first error kept; later calls wait for the first and return the counters.
  safetensors_stats close()
  {
    bool joiner = false;
    {
      std::unique_lock lk{mu_};
      if (!stopping_) {
        stopping_ = true;
        joiner = true;
        push_locked(queued{.k = queued::kind::stop, .at = clock::now()});
        space_.notify_all();
      } else {
        done_.wait(lk, [&] { return stopped_; });
      }
    }
    if (!joiner) { return stats(); }
    thread_.join();
    if (copier_.joinable()) { copier_.join(); }
    std::exception_ptr e;
    {
      std::lock_guard lk{mu_};
      e = first_error_;
    }
    if (e) { std::rethrow_exception(e); }
    return stats();
  }

  /// close() for destructors: never throws; an error goes to stderr.
  void close_quietly() noexcept
  {
    ferry::detail::close_quietly(
        [&] {
          if (!closed()) {
            (void)close();
          }
        },
        [&] { return "ferry: safetensors sink " + cfg_.directory.string() + " closed by its destructor"; });
    if (thread_.joinable()) { thread_.join(); }
    if (copier_.joinable()) { copier_.join(); }
  }

  [[nodiscard]] bool closed() const
  {
    std::lock_guard lk{mu_};
    return stopping_;
  }
  [[nodiscard]] const safetensors_config& cfg() const noexcept { return cfg_; }

  /// Test-only (reached through ferry::testing::sink_access, tests/support; never set outside tests): while
  /// true, the writer thread takes no item from its queue.
  std::atomic<bool> test_hold_writer{false};
  /// Test-only, likewise: while true, the writer's finisher publishes no shard (the writer goes on).
  std::atomic<bool> test_hold_finisher{false};

 private:
  void push_locked(queued&& q)
  {
    if (q.k == queued::kind::entry) {
      ++q_entries_;
      q_bytes_ += q.bytes;
      q_high_ = std::max(q_high_, q_bytes_);
    }
    if (copier_.joinable()) {  // policy drop: every item through the copier, in order
      cq_.push_back(std::move(q));
      copy_work_.notify_one();
      return;
    }
    q_.push_back(std::move(q));
    work_.notify_one();
  }

  void refuse_locked(const d2h::entry_view& v, std::uint64_t fwd)
  {
    ++c_.refused_entries;
    if (stopping_ && !failed_) {
      keep_locked(std::make_exception_ptr(ferry::logic_error(ferry::detail::format(
          "ferry: safetensors sink {}: entry of hook {} (forward {}): expected entries before close() (close the "
          "channel first), got one after it; not written [{}:{}]",
          cfg_.directory.string(), v.hook().value, fwd, __FILE__, __LINE__))));
    }
  }

  void keep_locked(std::exception_ptr e)
  {
    if (first_error_) { return; }
    first_error_ = std::move(e);
    try {
      std::rethrow_exception(first_error_);
    } catch (const std::exception& x) {
      first_text_ = x.what();
    } catch (...) {
      first_text_ = "a non-std::exception";
    }
    std::fprintf(stderr, "%s (kept: stats().first_error; close() raises it)\n", first_text_.c_str());
  }

  /// The writer thread.
  void run();
  /// Policy drop's copier thread: each admitted entry copied out of its staging (released at once), every item
  /// then passed on to the writer's queue in order; the drain thread never copies.
  void copy_run();

  static std::string what_of(const std::exception_ptr& e)
  {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "a non-std::exception";
    }
  }

  safetensors_config cfg_;
  live_counters c_;
  drop_ledger drops_;  // policy drop: what each request lost (under mu_)
  std::optional<shard_writer> writer_;  // the writer thread's only
  mutable std::mutex mu_;
  std::condition_variable work_;   // the writer: an item was queued
  std::condition_variable space_;  // the drain: queue space, a failure, or close
  std::condition_variable done_;   // flush() and close(): the writer did it
  std::deque<queued> q_;
  std::deque<queued> cq_;                  // policy drop: items for the copier (then q_)
  std::condition_variable copy_work_;      // the copier: an item was queued
  std::deque<std::vector<std::byte>> spare_;  // policy drop: copy buffers the writer is done with (FIFO: sizes cycle)
  std::uint64_t spare_bytes_{0};              // their capacity, at most max_queue_bytes
  std::uint64_t q_entries_{0}, q_bytes_{0}, q_high_{0};
  bool in_valid_{false}, in_dropped_{false};  // the drain side's forward
  std::uint64_t in_fwd_{0};
  bool failed_{false}, stopping_{false}, stopped_{false};
  std::uint64_t flush_asked_{0}, flush_done_{0};
  std::exception_ptr first_error_;
  std::exception_ptr fatal_;  // the error that ended the run
  std::string first_text_;
  std::thread thread_;
  std::thread copier_;  // policy drop only
};

}  // namespace ferry::sink::detail
