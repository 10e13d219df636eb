// SPDX-License-Identifier: Apache-2.0
// The reader of a shared-memory stream (shm_stream.hpp), for another process; needs no GPU and no backend:
//
//   ferry::sink::shm_reader r{"acts"};                 // attaches (waits up to 5 s for the stream)
//   while (!r.ended()) {
//     for (auto& e : r.poll(64, std::chrono::milliseconds(100))) {
//       use(e.hook(), e.tag(), e.bytes());             // zero-copy: the bytes where the D2H put them
//       if (e.spec() != nullptr) { use(e.typed()); }   // a hook of the stream's schema: d2h::typed_view
//       for (const auto& q : e.requests()) { use(q.request, e.rows_of(q.request)); }  // the forward's attribution
//     }                                                // each entry released when it dies (or release())
//   }
//
// Entries come in stream order (the channel's delivery order) and may be released in any order; the producer
// gets back the released prefix. Errors: stream_busy_error (another reader is attached), layout_version_error
// (a producer of another layout version), reader_detached_error (the producer ended this session: evicted
// under policy drop), producer_gone_error (the producer died; raised once every entry it published was read),
// timeout_error (no stream of that name, or no session, within the attach timeout), d2h::schema_error (poll(),
// schema(): a corrupted schema region), logic_error (poll(): a corrupted descriptor or forward record),
// attribution_overflow_error (an entry's attribution accessors: its forward's record did not fit the segment).
// The reader's code (attach, poll, release, the records and the schema region) is compiled into ferry::core
// (src/sink/shm_reader*.cpp).
#pragma once

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/typed_view.hpp>
#include <ferry/sink/detail/shm_layout.hpp>  // shm::descriptor: what an entry holds
#include <ferry/sink/errors.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ferry::sink {

namespace detail {
class shm_reader_impl;
}

/// What an entry's forward attribution is at the reader: none given (no tag, requests or user bytes), present
/// (meta(), requests(), user() as the producer's entry_view had them), or overflow (its record was larger than
/// the stream's record region: the accessors throw attribution_overflow_error).
enum class shm_attribution { none, present, overflow };

/// One entry of the stream (move-only): its descriptor and its bytes in the stream's staging, valid until
/// released (release(), the destructor; or the reader's close() while unreleased: the producer may then reuse
/// the bytes). Its attribution is the reader's private copy of its forward's record: valid after release too.
class shm_entry {
 public:
  shm_entry() = default;
  shm_entry(shm_entry&& o) noexcept;
  shm_entry& operator=(shm_entry&& o) noexcept;
  shm_entry(const shm_entry&) = delete;
  shm_entry& operator=(const shm_entry&) = delete;
  ~shm_entry() { release(); }

  [[nodiscard]] std::uint64_t index() const noexcept { return d_.index; }  ///< position in the stream
  [[nodiscard]] d2h::hook_id hook() const noexcept { return d2h::hook_id{d_.hook}; }
  [[nodiscard]] d2h::entry_seq seq() const noexcept { return d2h::entry_seq{d_.seq}; }
  [[nodiscard]] std::uint64_t forward_index() const noexcept { return d_.forward; }
  [[nodiscard]] std::uint64_t tag() const noexcept { return d_.tag; }
  [[nodiscard]] d2h::entry_status status() const noexcept { return static_cast<d2h::entry_status>(d_.status); }
  [[nodiscard]] bool ok() const noexcept { return d_.status == 0; }
  [[nodiscard]] std::uint64_t size() const noexcept { return d_.size; }
  [[nodiscard]] std::uint64_t row_bytes() const noexcept { return d_.row_bytes; }
  /// entry_view::reserved_bytes(): the entry's reservation (a size_overflow entry's size exceeded it).
  [[nodiscard]] std::uint64_t reserved_bytes() const noexcept { return d_.reserved; }
  /// capture_rows: the rows the entry holds (size() / row_bytes(); 0 for a failed or whole entry).
  [[nodiscard]] std::uint64_t rows() const noexcept { return d_.row_bytes != 0 && ok() ? d_.size / d_.row_bytes : 0; }
  [[nodiscard]] bool released() const noexcept { return r_ == nullptr; }

  // ---- attribution (d2h/forward_info.hpp): the producer's entry_view::meta(), through the segment's record ----
  [[nodiscard]] shm_attribution attribution() const noexcept
  {
    return d_.attribution == detail::shm::attribution_record     ? shm_attribution::present
           : d_.attribution == detail::shm::attribution_overflow ? shm_attribution::overflow
                                                                 : shm_attribution::none;
  }
  /// The forward's metadata as the engine gave it (null: none), shared (it outlives release()). Throws
  /// attribution_overflow_error naming the stream, the entry, the record's and the region's bytes.
  [[nodiscard]] const std::shared_ptr<const d2h::forward_meta>& shared_meta() const;
  [[nodiscard]] const d2h::forward_meta* meta() const { return shared_meta().get(); }
  /// The forward's requests {request, first_row, rows} in the entry's row order (empty: none given).
  [[nodiscard]] std::span<const d2h::request_rows> requests() const
  {
    const d2h::forward_meta* m = meta();
    return m != nullptr ? std::span<const d2h::request_rows>{m->requests} : std::span<const d2h::request_rows>{};
  }
  /// The forward's opaque user bytes, as given (empty: none).
  [[nodiscard]] std::span<const std::byte> user() const
  {
    const d2h::forward_meta* m = meta();
    return m != nullptr ? std::span<const std::byte>{m->user} : std::span<const std::byte>{};
  }
  /// The rows of request `request` (requests()), a view into the payload (no copy); entry_view::rows_of's rules:
  /// logic_error for an entry captured whole, a request the forward does not name, or rows past the entry's;
  /// what bytes() and meta() throw.
  [[nodiscard]] std::span<const std::byte> rows_of(std::uint64_t request) const;

  /// The payload (read-only mapping). Throws as entry_view::bytes() for an entry without bytes, logic_error
  /// after release().
  [[nodiscard]] std::span<const std::byte> bytes() const;
  /// The stream's hook schema as this entry was read (shm_reader::schema(); null for a default-constructed entry).
  [[nodiscard]] const std::shared_ptr<const d2h::hook_schema>& schema() const noexcept { return schema_; }
  /// The schema's hook of this entry, or null (undeclared: bytes() only).
  [[nodiscard]] const d2h::hook_spec* spec() const noexcept { return schema_ ? schema_->find(hook()) : nullptr; }
  /// The payload as its hook's tensor (d2h::typed: [rows, *row_shape] of the hook's dtype; valid as bytes() is,
  /// and while schema() lives). Throws d2h::entry_shape_error for a hook the schema does not name or a size that
  /// does not fit it, and what bytes() throws.
  [[nodiscard]] d2h::typed_view typed() const;
  /// Gives the entry back to the producer (once every entry before it in the stream is given back too).
  void release() noexcept;

 private:
  friend class detail::shm_reader_impl;
  std::shared_ptr<detail::shm_reader_impl> r_;
  std::shared_ptr<const d2h::hook_schema> schema_;
  std::shared_ptr<const d2h::forward_meta> meta_;        // attribution_record: the parsed record
  std::shared_ptr<const std::string> overflow_stream_;   // attribution_overflow: the stream's name (the error's)
  std::uint64_t record_capacity_{0};                     // attribution_overflow: the record region's bytes
  detail::shm::descriptor d_{};
  const std::byte* data_{nullptr};
};

/// What a reader saw (a snapshot).
struct shm_reader_stats {
  std::uint64_t entries_read{0};
  std::uint64_t bytes_read{0};
  std::uint64_t entries_released{0};
  std::uint64_t held{0};            ///< read, not released
  std::uint64_t published{0};       ///< the stream's head now
  std::uint64_t session{0};         ///< this reader's session number in the stream
  std::uint64_t start_index{0};     ///< the stream index this reader started at
  std::uint64_t generation{0};      ///< the segment's generation (a new producer of the same name: another)
  std::uint64_t producer_pid{0};
};

/// The reader side (move-only handle). One per stream at a time.
class shm_reader {
 public:
  explicit shm_reader(const std::string& name, std::chrono::milliseconds attach_timeout = std::chrono::seconds(5));
  shm_reader(shm_reader&&) noexcept = default;
  shm_reader& operator=(shm_reader&& o) noexcept;
  shm_reader(const shm_reader&) = delete;
  shm_reader& operator=(const shm_reader&) = delete;
  ~shm_reader();

  /// Up to `max` entries, in stream order: waits up to `timeout` for the first, then takes what else is
  /// published. Empty when none came in time, or the stream ended (ended()).
  [[nodiscard]] std::vector<shm_entry> poll(std::size_t max, std::chrono::microseconds timeout);
  /// The next entry, or none (timeout or end of stream).
  [[nodiscard]] std::optional<shm_entry> next(std::chrono::microseconds timeout);
  /// The producer closed the stream and every entry it published was read.
  [[nodiscard]] bool ended() const;
  /// The stream's hook schema (never null): empty until the producer published one (its config's at creation,
  /// or its channel's before the first entry: every entry poll() returns carries it); then fixed. Throws
  /// d2h::schema_error naming the stream for a corrupted schema region (so does poll()).
  [[nodiscard]] std::shared_ptr<const d2h::hook_schema> schema() const;
  [[nodiscard]] shm_reader_stats stats() const;
  /// Gives back what was released, frees the reader slot (a new reader may attach); idempotent. Entries read
  /// and not released are the next reader's (policy block) or dropped (drop); their bytes may be reused.
  void close() noexcept;
  [[nodiscard]] const std::string& name() const;

 private:
  [[nodiscard]] detail::shm_reader_impl& impl() const;
  std::shared_ptr<detail::shm_reader_impl> impl_;
};

}  // namespace ferry::sink
