// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's producer state behind its handle (sink/shm_stream.hpp): the segment, the entry
// views published and not yet released (held_, in stream-index order), the entries kept while the ring is full
// (pending_, policy block), the reader's session, and the stream thread that serves the segment: it takes the
// reader's releases (and releases those views), starts a session for an attach request, ends one whose reader
// left, died or (drop) stalled, and publishes what is pending. deliver() is the drain thread's call. Every
// member is under mu_; views are released after mu_ is let go. Definitions: shm_stream_impl.inl.
#pragma once

#include "drop_ledger.hpp"
#include "shm_records.hpp"
#include "shm_schema.hpp"
#include "shm_segment.hpp"

#include <ferry/d2h/detail/access.hpp>
#include <ferry/detail/close_quietly.hpp>
#include <ferry/sink/shm_stream.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace ferry::sink::detail {

class shm_stream_impl : public std::enable_shared_from_this<shm_stream_impl> {
  using clock = std::chrono::steady_clock;
  using views = std::vector<d2h::entry_view>;

 public:
  explicit shm_stream_impl(shm_stream_config cfg) : cfg_{std::move(cfg)}
  {
    const auto& n = cfg_.name;
    FERRY_EXPECTS(shm::valid_name(n), ferry::logic_error,
                  "shm stream: expected a name of 1..200 characters [A-Za-z0-9._-] not starting with '.', got '{}'", n);
    FERRY_EXPECTS(cfg_.descriptors >= 2 && (cfg_.descriptors & (cfg_.descriptors - 1)) == 0 &&
                    cfg_.descriptors <= (std::uint64_t{1} << 24), ferry::logic_error,
                  "shm stream '{}': expected descriptors a power of two in [2, 2^24], got {}", n, cfg_.descriptors);
    FERRY_EXPECTS(cfg_.staging_bytes >= 4096 && cfg_.staging_bytes <= (std::uint64_t{1} << 40), ferry::logic_error,
                  "shm stream '{}': expected staging_bytes in [4096, 2^40], got {}", n, cfg_.staging_bytes);
    FERRY_EXPECTS(cfg_.timeout.count() >= 0 && cfg_.poll_interval.count() > 0, ferry::logic_error,
                  "shm stream '{}': expected timeout >= 0 ms and poll_interval > 0 us, got {} ms and {} us", n,
                  cfg_.timeout.count(), cfg_.poll_interval.count());
    FERRY_EXPECTS(cfg_.schema_bytes <= (std::uint64_t{1} << 30), ferry::logic_error,
                  "shm stream '{}': expected schema_bytes in [0, 2^30], got {}", n, cfg_.schema_bytes);
    FERRY_EXPECTS(cfg_.record_bytes >= 1 && cfg_.record_bytes <= (std::uint64_t{1} << 30), ferry::logic_error,
                  "shm stream '{}': expected record_bytes in [1, 2^30], got {}", n, cfg_.record_bytes);
    if (cfg_.max_lag_entries == 0) { cfg_.max_lag_entries = cfg_.descriptors / 2; }
    if (cfg_.max_lag_bytes == 0) { cfg_.max_lag_bytes = cfg_.staging_bytes / 2; }
    // S0: a config schema is in the segment before its magic (segment::create)
    const auto schema = cfg_.schema.empty() ? std::vector<std::byte>{} : shm::encode_schema(cfg_.schema, n);
    seg_ = shm::segment::create(n, cfg_.descriptors, cfg_.staging_bytes, cfg_.schema_bytes, schema, cfg_.record_bytes);
    h_ = seg_->header();
    records_ = shm::record_ring{seg_->record_region(), seg_->record_capacity()};
    thread_ = std::thread([this] { run(); });
  }
  shm_stream_impl(const shm_stream_impl&) = delete;
  shm_stream_impl& operator=(const shm_stream_impl&) = delete;
  ~shm_stream_impl() { close_quietly(); }

  /// The drain thread's call: the entry is published, kept (block), dropped (drop) or refused.
  void deliver(d2h::entry_view&& v);

  /// S0 after creation (shm_stream::adopt_schema): the channel's schema, when the stream has none, written into
  /// the segment before the first entry. Under mu_, as every publication: the schema word's store happens
  /// before the first descriptor's head store (S2).
  void adopt_schema(const d2h::hook_schema& channel_schema)
  {
    std::lock_guard lk{mu_};
    if (!cfg_.schema.empty() || channel_schema.empty()) { return; }
    FERRY_EXPECTS(!stopping_ && !delivered_, ferry::logic_error,
                  "shm stream '{}': expected to take its channel's schema before its first entry (and before "
                  "close()), got it {}", cfg_.name, stopping_ ? "after close()" : "after entries were delivered");
    const auto region = shm::encode_schema(channel_schema, cfg_.name);
    FERRY_EXPECTS(region.size() <= seg_->schema_capacity(), ferry::logic_error,
                  "shm stream '{}': expected a schema of at most {} bytes in the segment (shm_stream_config::"
                  "schema_bytes), got {} bytes for its {} hooks", cfg_.name, seg_->schema_capacity(), region.size(),
                  channel_schema.size());
    seg_->publish_schema(region);
    cfg_.schema = channel_schema;
  }

  /// The segment's staging for one channel, registered through `r` (its backend's host_register).
  [[nodiscard]] d2h::staging_memory staging(const d2h::host_registration& r)
  {
    std::lock_guard lk{mu_};
    FERRY_EXPECTS(!staging_given_ && !stopping_, ferry::logic_error,
                  "shm stream '{}': staging() expected for one channel at a time of an open stream, got {}", cfg_.name,
                  stopping_ ? "a closed stream" : "a call while another channel (or its views) holds it");
    r.register_memory(seg_->staging(), seg_->staging_bytes());
    staging_given_ = true;
    // Unregistered once the channel and its last view let go; then another channel may take the staging.
    auto seg = seg_;
    std::weak_ptr<shm_stream_impl> self = weak_from_this();
    std::shared_ptr<void> owner(seg->staging(), [unregister = r.unregister_memory, seg, self](void* p) noexcept {
      unregister(p);
      if (auto s = self.lock()) {
        std::lock_guard l{s->mu_};
        s->staging_given_ = false;
      }
    });
    return d2h::staging_memory{seg->staging(), seg->staging_bytes(), std::move(owner)};
  }

  [[nodiscard]] std::vector<request_drop> dropped_requests() const
  {
    std::lock_guard lk{mu_};
    return drops_.snapshot();
  }

  [[nodiscard]] shm_stream_stats stats() const
  {
    std::lock_guard lk{mu_};
    shm_stream_stats s = c_;
    s.pending_entries = pending_.size();
    s.reader_lag_entries = head_ - released_;
    s.reader_lag_bytes = lag_bytes_;
    const std::uint64_t consumed = shm::load(h_, shm::w_consumed);
    s.reader_unread = session_ != 0 && shm::tag_of(consumed) == shm::session_tag(session_)
                        ? head_ - std::min(head_, consumed & shm::index_mask)
                        : 0;
    s.reader_pid = session_ != 0 ? static_cast<std::uint64_t>(reader_pid_) : 0;
    s.attribution_records = records_.written;
    s.attribution_overflows = records_.overflows;
    s.first_error = first_text_;
    return s;
  }

  shm_stream_stats close();
  /// close() for destructors: never throws; an error goes to stderr.
  void close_quietly() noexcept
  {
    ferry::detail::close_quietly([&] { if (!closed()) { (void)close(); } },
                                 [&] { return "ferry: shm stream '" + cfg_.name + "' closed by its destructor"; });
    if (thread_.joinable()) { thread_.join(); }
  }
  [[nodiscard]] bool closed() const
  {
    std::lock_guard lk{mu_};
    return stopping_;
  }
  [[nodiscard]] const shm_stream_config& cfg() const noexcept { return cfg_; }

 private:
  struct held {
    std::uint64_t index;
    std::uint64_t bytes;
    d2h::entry_view view;
  };

  static constexpr const char* after_close =
      "expected entries before close() (close the channel first), got one after it";
  [[nodiscard]] bool has_slot_locked() const noexcept { return head_ - released_ < cfg_.descriptors; }
  /// A free descriptor, and room for the record of v's forward if it needs one written (shm_records.hpp).
  [[nodiscard]] bool has_room_locked(const d2h::entry_view& v)
  {
    return has_slot_locked() && records_.room(v, released_);
  }
  void publish_locked(d2h::entry_view&& v);
  /// The stream thread's pass (also run by deliver): releases, reader checks, attach, pending, eviction.
  void service_locked(views& out);
  void take_releases_locked(views& out);
  void check_reader_locked(views& out, bool liveness);
  void attach_locked(views& out);
  void end_session_locked(shm::detach_reason why, views& out);
  [[nodiscard]] bool admit_locked(const d2h::entry_view& v);
  void refuse_locked(const d2h::entry_view& v, const char* why)
  {
    ++c_.refused_entries;
    keep_locked(std::make_exception_ptr(ferry::logic_error(ferry::detail::format(
      "ferry: shm stream '{}': entry {} of hook {} (forward {}): {}; not published [{}:{}]", cfg_.name, v.seq().value,
      v.hook().value, v.forward_index(), why, __FILE__, __LINE__))));
  }
  void keep_locked(std::exception_ptr e)
  {
    if (first_error_) { return; }
    first_error_ = std::move(e);
    try {
      std::rethrow_exception(first_error_);
    } catch (const std::exception& x) {
      first_text_ = x.what();
    }
    std::fprintf(stderr, "%s (kept: stats().first_error; close() raises it)\n", first_text_.c_str());
  }
  void run();

  shm_stream_config cfg_;
  std::shared_ptr<shm::segment> seg_;
  std::byte* h_{nullptr};
  shm::record_ring records_{nullptr, 0};  // the record region (S2a)
  mutable std::mutex mu_;
  std::condition_variable space_;  // deliver() and close(): a slot freed, the session changed, stopping
  std::condition_variable wake_;   // the stream thread: stop
  std::deque<held> held_;          // published, not released: indices [released_, head_)
  std::deque<d2h::entry_view> pending_;
  std::shared_ptr<d2h::detail::staging_pool> pool_;  // the channel's staging (pressure), from the first view
  std::uint64_t head_{0}, released_{0}, lag_bytes_{0};
  std::uint64_t session_{0}, sessions_{0}, claim_{0};  // the session (0: none) and the reader's claim word
  long reader_pid_{0};
  std::uint64_t reader_start_{0};
  clock::time_point last_progress_{}, next_liveness_{};
  bool pressure_{false};  // drop: the stream needed room since the reader's last release
  bool in_valid_{false}, in_dropped_{false};  // the forward being delivered
  std::uint64_t in_fwd_{0};
  bool staging_given_{false}, stopping_{false}, stop_thread_{false}, stopped_{false};
  bool delivered_{false};  // an entry came (adopt_schema: too late)
  shm_stream_stats c_;
  drop_ledger drops_;  // policy drop: what each request lost
  std::exception_ptr first_error_;
  std::string first_text_;
  std::thread thread_;
};

}  // namespace ferry::sink::detail
