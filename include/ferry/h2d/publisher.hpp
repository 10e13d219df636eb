// SPDX-License-Identifier: Apache-2.0
// ferry::h2d::publisher<B>: H2D publication of small per-forward metadata into fixed device addresses.
//
//   publisher<B> pub{b};
//   auto ids = pub.declare({.name = "input_ids", .groups = {"tokens"}, .unit = count_unit::elements,
//                           .element_size = 4, .capacity = 1024});
//   ...
//   pub.initialize(config{.slots = 2}, stream);          // binds storage, plans groups, picks backends
//   for each forward:
//     auto slot = pub.begin(step % 2);                   // waits until the slot's sources are reusable
//     { auto p = pub.producer("tokens"); fill(p.source<int>(ids)); p.set_count(ids, n); }
//     pub.publish("tokens", stream);                     // validate all, then one DMA + one scatter
//     slot.finish();                                     // records the slot's completion; never waits
//
// The class declares the public surface; the definitions are in detail/publisher.inl (its private
// helpers: detail/publisher_checks.inl), over
//   detail/plan.hpp      pure arena planning (layout, tiles, header, overlap checks)
//   detail/slots.hpp     slot / epoch state and the validation made against it
//   detail/storage.hpp   the storage allocated at initialize() (arenas, staging, destinations, tables)
//   detail/upload.hpp    the enqueue of one publication (direct, batch, scatter)
//   detail/calibrate.hpp the `automatic` backend choice
//   detail/guards.hpp    slot_guard and producer_guard
//   detail/source_check.hpp the debug check of sources written after publish() (config::debug_sources)
//   detail/env.hpp       FERRY_H2D_* environment variables
// See docs/design/h2d.md for the arena layout and the lifetime and failure rules.
#pragma once

#include <ferry/backend/concepts.hpp>
#include <ferry/backend/event.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/error.hpp>
#include <ferry/h2d/detail/guards.hpp>
#include <ferry/h2d/detail/plan.hpp>
#include <ferry/h2d/detail/slots.hpp>
#include <ferry/h2d/detail/source_check.hpp>
#include <ferry/h2d/detail/storage.hpp>
#include <ferry/h2d/detail/upload.hpp>
#include <ferry/h2d/types.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace ferry::testing {
struct h2d_access;  // test instrumentation (not installed): reads a publisher's state
}  // namespace ferry::testing

namespace ferry::h2d {

/// Publishes declared host buffers into fixed device destinations, one group (consumer boundary) at a
/// time, on one owner stream, with a configurable number of runner slots (pinned sources per slot).
/// Not copyable or movable: the guards it hands out point to it (through a shared control block, so a guard
/// that outlives the publisher is refused rather than dangling). Every fallible call throws
/// ferry::logic_error (misuse: naming the group and buffer, expected vs got), ferry::invalidated_error
/// (after a backend failure, until recover()) or the backend's ferry::backend_error (which invalidates).
template <ferry::backend::backend B>
class publisher {
  using stream_view = ferry::backend::stream_view<B>;
  using event = ferry::backend::event<B>;

 public:
  /// A publisher on backend instance `b`; nothing is allocated before initialize().
  explicit publisher(B b = B{}) : b_{b} {}
  publisher(const publisher&) = delete;
  publisher& operator=(const publisher&) = delete;
  publisher(publisher&&) = delete;  // guards hold a pointer to it
  publisher& operator=(publisher&&) = delete;

  /// Waits (best effort, never throws) until no DMA or kernel can still read the storage it frees.
  /// The owner stream must outlive the publisher.
  ~publisher();

  // ---- declaration ---------------------------------------------------------------------------------

  /// Declares a buffer (before initialize()): its name, groups, unit, capacity and optional bound device
  /// storage. Rejects an empty or duplicate name, no group, a zero capacity or element size, a row size
  /// that is not a multiple of the element size, and a stride without bound rows.
  [[nodiscard]] buffer_handle declare(buffer_spec spec);

  // ---- initialization ------------------------------------------------------------------------------

  /// Binds storage, rejects overlaps, plans each group and picks its backend once (FERRY_H2D_BACKEND and
  /// FERRY_H2D_SPECULATION are read here when `cfg` leaves them unset). `owner` is the stream every
  /// publication of this publisher runs on (the consumer stream); it must outlive the publisher.
  void initialize(const config& cfg, stream_view owner);

  // ---- per forward ---------------------------------------------------------------------------------

  /// Starts a forward epoch on `slot`: waits until the slot's previous uploads have read its sources.
  [[nodiscard]] slot_guard<B> begin(std::size_t slot);

  /// Late preparation (two-batch overlap): re-enters `slot`'s latest epoch. Earlier publications of the
  /// epoch stay published; finish() records completion again after the new uploads. Never waits.
  [[nodiscard]] slot_guard<B> resume(std::size_t slot);

  /// Records the active slot's completion after its uploads (on the owner stream); never waits.
  void finish();

  /// Opens the producer scope of `group` in the active slot and epoch (reentry is rejected).
  [[nodiscard]] producer_guard<B> producer(std::string_view group) { return producer(group_of(group)); }
  /// Opens the producer scope of group `g` in the active slot and epoch (reentry is rejected).
  [[nodiscard]] producer_guard<B> producer(group_handle g) { return open_producer(g, std::nullopt); }
  /// producer(group) that first checks the current slot: refused (logic_error naming the group, the expected
  /// and the active slot) unless `expected_slot` is the active one (the check of @h2d_producer(..., slot=)).
  [[nodiscard]] producer_guard<B> producer(std::string_view group, std::size_t expected_slot)
  {
    return open_producer(group_of(group), expected_slot);
  }
  /// producer(g, expected_slot) by handle.
  [[nodiscard]] producer_guard<B> producer(group_handle g, std::size_t expected_slot)
  {
    return open_producer(g, expected_slot);
  }

  /// Sets `buf`'s count (in its unit, semantic padding included) for the active epoch. Zero is an explicit
  /// empty publication.
  void set_count(buffer_handle buf, std::size_t count);

  /// Validates everything (all-or-nothing, before any work is enqueued), then uploads the group's published
  /// prefixes into their fixed device addresses on `stream` (the owner stream).
  void publish(std::string_view group, stream_view stream) { publish(group_of(group), stream); }
  /// publish() by handle.
  void publish(group_handle g, stream_view stream);

  /// A deliberate second publication of `group` in the active epoch: waits until the earlier upload has
  /// read the sources, then reopens the group for its producer. `reason` is mandatory.
  [[nodiscard]] producer_guard<B> rewrite(std::string_view group, std::string_view reason);

  // ---- graphs --------------------------------------------------------------------------------------

  /// Graph replay support. stage() validates and commits a publication like publish() but enqueues
  /// nothing: the upload is a node of a graph captured once with capture_upload() for the same slot.
  void stage(std::string_view group) { stage(group_of(group)); }
  /// stage() by handle.
  void stage(group_handle g);

  /// Enqueues `group`'s upload for `slot` into the capture running on `stream`. packed: one DMA of the
  /// whole arena + the scatter; zerocopy: the scatter; direct: copies of the counts set in the active epoch
  /// (the graph is valid for those counts only). batch is not capturable; auto captures its best capturable.
  void capture_upload(std::string_view group, std::size_t slot, stream_view stream);

  // ---- failure and recovery ------------------------------------------------------------------------

  /// True after a backend failure, until recover().
  [[nodiscard]] bool invalidated() const noexcept { return invalid_; }
  /// The failed step and backend call (empty when not invalidated).
  [[nodiscard]] const std::string& invalidation_reason() const noexcept { return invalid_reason_; }

  /// After an enqueue failure: drains the owner stream and every slot (the caller's consumer drain), then
  /// accepts publications again. Storage was retained and stays bound.
  void recover();

  // ---- introspection -------------------------------------------------------------------------------

  /// The handle of the group named `name` (throws for an unknown name).
  [[nodiscard]] group_handle group_of(std::string_view name) const { return decl_.group_of(name); }
  /// What initialize() chose for `group`.
  [[nodiscard]] group_info info(std::string_view group) const;
  /// The backend requested by config::backend or FERRY_H2D_BACKEND (default packed).
  [[nodiscard]] upload_backend requested_backend() const noexcept { return requested_; }
  /// Whether the `batch` backend is one runtime call here (cudaMemcpyBatchAsync) rather than per-member copies.
  [[nodiscard]] static constexpr bool batch_native() noexcept { return B::batch_native(); }
  /// The fixed device destination of `buf` (ferry-allocated or bound).
  [[nodiscard]] void* device_pointer(buffer_handle buf) const
  {
    (void)decl_.buffer(buf);
    return store_.dst.empty() ? decl_.buffers[buf.value].spec.device_ptr : store_.dst[buf.value];
  }
  /// `buf`'s capacity in bytes.
  [[nodiscard]] std::size_t capacity_bytes(buffer_handle buf) const { return decl_.buffer(buf).cap_bytes; }
  /// The number of runner slots (0 before initialize()).
  [[nodiscard]] std::size_t slot_count() const noexcept { return slots_.size(); }
  /// The active slot, or -1.
  [[nodiscard]] int active_slot() const noexcept { return slots_.active(); }
  /// The reason given to the latest rewrite().
  [[nodiscard]] const std::string& last_rewrite_reason() const noexcept { return last_reason_; }
  /// Whether the debug check of published sources runs (config::debug_sources, FERRY_H2D_DEBUG_SOURCES).
  [[nodiscard]] bool debug_sources() const noexcept { return sources_.enabled(); }

 private:
  friend class slot_guard<B>;
  friend class producer_guard<B>;
  friend struct ::ferry::testing::h2d_access;

  // ---- used by the guards --------------------------------------------------------------------------
  [[nodiscard]] bool is_active(std::size_t slot, std::uint64_t epoch) const noexcept
  {
    return !invalid_ && slots_.is_active(slot, epoch);
  }
  void close_producer(group_handle g) noexcept { slots_.close_producer(decl_, g); }
  void check_producer(group_handle g, buffer_handle buf, std::size_t slot, std::uint64_t epoch) const;
  template <class T>
  [[nodiscard]] std::span<T> producer_source(group_handle g, buffer_handle buf, std::size_t slot,
                                             std::uint64_t epoch) const;

  [[nodiscard]] producer_guard<B> open_producer(group_handle g, std::optional<std::size_t> expected_slot);
  /// Debug mode: copies the published prefixes of `g`'s members in the active slot (after publish / stage).
  void record_sources(group_handle g);

  // ---- checks and failure handling -----------------------------------------------------------------
  void check_usable(std::string_view what) const;
  void check_owner_thread(std::string_view who) const;
  /// Runs backend work; a backend failure invalidates the owner (storage is retained) and propagates.
  template <class F>
  void guarded(std::string_view what, F&& f, std::string_view group = {});
  /// The publisher-level rules of a publication (usable, thread, stream, device, active slot, and for an
  /// eager one not capturing), then the slot-level ones (detail::slot_table::check_members).
  detail::slot_book& validate_publication(group_handle g, stream_view stream, bool enqueue);
  /// stage(): a copy captured as a direct upload bakes its count into the graph (it reads no count at
  /// replay), so the staged counts of those buffers must be the baked ones (logic_error naming them).
  void check_baked_counts(group_handle g, const detail::slot_book& s) const;
  [[nodiscard]] detail::uploader<B> uploader() { return {b_, decl_, plan_, store_, cfg_}; }

  B b_;
  config cfg_{};
  upload_backend requested_{upload_backend::packed};
  bool initialized_{false};
  detail::declarations decl_;  ///< buffers and groups as declared
  detail::arena_plan plan_;    ///< the arena layout (fixed at initialize)
  detail::storage<B> store_;   ///< destinations, per-slot arenas and events, per-group tables
  detail::slot_table slots_;   ///< epochs, counts, publication marks, open producers
  detail::source_check sources_;  ///< debug mode: copies of the published sources
  /// (group, slot) -> (buffer, count) of each copy its last capture_upload captured as a direct copy.
  std::map<std::pair<std::uint32_t, std::size_t>, std::vector<std::pair<std::uint32_t, std::size_t>>> baked_;
  std::optional<stream_view> owner_;
  std::optional<event> acquire_;  ///< rewrite(): the earlier upload has read the sources
  std::thread::id owner_thread_{};
  bool invalid_{false};
  std::string invalid_reason_;
  std::string last_reason_;
  /// Shared with every guard; cleared by the destructor (one allocation per publisher, one reference count
  /// per guard).
  std::shared_ptr<detail::lifeline<B>> life_{std::make_shared<detail::lifeline<B>>(detail::lifeline<B>{this})};
};

}  // namespace ferry::h2d

#include <ferry/h2d/detail/publisher.inl>
#include <ferry/h2d/detail/publisher_checks.inl>
