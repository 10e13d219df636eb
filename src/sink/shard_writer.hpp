// SPDX-License-Identifier: Apache-2.0
// The writer thread's state of the safetensors sink (sink/safetensors.hpp): forwards out of consecutive
// entries, tensor names, shards out of whole forwards, the run's index. Called by the writer thread only; a full
// shard is sealed and handed to its finisher thread (shard_finisher.hpp: header, sync, rename, index.json, in
// the order handed over) while the writer fills the next one, and flush() waits for it. With open_shards > 1 the
// forwards are dealt to that many open shards in turn (lanes), whose files the pipeline writes at once; each
// forward's ordinal goes into index.json ("order") so that readers merge the shards back in forward order.
// Throws ferry::logic_error (an entry_shape_error, a repeated tag, an entry after flush() completed its forward)
// for an entry it refuses, and anything else (io_error) for a failure that ends the run.
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/sink/safetensors.hpp>  // safetensors_tuning
#include "run_index.hpp"
#include "shard_file.hpp"
#include "shard_finisher.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ferry::sink::detail {

/// The sink's counters, updated by the drain and writer threads (safetensors_stats is their snapshot).
struct live_counters {
  std::atomic<std::uint64_t> forwards_written{0}, tensors_written{0}, bytes_written{0}, shards_written{0};
  std::atomic<std::uint64_t> stalls{0}, stall_timeouts{0};
  std::atomic<std::uint64_t> dropped_forwards{0}, dropped_entries{0}, dropped_bytes{0};
  std::atomic<std::uint64_t> failed_entries{0}, refused_entries{0}, lost_forwards{0}, relocations{0};
  std::atomic<std::uint64_t> lent_entries{0};
  std::atomic<std::uint64_t> open_shards{0};  ///< the writer's lanes (set once, at its construction)
  pipeline_counters io;  ///< the writer's time: copying, waiting for a buffer, waiting for an entry
};

/// What the writer needs of the sink's configuration.
struct writer_options {
  fs::path directory;
  d2h::hook_schema schema;
  std::uint64_t shard_bytes{0};
  bool durable{false};
  bool direct_io{true};  ///< with durable: the data written with O_DIRECT where the filesystem allows
  safetensors_tuning tuning{};  ///< the pipeline's writes: size, buffers, I/O threads
  const std::atomic<bool>* test_hold_finisher{nullptr};  ///< tests: while true, no shard is finished
};

/// Sealed shards that may wait for the finisher while the writer fills the next one, beyond one a lane.
inline constexpr std::size_t max_sealed_shards = 2;

/// The most shard files a writer keeps open (safetensors_tuning::open_shards).
inline constexpr std::size_t max_open_shards = 64;

/// The shard files a writer keeps open (safetensors_tuning::open_shards; 0: two on tmpfs, else one).
[[nodiscard]] inline std::size_t open_shards_of(const safetensors_tuning& t, const fs::path& dir)
{
  if (t.open_shards != 0) { return t.open_shards; }
  return file::dir_on_tmpfs(dir) ? 2 : 1;
}

/// Headers above this start a new shard at a forward boundary (safetensors' readers refuse more than 100 MB).
inline constexpr std::uint64_t max_header_bytes = std::uint64_t{64} << 20;

class shard_writer {
 public:
  shard_writer(writer_options o, live_counters& c)
      : o_{std::move(o)}, c_{c}, index_{o_.directory, o_.schema, o_.durable},
        lanes_(open_shards_of(o_.tuning, o_.directory))
  {
    c_.open_shards = lanes_.size();
    index_.write(false, {});  // the run is valid (and ours) from the start: an index of no shard
  }

  /// An ok entry of forward `forward` (tag `tag`): written as the tensor "{tag}/{hook name}" (a hook's k-th
  /// repeat in its forward, k >= 1: "{tag}/{hook name}#{k}"). `owner` (may be null) keeps `bytes` alive: a large
  /// entry is then written from them (shard_file::append, tuning.lend_min_bytes) and released once written.
  void entry(std::uint64_t forward, std::uint64_t tag, d2h::hook_id hook, std::uint64_t row_bytes,
             std::span<const std::byte> bytes, std::shared_ptr<void> owner = {})
  {
    fin_.check();  // a shard the finisher failed to publish ends the run here
    if (!open_ || forward != cur_) { begin_forward(forward, tag); }
    if (refused_) {
      ++c_.refused_entries;  // the forward's first entry carried the error
      return;
    }
    std::uint64_t rows = 0;
    const d2h::hook_spec& h = o_.schema.check(hook, bytes.size(), row_bytes, rows);
    const std::uint32_t k = repeats_[hook.value]++;
    std::string name = std::to_string(tag) + "/" + h.name + (k != 0 ? "#" + std::to_string(k) : std::string{});
    std::vector<std::uint64_t> shape{rows};
    shape.insert(shape.end(), h.row_shape.begin(), h.row_shape.end());
    const tensor_record probe{name, h.type, shape, 0, bytes.size()};
    make_room(bytes.size(), record_bytes(probe) + 24);
    if (shard()->append(std::move(name), h.type, std::move(shape), bytes, std::move(owner), o_.tuning.lend_min_bytes)) {
      ++c_.lent_entries;
    }
    ++tensors_;
  }

  /// Policy drop: forgets forward `forward` if it is the open one (what it wrote is rolled back).
  void drop(std::uint64_t forward)
  {
    if (!open_ || cur_ != forward) { return; }
    if (shard()) {
      c_.dropped_entries += tensors_;
      c_.dropped_bytes += shard()->pending_bytes();
      shard()->rollback();
    }
    open_ = false;
  }

  /// The open forward is complete; the shard is published if it holds any forward. An entry of that forward
  /// arriving later is refused.
  void flush()
  {
    if (open_) {
      commit_open();
      sealed_ = cur_;
      have_sealed_ = true;
    }
    const auto open = lanes_by_number();
    for (auto* s : open) {  // in shard order
      if (!(*s)->forwards().empty()) { publish_shard(*s); }
    }
    for (auto it = open.rbegin(); it != open.rend(); ++it) { discard(**it); }
    fin_.wait();  // every shard handed over is published (and listed in index.json)
  }

  /// close(): flush(), then index.json marked complete, with the run's first error (empty: none).
  void finish(std::string_view error)
  {
    flush();
    const std::lock_guard lk{index_mu_};
    index_.write(true, error);
  }

  /// After a failure that ends the run: the shards being written are not published (their temporaries removed);
  /// their forwards and the open one are counted as lost. The shards sealed before are still published where their
  /// own writes succeeded (shard_finisher::settle).
  void abandon() noexcept
  {
    c_.lost_forwards += open_ && !refused_ && tensors_ != 0 ? 1 : 0;
    for (auto& s : lanes_) {
      c_.lost_forwards += s ? s->forwards().size() : 0;
      s.reset();
    }
    open_ = false;
    fin_.settle();  // the shards handed over are published where their writes succeeded, else lost
  }

  /// index.json after a failure (complete, with the error), best effort.
  void finish_failed(std::string_view error) noexcept
  {
    try {
      const std::lock_guard lk{index_mu_};
      index_.write(true, error);
    } catch (...) {  // the disk that failed the run may refuse this too; the last index written stays valid
    }
  }

 private:
  void begin_forward(std::uint64_t forward, std::uint64_t tag)
  {
    if (open_) { commit_open(); }
    open_ = true;
    cur_ = forward;
    lane_ = dealt_++ % lanes_.size();  // the forwards dealt to the open shards in turn
    repeats_.clear();
    tensors_ = 0;
    refused_ = true;  // until the checks below pass
    FERRY_EXPECTS(!have_sealed_ || forward > sealed_, ferry::logic_error,
                  "safetensors sink {}: entry of forward {} (tag {}): expected a forward after {}, which flush() "
                  "completed, got one of it (call flush() between forwards only); the entry is not written",
                  o_.directory.string(), forward, tag, sealed_);
    if (tags_.count(tag) != 0) {
      const std::lock_guard lk{index_mu_};
      index_.refuse_tag(tag);
    }  // listed in index.json, then refused below
    FERRY_EXPECTS(tags_.insert(tag).second, ferry::logic_error,
                  "safetensors sink {}: forward {}: expected a tag no earlier forward had (tensor names are "
                  "\"{{tag}}/{{hook}}\"), got tag {} again; the forward is not written",
                  o_.directory.string(), forward, tag);
    refused_ = false;
    tag_ = tag;
  }

  void commit_open()
  {
    open_ = false;
    auto& s = shard();
    if (refused_ || tensors_ == 0 || !s) { return; }
    last_forward_ = s->pending_bytes();
    s->commit(tag_, cur_);
    if (s->committed_bytes() >= o_.shard_bytes || header_estimate(*s) >= max_header_bytes) {
      publish_shard(s);
    }
  }

  /// Before writing `bytes` (a record of `record` JSON bytes): a shard is open, and it stays within shard_bytes
  /// and the header limit unless the open forward is its only one. At a forward's first entry the shard is
  /// published when a forward the size of the last one would not fit; a forward larger than that moves into
  /// a new shard once it overflows (a copy of what it wrote so far: relocations).
  void make_room(std::uint64_t bytes, std::uint64_t record)
  {
    auto& s = shard();
    if (!s) {
      s = new_shard(bytes, record);
      return;
    }
    const bool first = s->pending_bytes() == 0 && s->tensors().size() == s->committed_tensors();
    if (first && !s->forwards().empty() && s->committed_bytes() + std::max(bytes, last_forward_) > o_.shard_bytes) {
      publish_shard(s);  // the forward, as large as the last one, would not fit: a new shard now, nothing to move
      s = new_shard(bytes, record);
      return;
    }
    const bool over = s->committed_bytes() + s->pending_bytes() + bytes > o_.shard_bytes ||
                      header_estimate(*s) + record > max_header_bytes;
    if (!over || s->forwards().empty()) { return; }
    auto next = new_shard(bytes, record);
    if (s->pending_bytes() != 0 || s->tensors().size() > s->committed_tensors()) {
      const publish_timer t{c_.io};
      s->move_pending(*next);
      ++c_.relocations;
    }
    publish_shard(s);
    s = std::move(next);
  }

  /// The open forward's shard (its lane's; null until the lane's first entry).
  [[nodiscard]] std::unique_ptr<shard_file>& shard() noexcept { return lanes_[lane_]; }

  /// The lanes' open shards, by number.
  [[nodiscard]] std::vector<std::unique_ptr<shard_file>*> lanes_by_number()
  {
    std::vector<std::unique_ptr<shard_file>*> v;
    for (auto& s : lanes_) {
      if (s) { v.push_back(&s); }
    }
    std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return (*a)->number() < (*b)->number(); });
    return v;
  }

  /// A new shard, numbered next: its data through the pipeline (O_DIRECT with durable and direct_io).
  [[nodiscard]] std::unique_ptr<shard_file> new_shard(std::uint64_t bytes, std::uint64_t record)
  {
    auto s = std::make_unique<shard_file>(o_.directory, next_, reservation(bytes, record), &pipe_,
                                          o_.durable && o_.direct_io);
    ++next_;
    return s;
  }

  /// Drops an open shard that holds no forward (its temporary removed; null: handed over already); its number is
  /// given again when no later one was given (a run of one lane numbers its shards without gaps).
  void discard(std::unique_ptr<shard_file>& s) noexcept
  {
    if (s && s->number() + 1 == next_) { --next_; }
    s.reset();
  }

  /// The data offset of a new shard: the header the shard will likely need (the header bytes per data byte of the
  /// shards published and open so far, or of the first entry, for shard_bytes of data) plus a quarter; publish()
  /// moves the data once when the guess was too small or far too large.
  [[nodiscard]] std::uint64_t reservation(std::uint64_t bytes, std::uint64_t record) const
  {
    std::uint64_t header = seen_header_, data = seen_data_;
    for (const auto& s : lanes_) {  // the open shards' records and data (a lane's first shard after another's)
      if (s) {
        header += s->record_json_bytes();
        data += s->committed_bytes() + s->pending_bytes();
      }
    }
    const double ratio =
        data != 0 ? static_cast<double>(header) / static_cast<double>(data)
                  : static_cast<double>(record + 64) / static_cast<double>(std::max<std::uint64_t>(bytes, 1));
    const double want = ratio * static_cast<double>(o_.shard_bytes) * 1.25 + 512.0;
    return static_cast<std::uint64_t>(std::clamp(want, 4096.0, static_cast<double>(max_header_bytes + (1U << 20))));
  }

  [[nodiscard]] static std::uint64_t header_estimate(const shard_file& s)
  {
    return s.record_json_bytes() + 64 * s.forwards().size() + 512;
  }

  /// Adds its scope's time to writer_publish_seconds (a shard rolled over: publish_shard, move_pending).
  struct publish_timer {
    pipeline_counters& c;
    std::chrono::steady_clock::time_point t0{std::chrono::steady_clock::now()};
    ~publish_timer()
    {
      c.publish_ns.fetch_add(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t0).count()),
                             std::memory_order_relaxed);
    }
  };

  /// Seals shard `s` and hands it to the finisher (which waits for its last writes, writes its header, syncs,
  /// renames and lists it in index.json); the writer goes on with the next shard. `s` is null after it.
  void publish_shard(std::unique_ptr<shard_file>& s)
  {
    const publish_timer timer{c_.io};
    s->seal();
    // its forwards' CRCs are not all known yet (lent entries'): a CRC's digits, 10 at most, counted as 10
    seen_header_ += metadata(*s).size() + 9 * s->forwards().size() + s->record_json_bytes() + 32;
    seen_data_ += s->committed_bytes();
    fin_.hand_over(std::move(s));
  }

  /// The shard's safetensors metadata: ferry's format and version, its number, and "ferry.forwards" (`[[tag, begin,
  /// end, crc32, tensors], ...]` of its data section; the CRCs once resolve_crcs() ran).
  [[nodiscard]] static std::string metadata(const shard_file& s)
  {
    std::string fwd = "[";
    for (const auto& f : s.forwards()) {
      fwd += ferry::detail::format("{}[{},{},{},{},{}]", fwd.size() > 1 ? "," : "", f.tag, f.begin, f.end, f.crc,
                                   f.tensors);
    }
    fwd += "]";
    std::string meta = "{\"format\":\"pt\"";
    json::append_key(meta, "ferry.format");
    json::append_string(meta, run_format);
    json::append_key(meta, "ferry.format_version");
    json::append_string(meta, std::to_string(run_format_version));
    json::append_key(meta, "ferry.version");
    json::append_string(meta, ferry::version);
    json::append_key(meta, "ferry.shard");
    json::append_string(meta, std::to_string(s.number()));
    json::append_key(meta, "ferry.forwards");
    json::append_string(meta, fwd);
    meta += '}';
    return meta;
  }

  /// The finisher's part of publishing a shard (its thread). A shard renamed is listed and counted as written,
  /// even when what follows fails (its directory's fsync, index.json): finish_failed() writes index.json again,
  /// with the run's error, and lists it too.
  void finish_shard(shard_file& s)
  {
    std::uint64_t relocations = 0;
    std::exception_ptr failed;
    try {
      s.resolve_crcs();  // its writes drained: the lent entries' CRCs are in
      (void)s.finish(metadata(s), o_.durable, relocations);
    } catch (...) {
      failed = std::current_exception();
    }
    c_.relocations += relocations;
    const std::lock_guard lk{index_mu_};
    if (!s.published()) {  // finish() threw before the rename: the finisher counts it lost
      if (failed) { std::rethrow_exception(failed); }
      return;
    }
    index_.add_shard(s.name(), s.tensors(), s.forwards(), s.committed_bytes());
    try {
      if (!failed) { index_.write(false, {}); }
    } catch (...) {
      failed = std::current_exception();
    }
    // counted once index.json lists it (a reader of the counters finds it there), or would have
    ++c_.shards_written;
    c_.forwards_written += s.forwards().size();
    c_.tensors_written += s.committed_tensors();
    c_.bytes_written += s.committed_bytes();
    if (failed) { std::rethrow_exception(failed); }
  }

  writer_options o_;
  live_counters& c_;
  run_index index_;
  write_pipeline pipe_{o_.tuning.write_bytes, o_.tuning.write_buffers, o_.tuning.io_threads, &c_.io};  // before
                                                                        // lanes_: their writes end before it stops
  std::vector<std::unique_ptr<shard_file>> lanes_;  // the open shards (null: none yet)
  std::size_t lane_{0};     // the open forward's lane
  std::uint64_t dealt_{0};  // forwards dealt to the lanes
  std::uint64_t next_{0};  // the next shard's number
  bool open_{false};       // a forward is open (its entries go to its lane's shard as pending)
  bool refused_{false};    // the open forward is refused (a repeated tag, or after flush())
  std::uint64_t cur_{0};
  std::uint64_t tag_{0};
  std::uint64_t tensors_{0};  // tensors the open forward wrote
  std::unordered_map<std::uint32_t, std::uint32_t> repeats_;
  std::unordered_set<std::uint64_t> tags_;
  bool have_sealed_{false};
  std::uint64_t sealed_{0};
  std::uint64_t last_forward_{0};  // data bytes of the last forward committed (the next one's likely size)
  std::uint64_t seen_header_{0};
  std::uint64_t seen_data_{0};
  std::mutex index_mu_;  // index_: the writer (refused tags, the last write) and the finisher (each shard)
  shard_finisher fin_{[this](shard_file& f) { finish_shard(f); },
                      [this](const shard_file& f) {  // a published one is listed (finish_shard) and counted
                        if (!f.published()) { c_.lost_forwards += f.forwards().size(); }
                      },
                      max_sealed_shards + lanes_.size() - 1, o_.test_hold_finisher};  // last: stops first
};

}  // namespace ferry::sink::detail
