// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's reader behind its handle (sink/shm_reader.hpp): attach (claim the reader slot
// with a CAS, ask the producer for a session, wait for it), poll (acquire head, read descriptors, publish the
// read index), release (mark, advance the released prefix, store-release it tagged with the session), close
// (the last release, then the slot freed), the schema (acquire its word, parse a copy of its region), each
// entry's attribution (a copy of its forward's record, parsed once per record). The ordering steps
// (docs/design/shm_stream.md) are marked S0..S7.
#pragma once

#include "shm_records.hpp"
#include "shm_schema.hpp"
#include "shm_segment.hpp"

#include <ferry/sink/shm_reader.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include <unistd.h>

namespace ferry::sink::detail {

class shm_reader_impl : public std::enable_shared_from_this<shm_reader_impl> {
  using clock = std::chrono::steady_clock;

 public:
  shm_reader_impl(const std::string& name, std::chrono::milliseconds timeout)
    : seg_{shm::segment::open(name, timeout)}, h_{seg_->header()}
  {
    const auto deadline = clock::now() + timeout;
    producer_pid_ = static_cast<long>(shm::load(h_, shm::w_producer_pid));
    producer_start_ = shm::load(h_, shm::w_producer_start);
    generation_ = shm::load(h_, shm::w_generation);
    check_producer(name);
    std::random_device rd;
    std::uint32_t nonce = 0;
    while (nonce == 0) { nonce = rd(); }
    claim_ = shm::claim_of(static_cast<std::uint64_t>(::getpid()), nonce);
    // S1: claim the reader slot (one reader: a CAS from 0), then ask for a session and wait for it.
    for (;;) {
      std::uint64_t cur = 0;
      if (shm::at(h_, shm::w_claim).compare_exchange_strong(cur, claim_, std::memory_order_acq_rel)) { break; }
      const long owner = shm::pid_of_claim(cur);
      if (shm::alive(owner, 0) || clock::now() >= deadline) {
        throw stream_busy_error(
            ferry::detail::format(
                "ferry: shm reader: stream '{}' expected no reader attached, got reader pid {}{} [{}:{}]", name, owner,
                shm::alive(owner, 0) ? "" : " (gone; the producer did not free its slot in time)", __FILE__, __LINE__),
            owner);
      }
      check_producer(name);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a dead reader's slot: the producer frees it
    }
    shm::store(h_, shm::w_reader_start, shm::start_time(::getpid()), std::memory_order_relaxed);
    shm::store(h_, shm::w_attach_request, claim_);
    while (shm::load(h_, shm::w_session_claim) != claim_) {
      if (clock::now() >= deadline || !shm::alive(producer_pid_, producer_start_)) {
        free_slot();
        check_producer(name);
        FERRY_FAIL(ferry::timeout_error, "shm reader: stream '{}' expected a session from its producer (pid {}) within "
                   "{} ms, got none", name, producer_pid_, timeout.count());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    session_ = shm::load(h_, shm::w_session, std::memory_order_relaxed);
    read_ = prefix_ = start_ = shm::load(h_, shm::w_read_start, std::memory_order_relaxed);
  }
  shm_reader_impl(const shm_reader_impl&) = delete;
  shm_reader_impl& operator=(const shm_reader_impl&) = delete;

  std::vector<shm_entry> poll(std::size_t max, std::chrono::microseconds timeout)
  {
    std::vector<shm_entry> out;
    FERRY_EXPECTS(!closed_, ferry::logic_error,
                  "shm reader: stream '{}': poll() expected an open reader, got a closed one", seg_->name());
    const auto deadline = clock::now() + timeout;
    auto next_check = clock::now();
    for (unsigned spin = 0;; ++spin) {
      check_session();
      const std::uint64_t h = shm::load(h_, shm::w_head);  // S3: acquire; the descriptors below it are written
      if (read_ < h) {
        take(std::min<std::uint64_t>(h, read_ + max), out);
        return out;
      }
      if (shm::load(h_, shm::w_state) == shm::state_closed && shm::load(h_, shm::w_head) == read_) {
        ended_ = true;  // S5: closed after its last head: nothing more comes
        return out;
      }
      const auto now = clock::now();
      if (now >= next_check) {
        next_check = now + std::chrono::milliseconds(10);
        if (!shm::alive(producer_pid_, producer_start_) && shm::load(h_, shm::w_head) == read_) {
          FERRY_FAIL(producer_gone_error, "shm reader: stream '{}' expected its producer pid {} alive or the stream "
                     "closed, got the producer gone after {} entries (all read)", seg_->name(), producer_pid_, read_);
        }
      }
      if (now >= deadline || max == 0) { return out; }
      if (spin < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(spin < 256 ? 20 : 200));
      }
    }
  }

  /// S4: entry `index` is done; the released prefix (stream order) goes to the producer, store-release.
  void release(std::uint64_t index) noexcept
  {
    std::lock_guard lk{mu_};
    if (closed_ || detached_ || index < prefix_ || index - prefix_ >= done_.size()) { return; }
    done_[index - prefix_] = true;
    std::uint64_t n = 0;
    while (!done_.empty() && done_.front()) {
      done_.pop_front();
      ++n;
    }
    if (n == 0) { return; }
    prefix_ += n;
    released_count_ += n;
    shm::store(h_, shm::w_release, shm::tagged(shm::session_tag(session_), prefix_));
  }

  void close() noexcept
  {
    std::lock_guard lk{mu_};
    if (closed_) { return; }
    closed_ = true;
    if (!detached_) { free_slot(); }  // S7: the release store above came first; then the slot goes
  }

  [[nodiscard]] bool ended() const noexcept { return ended_; }
  [[nodiscard]] std::shared_ptr<const d2h::hook_schema> schema()
  {
    std::lock_guard lk{mu_};
    refresh_schema_locked();
    return schema_;
  }
  [[nodiscard]] shm_reader_stats stats() const
  {
    std::lock_guard lk{mu_};
    return shm_reader_stats{read_ - start_, bytes_, released_count_, read_ - prefix_, shm::load(h_, shm::w_head),
                            session_, start_, generation_, static_cast<std::uint64_t>(producer_pid_)};
  }
  [[nodiscard]] const std::string& name() const noexcept { return seg_->name(); }

 private:
  void take(std::uint64_t end, std::vector<shm_entry>& out)
  {
    const std::uint64_t cap = seg_->capacity();
    out.reserve(end - read_);
    std::lock_guard lk{mu_};
    refresh_schema_locked();  // after poll's acquire of head (S3): a schema published before these entries is seen
    for (; read_ < end; ++read_) {
      shm_entry e;
      std::memcpy(&e.d_, seg_->descriptors() + read_ % cap, sizeof e.d_);
      FERRY_EXPECTS(e.d_.index == read_ && e.d_.offset <= seg_->staging_bytes() &&
                      (e.d_.status != 0 || e.d_.size <= seg_->staging_bytes() - e.d_.offset),
                    ferry::logic_error, "shm reader: stream '{}' expected descriptor {} within the staging's {} bytes, "
                    "got index {}, offset {}, size {}", seg_->name(), read_, seg_->staging_bytes(), e.d_.index,
                    e.d_.offset, e.d_.size);
      attribute_locked(e);
      e.data_ = seg_->staging() + e.d_.offset;
      e.r_ = shared_from_this();
      e.schema_ = schema_;
      bytes_ += e.d_.status == 0 ? e.d_.size : 0;
      done_.push_back(false);
      out.push_back(std::move(e));
    }
    shm::store(h_, shm::w_consumed, shm::tagged(shm::session_tag(session_), read_));
  }

  /// S0: once the schema word is nonzero (acquire), the region's bytes below it are written and never change:
  /// parsed from a private copy (d2h::schema_error for a corrupted one), then kept.
  void refresh_schema_locked()
  {
    if (schema_known_) { return; }
    const std::uint64_t n = shm::load(h_, shm::w_schema);
    if (n == 0) { return; }
    if (n > seg_->schema_capacity()) {
      throw d2h::schema_error(ferry::detail::format(
        "ferry: shm reader: stream '{}': expected a schema region of at most {} bytes (the segment's), got a schema "
        "word of {} (a corrupted segment) [{}:{}]", seg_->name(), seg_->schema_capacity(), n, __FILE__, __LINE__));
    }
    const std::vector<std::byte> copy(seg_->schema_region(), seg_->schema_region() + n);
    schema_ = std::make_shared<const d2h::hook_schema>(shm::decode_schema(copy, seg_->name()));
    schema_known_ = true;
  }

  /// S2a, read under S3's acquire: the entry's forward record, copied and parsed (shm::read_record: logic_error for
  /// one that is not the descriptor's), once per record; an overflow entry gets what its error names.
  void attribute_locked(shm_entry& e)
  {
    const shm::descriptor& d = e.d_;
    const std::uint64_t cap = seg_->record_capacity();
    FERRY_EXPECTS(
        d.attribution <= shm::attribution_overflow &&
            (d.attribution != shm::attribution_record ||
             (d.record_offset <= cap && d.record_bytes <= cap - d.record_offset)),
        ferry::logic_error,
        "shm reader: stream '{}' expected descriptor {}'s attribution none (0), a record "
        "(1) within the record region's {} bytes or overflow (2), got attribution {}, record at {} of {} bytes",
        seg_->name(), d.index, cap, d.attribution, d.record_offset, d.record_bytes);
    if (d.attribution == shm::attribution_overflow) {
      if (!name_) { name_ = std::make_shared<const std::string>(seg_->name()); }
      e.overflow_stream_ = name_;
      e.record_capacity_ = cap;
      return;
    }
    if (d.attribution != shm::attribution_record) { return; }
    if (!record_ || d.record != record_number_ || d.forward != record_forward_) {
      const std::byte* p = seg_->record_region() + d.record_offset;
      const std::vector<std::byte> copy(p, p + d.record_bytes);
      record_ = shm::read_record(copy, d, seg_->name());
      record_number_ = d.record;
      record_forward_ = d.forward;
    }
    e.meta_ = record_;
  }

  /// The producer ended this session (evicted, or the slot freed): every call from now on says so.
  void check_session()
  {
    if (!detached_ && shm::load(h_, shm::w_session_claim) == claim_) { return; }
    {
      std::lock_guard lk{mu_};
      detached_ = true;
    }
    const std::uint64_t why = shm::load(h_, shm::w_detach_reason);
    FERRY_FAIL(reader_detached_error, "shm reader: stream '{}' expected this reader's session {} live, got it ended by "
               "the producer ({}); attach a new reader", seg_->name(), session_,
               why == shm::detach_evicted ? "evicted: no release within the stream's timeout while it needed room"
                                          : "the slot was freed");
  }

  void check_producer(const std::string& name) const
  {
    if (!shm::alive(producer_pid_, producer_start_)) {
      FERRY_FAIL(producer_gone_error,
                 "shm reader: stream '{}' expected its producer pid {} alive, got it gone (a stale "
                 "segment)",
                 name, producer_pid_);
    }
  }

  void free_slot() noexcept
  {
    std::uint64_t c = claim_;
    (void)shm::at(h_, shm::w_claim).compare_exchange_strong(c, 0, std::memory_order_acq_rel);
  }

  std::shared_ptr<shm::segment> seg_;
  std::byte* h_;
  long producer_pid_{0};
  std::uint64_t producer_start_{0}, generation_{0}, claim_{0}, session_{0}, start_{0};
  std::uint64_t read_{0};  // the poll thread's
  std::uint64_t bytes_{0};
  mutable std::mutex mu_;  // release (any thread) against take and close
  std::uint64_t prefix_{0}, released_count_{0};
  std::deque<bool> done_;  // entries [prefix_, read_): released yet?
  bool closed_{false}, detached_{false};
  std::atomic<bool> ended_{false};
  std::shared_ptr<const d2h::hook_schema> schema_{std::make_shared<const d2h::hook_schema>()};  // under mu_
  bool schema_known_{false};
  std::shared_ptr<const d2h::forward_meta> record_;  // the last record parsed (under mu_): its number, forward
  std::uint64_t record_number_{0}, record_forward_{0};
  std::shared_ptr<const std::string> name_;  // for overflow entries' errors
};

}  // namespace ferry::sink::detail
