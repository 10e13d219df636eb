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
// See docs/design/h2d.md for the arena layout and the lifetime and failure rules.
#pragma once

#include <ferry/backend/buffer.hpp>
#include <ferry/backend/concepts.hpp>
#include <ferry/backend/event.hpp>
#include <ferry/backend/graph.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/error.hpp>
#include <ferry/h2d/detail/kernels.hpp>
#include <ferry/h2d/detail/scatter_params.hpp>
#include <ferry/h2d/types.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry::h2d {

template <ferry::backend::backend B>
class publisher;

/// Everything a validation failure must leave unchanged (tests compare snapshots).
struct state_snapshot {
  int active_slot{-1};
  std::uint64_t epoch{0};
  bool invalidated{false};
  std::vector<std::uint64_t> words;  ///< per slot: epochs, counts, publication marks, arena headers
  friend bool operator==(const state_snapshot&, const state_snapshot&) = default;
};

/// RAII handle of one forward epoch of one slot (from publisher::begin / resume). finish() records the
/// slot's completion event; the destructor finishes an unfinished epoch (never throws).
template <ferry::backend::backend B>
class [[nodiscard]] slot_guard {
 public:
  slot_guard(const slot_guard&) = delete;
  slot_guard& operator=(const slot_guard&) = delete;
  slot_guard(slot_guard&& o) noexcept
    : pub_{std::exchange(o.pub_, nullptr)}, slot_{o.slot_}, epoch_{o.epoch_}
  {
  }
  slot_guard& operator=(slot_guard&&) = delete;
  ~slot_guard()
  {
    if (pub_ != nullptr && pub_->is_active(slot_, epoch_)) {
      try {
        pub_->finish();
      } catch (...) {  // finish() invalidated the owner; destructors never throw
      }
    }
  }
  void finish()
  {
    FERRY_EXPECTS(pub_ != nullptr && pub_->is_active(slot_, epoch_), logic_error,
                  "h2d slot {}: finish() on an epoch ({}) that is not active", slot_, epoch_);
    pub_->finish();
  }
  [[nodiscard]] std::size_t slot() const noexcept { return slot_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

 private:
  friend class publisher<B>;
  slot_guard(publisher<B>* p, std::size_t slot, std::uint64_t epoch) : pub_{p}, slot_{slot}, epoch_{epoch} {}
  publisher<B>* pub_;
  std::size_t slot_;
  std::uint64_t epoch_;
};

/// RAII producer scope (the C++ form of @h2d_producer("group")): created only after the current slot and
/// epoch were checked and no member of the group was published in this epoch (also through a combined
/// group) nor is held by another producer. Gives the slot's pinned sources of the group's members.
template <ferry::backend::backend B>
class [[nodiscard]] producer_guard {
 public:
  producer_guard(const producer_guard&) = delete;
  producer_guard& operator=(const producer_guard&) = delete;
  producer_guard(producer_guard&& o) noexcept
    : pub_{std::exchange(o.pub_, nullptr)}, group_{o.group_}, slot_{o.slot_}, epoch_{o.epoch_}
  {
  }
  producer_guard& operator=(producer_guard&&) = delete;
  ~producer_guard()
  {
    if (pub_ != nullptr) { pub_->close_producer(group_); }
  }

  /// The current slot's pinned source of `buf` (capacity bytes, viewed as T).
  template <class T>
  [[nodiscard]] std::span<T> source(buffer_handle buf) const
  {
    static_assert(std::is_trivially_copyable_v<T>);
    return pub_->template producer_source<T>(group_, buf, slot_, epoch_);
  }
  void set_count(buffer_handle buf, std::size_t count) const
  {
    pub_->check_producer(group_, buf, slot_, epoch_);
    pub_->set_count(buf, count);
  }
  [[nodiscard]] group_handle group() const noexcept { return group_; }

 private:
  friend class publisher<B>;
  producer_guard(publisher<B>* p, group_handle g, std::size_t slot, std::uint64_t epoch)
    : pub_{p}, group_{g}, slot_{slot}, epoch_{epoch}
  {
  }
  publisher<B>* pub_;
  group_handle group_;
  std::size_t slot_;
  std::uint64_t epoch_;
};

template <ferry::backend::backend B>
class publisher {
  using stream_view = ferry::backend::stream_view<B>;
  template <ferry::backend::memory_kind K>
  using buffer = ferry::backend::buffer<B, K>;
  using device_buffer = ferry::backend::device_buffer<B>;
  using pinned_buffer = ferry::backend::pinned_buffer<B>;
  using mapped_buffer = ferry::backend::mapped_buffer<B>;
  using event = ferry::backend::event<B>;
  static constexpr std::uint32_t none = 0xFFFFFFFFu;
  static constexpr std::size_t align = 16;
  [[nodiscard]] static constexpr std::size_t align_up(std::size_t n) noexcept { return (n + align - 1) / align * align; }

 public:
  explicit publisher(B b = B{}) : b_{b} {}
  publisher(const publisher&) = delete;
  publisher& operator=(const publisher&) = delete;
  publisher(publisher&&) = delete;  // guards hold a pointer to it
  publisher& operator=(publisher&&) = delete;

  /// Waits (best effort, never throws) until no DMA or kernel can still read the storage it frees.
  /// The owner stream must outlive the publisher.
  ~publisher()
  {
    if (owner_) {
      try {
        b_.stream_synchronize(owner_->handle());
      } catch (...) {
      }
    }
    for (auto& s : slots_) {
      if (s.recorded) {
        try {
          s.done->synchronize();
        } catch (...) {
        }
      }
    }
  }

  // ---- declaration ---------------------------------------------------------------------------------

  [[nodiscard]] buffer_handle declare(buffer_spec spec)
  {
    FERRY_EXPECTS(!initialized_, logic_error, "h2d buffer '{}': declare() after initialize()", spec.name);
    FERRY_EXPECTS(!spec.name.empty(), logic_error, "h2d: a buffer needs a name");
    for (const auto& b : bufs_) {
      FERRY_EXPECTS(b.spec.name != spec.name, logic_error, "h2d buffer '{}': declared twice", spec.name);
    }
    FERRY_EXPECTS(!spec.groups.empty(), logic_error, "h2d buffer '{}': expected at least one group, got none",
                  spec.name);
    FERRY_EXPECTS(spec.capacity > 0, logic_error, "h2d buffer '{}': expected a capacity > 0, got 0", spec.name);
    if (spec.unit == count_unit::rows && spec.row_size == 0) { spec.row_size = spec.element_size; }
    FERRY_EXPECTS(spec.element_size > 0, logic_error, "h2d buffer '{}': element size must be > 0", spec.name);
    FERRY_EXPECTS(spec.unit != count_unit::rows || spec.row_size % spec.element_size == 0, logic_error,
                  "h2d buffer '{}': row size {} is not a multiple of the element size {}", spec.name, spec.row_size,
                  spec.element_size);
    if (spec.stride == spec.row_size) { spec.stride = 0; }
    if (spec.stride != 0) {
      FERRY_EXPECTS(spec.unit == count_unit::rows && spec.device_ptr != nullptr, logic_error,
                    "h2d buffer '{}': a stride needs unit rows and a bound device pointer", spec.name);
      FERRY_EXPECTS(spec.stride > spec.row_size, logic_error,
                    "h2d buffer '{}': stride {} is smaller than the row size {}", spec.name, spec.stride,
                    spec.row_size);
    }
    buf_rt r;
    r.unit_bytes = spec.unit == count_unit::rows       ? spec.row_size
                   : spec.unit == count_unit::elements ? spec.element_size
                                                       : 1;
    r.cap_bytes = spec.capacity * r.unit_bytes;
    r.strided = spec.stride != 0;
    r.dst = spec.device_ptr;
    for (const auto& gname : spec.groups) {
      auto it = std::find_if(groups_.begin(), groups_.end(), [&](const group_rt& g) { return g.name == gname; });
      if (it == groups_.end()) {
        groups_.emplace_back();
        groups_.back().name = gname;
        it = groups_.end() - 1;
      }
      FERRY_EXPECTS(std::find(it->members.begin(), it->members.end(), static_cast<std::uint32_t>(bufs_.size())) ==
                      it->members.end(),
                    logic_error, "h2d buffer '{}': group '{}' listed twice", spec.name, gname);
      it->members.push_back(static_cast<std::uint32_t>(bufs_.size()));
      r.groups.push_back(static_cast<std::uint32_t>(it - groups_.begin()));
    }
    r.spec = std::move(spec);
    bufs_.push_back(std::move(r));
    return buffer_handle{static_cast<std::uint32_t>(bufs_.size() - 1)};
  }

  // ---- initialization ------------------------------------------------------------------------------

  /// Binds storage, rejects overlaps, plans each group and picks its backend once. `owner` is the stream
  /// every publication of this publisher runs on (the consumer stream); it must outlive the publisher.
  void initialize(const config& cfg, stream_view owner)
  {
    FERRY_EXPECTS(!initialized_, logic_error, "h2d publisher: initialize() called twice");
    FERRY_EXPECTS(cfg.slots >= 2, logic_error, "h2d publisher: expected >= 2 slots, got {}", cfg.slots);
    FERRY_EXPECTS(cfg.tile_bytes >= 16 && cfg.tile_bytes % 16 == 0, logic_error,
                  "h2d publisher: tile_bytes must be a multiple of 16, got {}", cfg.tile_bytes);
    FERRY_EXPECTS(cfg.threads_per_tile >= 32 && cfg.threads_per_tile <= 1024 && cfg.threads_per_tile % 32 == 0,
                  logic_error, "h2d publisher: threads_per_tile must be a multiple of 32 in [32, 1024], got {}",
                  cfg.threads_per_tile);
    FERRY_EXPECTS(cfg.speculation >= -1 && cfg.speculation <= 2, logic_error,
                  "h2d publisher: speculation must be -1, 0, 1 or 2, got {}", cfg.speculation);
    FERRY_EXPECTS(!bufs_.empty(), logic_error, "h2d publisher: initialize() with no declared buffer");
    cfg_ = cfg;
    if (cfg_.speculation < 0) {
      if (const char* env = std::getenv("FERRY_H2D_SPECULATION"); env != nullptr && *env != '\0') {
        const std::string_view v{env};
        FERRY_EXPECTS(v == "0" || v == "1" || v == "2", logic_error,
                      "h2d publisher: FERRY_H2D_SPECULATION='{}' is not 0, 1 or 2", env);
        cfg_.speculation = v[0] - '0';
      }
    }
    if (cfg.backend) {
      requested_ = *cfg.backend;
    } else if (const char* env = std::getenv("FERRY_H2D_BACKEND"); env != nullptr && *env != '\0') {
      const auto k = parse_upload_backend(env);
      FERRY_EXPECTS(k.has_value(), logic_error,
                    "h2d publisher: FERRY_H2D_BACKEND='{}' is not one of packed, direct, batch, zerocopy, auto", env);
      requested_ = *k;
    } else {
      requested_ = upload_backend::packed;
    }
    FERRY_EXPECTS(b_.current_device() == cfg.device, logic_error,
                  "h2d publisher: initialize() on device {} but config names device {}", b_.current_device().value,
                  cfg.device.value);
    owner_.emplace(owner);
    owner_thread_ = std::this_thread::get_id();
    const auto attrs = b_.attributes(cfg.device);
    sm_count_ = std::max(1, attrs.sm_count);
    // Load the scatter now: a lazy module load at its first launch would wait for kernels already running.
    b_.preload(detail::scatter_kernel(typename B::tag{}));
    plan_groups();
    bind_destinations();
    check_overlaps();
    allocate_slots();
    build_tables();
    producer_open_.assign(bufs_.size(), none);
    if (requested_ == upload_backend::automatic) { calibrate(); }
    initialized_ = true;
  }

  // ---- per forward ---------------------------------------------------------------------------------

  /// Starts a forward epoch on `slot`: waits until the slot's previous uploads have read its sources.
  [[nodiscard]] slot_guard<B> begin(std::size_t slot)
  {
    check_usable("begin");
    FERRY_EXPECTS(slot < slots_.size(), logic_error, "h2d publisher: slot {} out of range (have {})", slot,
                  slots_.size());
    FERRY_EXPECTS(active_ < 0, logic_error, "h2d publisher: begin({}) while slot {} is active; finish() it first",
                  slot, active_);
    auto& s = slots_[slot];
    if (s.recorded) {
      guarded("begin: source reuse wait", [&] { s.done->synchronize(); });
    }
    s.epoch = ++epoch_counter_;
    s.began = true;
    active_ = static_cast<int>(slot);
    return slot_guard<B>{this, slot, s.epoch};
  }

  /// Late preparation (two-batch overlap): re-enters `slot`'s latest epoch. Earlier publications of the
  /// epoch stay published; finish() records completion again after the new uploads.
  [[nodiscard]] slot_guard<B> resume(std::size_t slot)
  {
    check_usable("resume");
    FERRY_EXPECTS(slot < slots_.size(), logic_error, "h2d publisher: slot {} out of range (have {})", slot,
                  slots_.size());
    FERRY_EXPECTS(active_ < 0, logic_error, "h2d publisher: resume({}) while slot {} is active", slot, active_);
    FERRY_EXPECTS(slots_[slot].began, logic_error, "h2d publisher: resume({}) of a slot that never began", slot);
    active_ = static_cast<int>(slot);
    return slot_guard<B>{this, slot, slots_[slot].epoch};
  }

  /// Records the active slot's completion after its uploads (on the owner stream); never waits.
  void finish()
  {
    check_usable("finish");
    FERRY_EXPECTS(active_ >= 0, logic_error, "h2d publisher: finish() with no active slot");
    auto& s = slots_[static_cast<std::size_t>(active_)];
    guarded("finish: completion record", [&] { s.done->record(*owner_); });
    s.recorded = true;
    active_ = -1;
  }

  /// Opens the producer scope of `group` in the active slot and epoch (reentry is rejected).
  [[nodiscard]] producer_guard<B> producer(std::string_view group) { return producer(group_of(group)); }
  [[nodiscard]] producer_guard<B> producer(group_handle g)
  {
    check_usable("producer");
    const auto& gr = group_at(g);
    FERRY_EXPECTS(active_ >= 0, logic_error, "h2d producer '{}': no active slot (call begin() first)", gr.name);
    auto& s = slots_[static_cast<std::size_t>(active_)];
    for (auto m : gr.members) {
      FERRY_EXPECTS(s.published_epoch[m] != s.epoch, logic_error,
                    "h2d producer '{}': reentry rejected: buffer '{}' was already published in epoch {} by group "
                    "'{}' (a deliberate second publication uses rewrite(group, reason))",
                    gr.name, bufs_[m].spec.name, s.epoch, groups_[s.published_by[m]].name);
      FERRY_EXPECTS(producer_open_[m] == none, logic_error,
                    "h2d producer '{}': reentry rejected: buffer '{}' is held by the open producer of group '{}'",
                    gr.name, bufs_[m].spec.name,
                    producer_open_[m] == none ? std::string_view{} : std::string_view{groups_[producer_open_[m]].name});
    }
    for (auto m : gr.members) { producer_open_[m] = g.value; }
    return producer_guard<B>{this, g, static_cast<std::size_t>(active_), s.epoch};
  }

  /// Sets `buf`'s count (in its unit, semantic padding included) for the active epoch. Zero is an explicit
  /// empty publication.
  void set_count(buffer_handle buf, std::size_t count)
  {
    check_usable("set_count");
    const auto& r = buf_at(buf);
    FERRY_EXPECTS(active_ >= 0, logic_error, "h2d buffer '{}': set_count() with no active slot", r.spec.name);
    FERRY_EXPECTS(count <= r.spec.capacity, logic_error, "h2d group '{}': buffer '{}' count {} exceeds capacity {}",
                  groups_[r.groups.front()].name, r.spec.name, count, r.spec.capacity);
    auto& s = slots_[static_cast<std::size_t>(active_)];
    FERRY_EXPECTS(s.published_epoch[buf.value] != s.epoch, logic_error,
                  "h2d buffer '{}': set_count() after it was published in epoch {} (rewrite(group, reason) first)",
                  r.spec.name, s.epoch);
    s.counts[buf.value] = count;
    s.count_epoch[buf.value] = s.epoch;
  }

  /// Validates everything (all-or-nothing, before any work is enqueued), then uploads the group's published
  /// prefixes into their fixed device addresses on `stream` (the owner stream).
  void publish(std::string_view group, stream_view stream) { publish(group_of(group), stream); }
  void publish(group_handle g, stream_view stream)
  {
    auto& s = validate_publication(g, stream, true);
    commit_and_enqueue(g, s, stream);
  }

  /// A deliberate second publication of `group` in the active epoch: waits until the earlier upload has
  /// read the sources, then reopens the group for its producer. `reason` is mandatory.
  [[nodiscard]] producer_guard<B> rewrite(std::string_view group, std::string_view reason)
  {
    check_usable("rewrite");
    const group_handle g = group_of(group);
    const auto& gr = group_at(g);
    FERRY_EXPECTS(!reason.empty(), logic_error, "h2d group '{}': a second publication must supply a reason", gr.name);
    FERRY_EXPECTS(active_ >= 0, logic_error, "h2d group '{}': rewrite() with no active slot", gr.name);
    check_owner_thread(gr.name);
    auto& s = slots_[static_cast<std::size_t>(active_)];
    for (auto m : gr.members) {
      FERRY_EXPECTS(producer_open_[m] == none, logic_error,
                    "h2d group '{}': rewrite() while buffer '{}' is held by an open producer", gr.name,
                    bufs_[m].spec.name);
    }
    guarded("rewrite: source acquire", [&] {
      acquire_->record(*owner_);
      acquire_->synchronize();
    });
    for (auto m : gr.members) {
      if (s.published_epoch[m] == s.epoch) { s.published_epoch[m] = 0; }
    }
    last_reason_.assign(reason);
    return producer(g);
  }

  // ---- graphs --------------------------------------------------------------------------------------

  /// Graph replay support. stage() validates and commits a publication like publish() but enqueues
  /// nothing: the upload is a node of a graph captured once with capture_upload() for the same slot.
  void stage(std::string_view group) { stage(group_of(group)); }
  void stage(group_handle g)
  {
    auto& s = validate_publication(g, *owner_, false);
    const auto& gr = groups_[g.value];
    for (auto m : gr.members) {
      s.published_epoch[m] = s.epoch;
      s.published_by[m] = g.value;
    }
    if (gr.arena_bytes > 0) { write_header(gr, s); }
  }

  /// Enqueues `group`'s upload for `slot` into the capture running on `stream`. packed: one DMA of the
  /// whole arena + the scatter; zerocopy: the scatter; direct: copies of the counts set in the active epoch
  /// (the graph is valid for those counts only). batch is not capturable; auto captures its best capturable.
  void capture_upload(std::string_view group, std::size_t slot, stream_view stream)
  {
    check_usable("capture_upload");
    const group_handle g = group_of(group);
    const auto& gr = groups_[g.value];
    FERRY_EXPECTS(slot < slots_.size(), logic_error, "h2d group '{}': slot {} out of range", gr.name, slot);
    FERRY_EXPECTS(stream == *owner_, logic_error, "h2d group '{}': capture on a stream other than the owner stream",
                  gr.name);
    bool capturing = false;
    guarded("capture_upload: capture query", [&] { capturing = b_.stream_is_capturing(stream.handle()); });
    FERRY_EXPECTS(capturing, logic_error, "h2d group '{}': capture_upload() outside stream capture", gr.name);
    const upload_backend k = gr.arena_bytes > 0 ? gr.graph_backend : upload_backend::direct;
    FERRY_EXPECTS(k != upload_backend::batch, logic_error,
                  "h2d group '{}': the batch backend (cudaMemcpyBatchAsync) is not graph-capturable", gr.name);
    auto& s = slots_[slot];
    if (k == upload_backend::direct) {
      FERRY_EXPECTS(active_ == static_cast<int>(slot), logic_error,
                    "h2d group '{}': a direct capture bakes the counts of the active epoch of slot {}", gr.name, slot);
      for (auto m : gr.members) {
        FERRY_EXPECTS(s.count_epoch[m] == s.epoch, logic_error, "h2d group '{}': buffer '{}' has no count to capture",
                      gr.name, bufs_[m].spec.name);
      }
    }
    guarded("capture_upload: enqueue", [&] {
      if (k == upload_backend::direct) {
        for (auto m : gr.members) { copy_direct(m, s, s.counts[m] * bufs_[m].unit_bytes, stream); }
      } else {
        enqueue_scatter(gr, s, k, gr.arena_bytes, stream, false);
        for (auto m : gr.direct_members) { copy_direct(m, s, s.counts[m] * bufs_[m].unit_bytes, stream); }
      }
    });
  }

  // ---- failure and recovery ------------------------------------------------------------------------

  [[nodiscard]] bool invalidated() const noexcept { return invalid_; }
  [[nodiscard]] const std::string& invalidation_reason() const noexcept { return invalid_reason_; }

  /// After an enqueue failure: drains the owner stream and every slot (the caller's consumer drain), then
  /// accepts publications again. Storage was retained and stays bound.
  void recover()
  {
    FERRY_EXPECTS(initialized_, logic_error, "h2d publisher: recover() before initialize()");
    FERRY_EXPECTS(invalid_, logic_error, "h2d publisher: recover() on a publisher that is not invalidated");
    check_owner_thread("recover");
    b_.stream_synchronize(owner_->handle());
    for (auto& s : slots_) {
      if (s.recorded) { s.done->synchronize(); }
    }
    invalid_ = false;
    invalid_reason_.clear();
    active_ = -1;
    std::fill(producer_open_.begin(), producer_open_.end(), none);
  }

  // ---- introspection -------------------------------------------------------------------------------

  [[nodiscard]] group_handle group_of(std::string_view name) const
  {
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      if (groups_[i].name == name) { return group_handle{static_cast<std::uint32_t>(i)}; }
    }
    FERRY_FAIL(logic_error, "h2d: unknown group '{}'", name);
  }
  [[nodiscard]] group_info info(std::string_view group) const
  {
    const auto& g = groups_[group_of(group).value];
    group_info i;
    i.name = g.name;
    i.backend = g.arena_bytes > 0 ? g.backend : upload_backend::direct;
    i.covered = g.covered;
    i.batch_native = batch_native();
    i.arena_bytes = g.arena_bytes;
    i.tiles = g.tile_count;
    for (auto m : g.members) { i.members.push_back(bufs_[m].spec.name); }
    i.calibration_us = g.calibration_us;
    i.calibration_graph_us = g.calibration_graph_us;
    i.graph_backend = g.arena_bytes > 0 ? g.graph_backend : upload_backend::direct;
    return i;
  }
  [[nodiscard]] upload_backend requested_backend() const noexcept { return requested_; }
  /// Whether the `batch` backend is one runtime call here (cudaMemcpyBatchAsync) rather than per-member copies.
  [[nodiscard]] static constexpr bool batch_native() noexcept { return B::batch_native(); }
  /// The fixed device destination of `buf` (ferry-allocated or bound).
  [[nodiscard]] void* device_pointer(buffer_handle buf) const { return buf_at(buf).dst; }
  [[nodiscard]] std::size_t capacity_bytes(buffer_handle buf) const { return buf_at(buf).cap_bytes; }
  [[nodiscard]] std::size_t slot_count() const noexcept { return slots_.size(); }
  [[nodiscard]] int active_slot() const noexcept { return active_; }
  [[nodiscard]] const std::string& last_rewrite_reason() const noexcept { return last_reason_; }
  /// Addresses of all storage a DMA may read (tests check it is retained across failures).
  [[nodiscard]] std::vector<const void*> storage() const
  {
    std::vector<const void*> v;
    for (const auto& s : slots_) {
      for (const auto& a : s.arenas) { v.push_back(a.data()); }
      for (const auto& a : s.staging) { v.push_back(a.data()); }
      v.push_back(s.standalone.data());
    }
    for (const auto& r : bufs_) { v.push_back(r.dst); }
    return v;
  }
  [[nodiscard]] state_snapshot snapshot() const
  {
    state_snapshot st;
    st.active_slot = active_;
    st.epoch = epoch_counter_;
    st.invalidated = invalid_;
    for (std::size_t si = 0; si < slots_.size(); ++si) {
      const auto& s = slots_[si];
      st.words.push_back(s.epoch);
      st.words.push_back(s.recorded ? 1 : 0);
      for (std::size_t m = 0; m < bufs_.size(); ++m) {
        st.words.push_back(s.counts[m]);
        st.words.push_back(s.count_epoch[m]);
        st.words.push_back(s.published_epoch[m]);
      }
      for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
        if (groups_[gi].arena_bytes == 0) { continue; }
        const auto* h = s.arenas[gi].template as<const std::uint64_t>();
        st.words.insert(st.words.end(), h, h + 2 * groups_[gi].packed_members.size());
      }
    }
    for (auto p : producer_open_) { st.words.push_back(p); }
    return st;
  }

  // ---- used by the guards --------------------------------------------------------------------------

  [[nodiscard]] bool is_active(std::size_t slot, std::uint64_t epoch) const noexcept
  {
    return !invalid_ && active_ == static_cast<int>(slot) && slots_[slot].epoch == epoch;
  }
  void close_producer(group_handle g) noexcept
  {
    if (g.value >= groups_.size()) { return; }
    for (auto m : groups_[g.value].members) {
      if (producer_open_[m] == g.value) { producer_open_[m] = none; }
    }
  }
  void check_producer(group_handle g, buffer_handle buf, std::size_t slot, std::uint64_t epoch) const
  {
    check_usable("producer");
    const auto& gr = group_at(g);
    const auto& r = buf_at(buf);
    FERRY_EXPECTS(is_active(slot, epoch), logic_error,
                  "h2d producer '{}': stale guard (slot {} epoch {}; active slot {} epoch {})", gr.name, slot, epoch,
                  active_, active_ >= 0 ? slots_[static_cast<std::size_t>(active_)].epoch : 0);
    FERRY_EXPECTS(std::find(gr.members.begin(), gr.members.end(), buf.value) != gr.members.end(), logic_error,
                  "h2d producer '{}': buffer '{}' is not a member of the group", gr.name, r.spec.name);
    FERRY_EXPECTS(producer_open_[buf.value] == g.value, logic_error,
                  "h2d producer '{}': buffer '{}' is not held by this producer", gr.name, r.spec.name);
  }
  template <class T>
  [[nodiscard]] std::span<T> producer_source(group_handle g, buffer_handle buf, std::size_t slot,
                                             std::uint64_t epoch) const
  {
    check_producer(g, buf, slot, epoch);
    const auto& r = bufs_[buf.value];
    FERRY_EXPECTS(r.cap_bytes % sizeof(T) == 0, logic_error,
                  "h2d buffer '{}': capacity {} bytes is not a multiple of sizeof(T) {}", r.spec.name, r.cap_bytes,
                  sizeof(T));
    return {reinterpret_cast<T*>(source_ptr(buf.value, slots_[slot])), r.cap_bytes / sizeof(T)};
  }

 private:
  struct buf_rt {
    buffer_spec spec;
    std::size_t unit_bytes{1};
    std::size_t cap_bytes{0};
    bool strided{false};
    void* dst{nullptr};
    std::vector<std::uint32_t> groups;
    std::uint32_t home{none};        ///< group whose arena holds this buffer's source
    std::size_t arena_offset{0};     ///< payload offset inside the home arena
    std::size_t standalone_offset{0};
  };
  struct group_rt {
    std::string name;
    std::vector<std::uint32_t> members;
    std::vector<std::uint32_t> packed_members;  ///< in arena order (header index)
    std::vector<std::uint32_t> direct_members;  ///< strided members of a packed group
    upload_backend backend{upload_backend::direct};
    upload_backend graph_backend{upload_backend::direct};
    bool covered{false};
    std::size_t header_bytes{0};
    std::size_t arena_bytes{0};  ///< 0: no arena (direct copies)
    std::uint32_t tile_count{0};
    std::uint32_t grid{1};
    std::optional<device_buffer> tile_table;
    std::vector<double> calibration_us;
    std::vector<double> calibration_graph_us;
    // reusable scratch for the hot path (no allocation per publication)
    std::vector<void*> batch_dst;
    std::vector<const void*> batch_src;
    std::vector<std::size_t> batch_size;
  };
  struct slot_rt {
    std::vector<mapped_buffer> arenas;   ///< per group (empty when the group has no arena)
    std::vector<device_buffer> staging;  ///< per group: device copy of the arena (packed)
    pinned_buffer standalone;            ///< sources of buffers homed in no arena
    std::optional<event> done;
    std::uint64_t epoch{0};
    bool began{false};
    bool recorded{false};
    std::vector<std::size_t> counts;
    std::vector<std::uint64_t> count_epoch;
    std::vector<std::uint64_t> published_epoch;
    std::vector<std::uint32_t> published_by;
  };

  // ---- checks --------------------------------------------------------------------------------------

  void check_usable(std::string_view what) const
  {
    FERRY_EXPECTS(initialized_, logic_error, "h2d publisher: {}() before initialize()", what);
    if (invalid_) [[unlikely]] {
      FERRY_FAIL(invalidated_error,
                 "h2d publisher: {}() refused: invalidated by an earlier failure ({}); drain the consumer stream and "
                 "call recover()",
                 what, invalid_reason_);
    }
  }
  void check_owner_thread(std::string_view who) const
  {
    FERRY_EXPECTS(std::this_thread::get_id() == owner_thread_, logic_error,
                  "h2d group '{}': called from a thread that is not the owner thread", who);
  }
  [[nodiscard]] const group_rt& group_at(group_handle g) const
  {
    FERRY_EXPECTS(g.value < groups_.size(), logic_error, "h2d: invalid group handle {}", g.value);
    return groups_[g.value];
  }
  [[nodiscard]] const buf_rt& buf_at(buffer_handle b) const
  {
    FERRY_EXPECTS(b.value < bufs_.size(), logic_error, "h2d: invalid buffer handle {}", b.value);
    return bufs_[b.value];
  }

  /// Runs backend work; a backend failure invalidates the owner (storage is retained) and propagates.
  template <class F>
  void guarded(std::string_view what, F&& f, std::string_view group = {})
  {
    try {
      f();
    } catch (const ferry::backend_error& e) {
      invalid_ = true;
      invalid_reason_ = group.empty() ? ferry::detail::format("{}: {}", what, e.what())
                                      : ferry::detail::format("{} '{}': {}", what, group, e.what());
      active_ = -1;
      throw;
    }
  }

  slot_rt& validate_publication(group_handle g, stream_view stream, bool enqueue)
  {
    check_usable("publish");
    const auto& gr = group_at(g);
    check_owner_thread(gr.name);
    FERRY_EXPECTS(stream == *owner_, logic_error, "h2d group '{}': publication on a stream other than the owner stream",
                  gr.name);
    const auto dev = b_.current_device();
    FERRY_EXPECTS(dev == cfg_.device, logic_error, "h2d group '{}': expected device {}, current device is {}", gr.name,
                  cfg_.device.value, dev.value);
    FERRY_EXPECTS(active_ >= 0, logic_error, "h2d group '{}': publication with no active slot (call begin() first)",
                  gr.name);
    if (enqueue) {
      bool capturing = false;
      guarded("publish: capture query", [&] { capturing = b_.stream_is_capturing(stream.handle()); });
      FERRY_EXPECTS(!capturing, logic_error,
                    "h2d group '{}': publication during stream capture (publish before capture/replay; graphs use "
                    "stage() + capture_upload())",
                    gr.name);
    }
    auto& s = slots_[static_cast<std::size_t>(active_)];
    for (auto m : gr.members) {
      const auto& r = bufs_[m];
      FERRY_EXPECTS(s.count_epoch[m] == s.epoch, logic_error,
                    "h2d group '{}': buffer '{}' has no count in epoch {} (every member needs one; 0 publishes an "
                    "explicit empty range)",
                    gr.name, r.spec.name, s.epoch);
      FERRY_EXPECTS(s.counts[m] <= r.spec.capacity, logic_error, "h2d group '{}': buffer '{}' count {} exceeds capacity {}",
                    gr.name, r.spec.name, s.counts[m], r.spec.capacity);
      FERRY_EXPECTS(s.published_epoch[m] != s.epoch, logic_error,
                    "h2d group '{}': duplicate publication of buffer '{}' in epoch {} (first by group '{}'; a "
                    "deliberate second publication uses rewrite(group, reason))",
                    gr.name, r.spec.name, s.epoch, groups_[s.published_by[m]].name);
      FERRY_EXPECTS(producer_open_[m] == none || producer_open_[m] == g.value, logic_error,
                    "h2d group '{}': buffer '{}' is still held by the open producer of group '{}'", gr.name, r.spec.name,
                    producer_open_[m] == none ? std::string_view{} : std::string_view{groups_[producer_open_[m]].name});
    }
    return s;
  }

  // ---- enqueue -------------------------------------------------------------------------------------

  [[nodiscard]] unsigned char* source_ptr(std::uint32_t m, const slot_rt& s) const
  {
    const auto& r = bufs_[m];
    if (r.home != none) { return s.arenas[r.home].template as<unsigned char>() + r.arena_offset; }
    return s.standalone.template as<unsigned char>() + r.standalone_offset;
  }

  void copy_direct(std::uint32_t m, const slot_rt& s, std::size_t bytes, stream_view stream)
  {
    if (bytes == 0) { return; }
    const auto& r = bufs_[m];
    const unsigned char* src = source_ptr(m, s);
    if (!r.strided) {
      b_.memcpy_async(r.dst, src, bytes, ferry::backend::memcpy_kind::host_to_device, stream.handle());
      return;
    }
    const std::size_t rows = bytes / r.spec.row_size;
    for (std::size_t i = 0; i < rows; ++i) {
      b_.memcpy_async(static_cast<unsigned char*>(r.dst) + i * r.spec.stride, src + i * r.spec.row_size,
                      r.spec.row_size, ferry::backend::memcpy_kind::host_to_device, stream.handle());
    }
  }

  void write_header(const group_rt& g, slot_rt& s)
  {
    auto* h = s.arenas[static_cast<std::size_t>(&g - groups_.data())].template as<std::int64_t>();
    for (std::size_t i = 0; i < g.packed_members.size(); ++i) {
      const auto m = g.packed_members[i];
      h[2 * i] = static_cast<std::int64_t>(bufs_[m].arena_offset);
      h[2 * i + 1] = static_cast<std::int64_t>(s.counts[m] * bufs_[m].unit_bytes);
    }
  }

  /// packed: one DMA of the arena prefix [0, dma_bytes) then the scatter; zerocopy: the scatter alone,
  /// reading the mapped pinned arena. `eager`: the counts are final (publish, calibration) and travel in the
  /// kernel parameters, so no tile waits for the header; otherwise (capture) the tiles read the header.
  void enqueue_scatter(const group_rt& g, slot_rt& s, upload_backend k, std::size_t dma_bytes, stream_view stream,
                       bool eager, const detail::tile_desc* tiles = nullptr)
  {
    const auto gi = static_cast<std::size_t>(&g - groups_.data());
    detail::scatter_params p;
    if (k == upload_backend::packed) {
      b_.memcpy_async(s.staging[gi].data(), s.arenas[gi].data(), dma_bytes, ferry::backend::memcpy_kind::host_to_device,
                      stream.handle());
      p.arena = s.staging[gi].template as<const unsigned char>();
    } else {
      p.arena = s.arenas[gi].template device_as<const unsigned char>();
    }
    p.header = reinterpret_cast<const std::int64_t*>(p.arena);
    p.tiles = tiles != nullptr ? tiles : g.tile_table->template as<const detail::tile_desc>();
    p.tile_count = g.tile_count;
    p.tile_bytes = static_cast<std::uint32_t>(cfg_.tile_bytes);
    p.spec = static_cast<std::uint32_t>(cfg_.speculation >= 0 ? cfg_.speculation
                                        : k == upload_backend::packed ? 2
                                                                      : 1);
    const std::size_t n = g.packed_members.size();
    p.counts_inline = eager && n <= detail::scatter_params::inline_counts_max ? 1u : 0u;
    if (p.counts_inline != 0) {
      for (std::size_t i = 0; i < n; ++i) {
        const auto m = g.packed_members[i];
        p.count[i] = static_cast<std::uint64_t>(s.counts[m] * bufs_[m].unit_bytes);
      }
    }
    b_.launch(detail::scatter_kernel(typename B::tag{}),
              ferry::backend::launch_config{{g.grid}, {cfg_.threads_per_tile}, 0}, stream.handle(), p);
  }

  /// Batch: the published ranges of the group's members in one backend call (one cudaMemcpyBatchAsync where
  /// the runtime has it, per-member copies elsewhere: backend::memcpy_batch_h2d_async).
  void enqueue_batch(group_rt& g, slot_rt& s, stream_view stream, void* const* dsts = nullptr)
  {
    g.batch_dst.clear();
    g.batch_src.clear();
    g.batch_size.clear();
    for (std::size_t i = 0; i < g.packed_members.size(); ++i) {
      const auto m = g.packed_members[i];
      const std::size_t n = s.counts[m] * bufs_[m].unit_bytes;
      if (n == 0) { continue; }
      g.batch_dst.push_back(dsts != nullptr ? dsts[i] : bufs_[m].dst);
      g.batch_src.push_back(source_ptr(m, s));
      g.batch_size.push_back(n);
    }
    b_.memcpy_batch_h2d_async(g.batch_dst.data(), g.batch_src.data(), g.batch_size.data(), g.batch_dst.size(), cfg_.device,
                              stream.handle());
  }

  void commit_and_enqueue(group_handle gh, slot_rt& s, stream_view stream)
  {
    auto& g = groups_[gh.value];
    for (auto m : g.members) {
      s.published_epoch[m] = s.epoch;
      s.published_by[m] = gh.value;
    }
    guarded("publish", [&] {
      // Members outside any arena (or the whole group, for direct / covered groups): one copy each.
      if (g.arena_bytes == 0) {
        for (auto m : g.members) { copy_direct(m, s, s.counts[m] * bufs_[m].unit_bytes, stream); }
        return;
      }
      for (auto m : g.direct_members) { copy_direct(m, s, s.counts[m] * bufs_[m].unit_bytes, stream); }
      std::size_t active = 0;
      std::uint32_t last = none;
      for (auto m : g.packed_members) {
        if (s.counts[m] != 0) {
          ++active;
          last = m;
        }
      }
      if (active == 0) { return; }
      if (active == 1 || g.backend == upload_backend::direct) {
        // A single active member: a plain copy from its source; no header, no DMA of the arena, no kernel.
        if (active == 1) {
          copy_direct(last, s, s.counts[last] * bufs_[last].unit_bytes, stream);
        } else {
          for (auto m : g.packed_members) { copy_direct(m, s, s.counts[m] * bufs_[m].unit_bytes, stream); }
        }
        return;
      }
      if (g.backend == upload_backend::batch) {
        enqueue_batch(g, s, stream);
        return;
      }
      write_header(g, s);
      const std::size_t dma = bufs_[last].arena_offset + s.counts[last] * bufs_[last].unit_bytes;
      enqueue_scatter(g, s, g.backend, dma, stream, true);
    }, g.name);
  }

  // ---- initialization steps ------------------------------------------------------------------------

  /// Groups by size (largest first): a group with >= 2 contiguous members whose members are homed nowhere
  /// else gets an arena; one fully covered by an arena group keeps checked direct copies (no duplicate
  /// arena); one that shares members without being covered also uses direct copies.
  void plan_groups()
  {
    const bool packing = requested_ != upload_backend::direct;
    std::vector<std::size_t> order(groups_.size());
    for (std::size_t i = 0; i < order.size(); ++i) { order[i] = i; }
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return groups_[a].members.size() > groups_[b].members.size(); });
    for (auto gi : order) {
      auto& g = groups_[gi];
      std::vector<std::uint32_t> contiguous;
      for (auto m : g.members) {
        if (!bufs_[m].strided) { contiguous.push_back(m); }
      }
      std::uint32_t home = none;
      bool any_homed = false;
      bool same_home = true;
      for (auto m : contiguous) {
        if (bufs_[m].home != none) {
          if (home == none) { home = bufs_[m].home; }
          same_home = same_home && bufs_[m].home == home;
          any_homed = true;
        } else {
          same_home = false;
        }
      }
      if (any_homed) {
        g.covered = same_home && !contiguous.empty();
        continue;
      }
      if (!packing || contiguous.size() < 2) { continue; }
      g.packed_members = contiguous;
      for (auto m : g.members) {
        if (bufs_[m].strided) { g.direct_members.push_back(m); }
      }
      g.header_bytes = align_up(16 * contiguous.size());
      std::size_t off = g.header_bytes;
      for (auto m : contiguous) {
        bufs_[m].home = static_cast<std::uint32_t>(gi);
        bufs_[m].arena_offset = off;
        off += align_up(bufs_[m].cap_bytes);
      }
      g.arena_bytes = off;
      g.backend = requested_;
      g.graph_backend = requested_ == upload_backend::batch ? upload_backend::batch : requested_;
      g.batch_dst.reserve(contiguous.size());
      g.batch_src.reserve(contiguous.size());
      g.batch_size.reserve(contiguous.size());
    }
    std::size_t off = 0;
    for (auto& r : bufs_) {
      if (r.home == none) {
        r.standalone_offset = off;
        off += align_up(r.cap_bytes);
      }
    }
    standalone_bytes_ = std::max<std::size_t>(off, align);
  }

  void bind_destinations()
  {
    for (auto& r : bufs_) {
      if (r.dst == nullptr) {
        owned_dst_.emplace_back(align_up(r.cap_bytes), b_);
        r.dst = owned_dst_.back().data();
      }
    }
  }

  /// Rejects overlapping destination ranges (bound storage) and source ranges, naming both buffers.
  void check_overlaps() const
  {
    struct range {
      std::uintptr_t lo, hi;
      std::uint32_t buf;
    };
    auto check = [&](std::vector<range> v, std::string_view what) {
      std::sort(v.begin(), v.end(), [](const range& a, const range& b) { return a.lo < b.lo; });
      for (std::size_t i = 1; i < v.size(); ++i) {
        FERRY_EXPECTS(v[i].lo >= v[i - 1].hi, logic_error,
                      "h2d: {} range of buffer '{}' [{:#x}, {:#x}) overlaps buffer '{}' [{:#x}, {:#x})", what,
                      bufs_[v[i].buf].spec.name, v[i].lo, v[i].hi, bufs_[v[i - 1].buf].spec.name, v[i - 1].lo,
                      v[i - 1].hi);
      }
    };
    std::vector<range> dst;
    std::vector<range> src;
    for (std::uint32_t i = 0; i < bufs_.size(); ++i) {
      const auto& r = bufs_[i];
      const auto lo = reinterpret_cast<std::uintptr_t>(r.dst);
      const std::size_t extent = r.strided ? (r.spec.capacity - 1) * r.spec.stride + r.spec.row_size : r.cap_bytes;
      dst.push_back({lo, lo + extent, i});
      const std::uintptr_t s0 = r.home != none ? (static_cast<std::uintptr_t>(r.home) << 48) + r.arena_offset
                                               : (std::uintptr_t{0xFFFF} << 48) + r.standalone_offset;
      src.push_back({s0, s0 + r.cap_bytes, i});
    }
    check(std::move(dst), "destination");
    check(std::move(src), "source");
  }

  void allocate_slots()
  {
    slots_.resize(cfg_.slots);
    for (auto& s : slots_) {
      s.arenas.resize(groups_.size());
      s.staging.resize(groups_.size());
      for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
        if (groups_[gi].arena_bytes == 0) { continue; }
        s.arenas[gi] = mapped_buffer{groups_[gi].arena_bytes, b_};
        std::memset(s.arenas[gi].data(), 0, groups_[gi].arena_bytes);
        s.staging[gi] = device_buffer{groups_[gi].arena_bytes, b_};
        // Zeroed once: speculative scatter loads may read staging bytes past the DMA'd prefix (never stored).
        b_.memset_async(s.staging[gi].data(), 0, groups_[gi].arena_bytes, owner_->handle());
      }
      s.standalone = pinned_buffer{standalone_bytes_, b_};
      s.done.emplace(b_, ferry::backend::event_flags::disable_timing);
      s.counts.assign(bufs_.size(), 0);
      s.count_epoch.assign(bufs_.size(), 0);
      s.published_epoch.assign(bufs_.size(), 0);
      s.published_by.assign(bufs_.size(), 0);
    }
    acquire_.emplace(b_, ferry::backend::event_flags::disable_timing);
    b_.stream_synchronize(owner_->handle());
  }

  /// The tile table of group `g` for destinations `dsts` (per packed member): every member's capacity cut
  /// into tile_bytes tiles, interleaved round-robin across members (tile 0 of every member first) so that a
  /// grid smaller than the table still spreads a large member over many blocks.
  [[nodiscard]] std::vector<detail::tile_desc> make_tiles(const group_rt& g, const std::vector<std::uint64_t>& dsts) const
  {
    std::vector<detail::tile_desc> tiles;
    for (std::uint32_t i = 0; i < g.packed_members.size(); ++i) {
      const auto& r = bufs_[g.packed_members[i]];
      for (std::size_t start = 0; start < r.cap_bytes; start += cfg_.tile_bytes) {
        detail::tile_desc t{};
        t.dst = dsts[i] + start;
        t.src = r.arena_offset + start;
        t.start = start;
        t.member = i;
        t.len = static_cast<std::uint32_t>(std::min(cfg_.tile_bytes, r.cap_bytes - start));
        tiles.push_back(t);
      }
    }
    std::stable_sort(tiles.begin(), tiles.end(),
                     [&](const detail::tile_desc& a, const detail::tile_desc& b) { return a.start < b.start; });
    return tiles;
  }

  /// Fixed device tile table per arena group (from capacities and destinations) and the scatter grid: every
  /// tile in one wave (as many resident blocks as the SMs hold), grid-stride beyond.
  void build_tables()
  {
    const std::size_t per_sm = std::max<std::size_t>(1, 2048 / cfg_.threads_per_tile);
    for (auto& g : groups_) {
      if (g.arena_bytes == 0) { continue; }
      std::vector<std::uint64_t> dsts;
      for (auto m : g.packed_members) { dsts.push_back(reinterpret_cast<std::uintptr_t>(bufs_[m].dst)); }
      const auto tiles = make_tiles(g, dsts);
      g.tile_count = static_cast<std::uint32_t>(tiles.size());
      g.grid = static_cast<std::uint32_t>(std::min<std::size_t>(tiles.size(), static_cast<std::size_t>(sm_count_) * per_sm));
      g.tile_table.emplace(tiles.size() * sizeof(detail::tile_desc), b_);
      upload_now(g.tile_table->data(), tiles.data(), tiles.size() * sizeof(detail::tile_desc));
    }
  }

  void upload_now(void* dst, const void* src, std::size_t bytes)
  {
    pinned_buffer tmp{bytes, b_};
    std::memcpy(tmp.data(), src, bytes);
    b_.memcpy_async(dst, tmp.data(), bytes, ferry::backend::memcpy_kind::host_to_device, owner_->handle());
    b_.stream_synchronize(owner_->handle());
  }

  /// `automatic`: per arena group, time each candidate (full counts, scratch destinations so bound storage
  /// is never written) and keep the fastest; the graph choice is the fastest capturable one. Candidates are
  /// timed round-robin (one span of each per round), so that clock or load drift during calibration hits
  /// them alike; round r uses runner slot r % slots (each slot has its own pinned arena and sources, whose
  /// upload times can differ), so every candidate's median covers every slot alike. A zero-copy candidate
  /// within 3% of the fastest wins the near-tie: one operation, the least CPU enqueue time, and no copy engine.
  void calibrate()
  {
    const std::size_t nslots = slots_.size();
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
      auto& g = groups_[gi];
      if (g.arena_bytes == 0) { continue; }
      device_buffer scratch{g.arena_bytes, b_};
      std::vector<std::uint64_t> dsts;
      std::vector<void*> dptr;
      for (auto m : g.packed_members) {
        auto* p = scratch.template as<unsigned char>() + bufs_[m].arena_offset;
        dsts.push_back(reinterpret_cast<std::uintptr_t>(p));
        dptr.push_back(p);
        for (auto& s : slots_) { s.counts[m] = bufs_[m].spec.capacity; }
      }
      const auto tiles = make_tiles(g, dsts);
      device_buffer table{tiles.size() * sizeof(detail::tile_desc), b_};
      upload_now(table.data(), tiles.data(), tiles.size() * sizeof(detail::tile_desc));
      const auto* tt = table.template as<const detail::tile_desc>();
      for (auto& s : slots_) { write_header(g, s); }
      event t0{b_, ferry::backend::event_flags::timing};
      event t1{b_, ferry::backend::event_flags::timing};
      constexpr int nc = 4;
      const upload_backend cands[nc] = {upload_backend::direct, upload_backend::batch, upload_backend::packed,
                                        upload_backend::zerocopy};
      auto enqueue = [&](upload_backend k, bool eager, slot_rt& s) {
        if (k == upload_backend::direct) {
          for (std::size_t i = 0; i < g.packed_members.size(); ++i) {
            const auto m = g.packed_members[i];
            b_.memcpy_async(dptr[i], source_ptr(m, s), bufs_[m].cap_bytes, ferry::backend::memcpy_kind::host_to_device,
                            owner_->handle());
          }
        } else if (k == upload_backend::batch) {
          enqueue_batch(g, s, *owner_, dptr.data());
        } else {
          enqueue_scatter(g, s, k, g.arena_bytes, *owner_, eager, tt);
        }
      };
      auto span = [&](auto&& body) {
        t0.record(*owner_);
        body();
        t1.record(*owner_);
        t1.synchronize();
        return static_cast<double>(t1.elapsed_ms_since(t0)) * 1000.0;
      };
      bool eager_ok[nc]{};
      bool graph_ok[nc]{};
      std::vector<ferry::backend::graph_exec<B>> graphs;  // candidate c, slot si: graphs[graph_index[c] + si]
      int graph_index[nc]{-1, -1, -1, -1};
      for (int c = 0; c < nc; ++c) {
        const auto k = cands[c];
        eager_ok[c] = k != upload_backend::batch || batch_native();
        graph_ok[c] = k != upload_backend::batch;
        if (graph_ok[c]) {
          graph_index[c] = static_cast<int>(graphs.size());
          for (auto& s : slots_) {
            graphs.push_back(ferry::backend::graph_exec<B>::capture(*owner_, [&](stream_view) { enqueue(k, false, s); }));
          }
        }
      }
      // Median of `iters` rounds after 3 warm-up rounds: eager (enqueue included, as publish() runs) and as a
      // replayed graph, each with full counts.
      const int iters = std::max(3, cfg_.calibration_iterations);
      std::vector<double> eager_us[nc];
      std::vector<double> graph_us[nc];
      const int rounds = static_cast<int>(((static_cast<std::size_t>(iters) + nslots - 1) / nslots) * nslots);
      for (int it = 0; it < rounds + 3; ++it) {
        const std::size_t si = static_cast<std::size_t>(it) % nslots;
        for (int c = 0; c < nc; ++c) {
          if (eager_ok[c]) {
            const double v = span([&] { enqueue(cands[c], true, slots_[si]); });
            if (it >= 3) { eager_us[c].push_back(v); }
          }
          if (graph_ok[c]) {
            const double v =
              span([&] { graphs[static_cast<std::size_t>(graph_index[c]) + si].launch(*owner_); });
            if (it >= 3) { graph_us[c].push_back(v); }
          }
        }
      }
      auto med = [](std::vector<double>& v) {
        if (v.empty()) { return -1.0; }
        std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
        return v[v.size() / 2];
      };
      g.calibration_us.assign(nc, -1.0);
      g.calibration_graph_us.assign(nc, -1.0);
      for (int c = 0; c < nc; ++c) {
        g.calibration_us[static_cast<std::size_t>(c)] = med(eager_us[c]);
        g.calibration_graph_us[static_cast<std::size_t>(c)] = med(graph_us[c]);
      }
      auto pick = [&](const std::vector<double>& v) {
        int best = -1;
        for (int c = 0; c < nc; ++c) {
          if (v[static_cast<std::size_t>(c)] < 0) { continue; }
          if (best < 0 || v[static_cast<std::size_t>(c)] < v[static_cast<std::size_t>(best)]) { best = c; }
        }
        constexpr std::size_t zc = 3;
        if (v[zc] >= 0 && v[zc] <= v[static_cast<std::size_t>(best)] * 1.03) { best = static_cast<int>(zc); }
        return cands[best];
      };
      g.backend = pick(g.calibration_us);
      g.graph_backend = pick(g.calibration_graph_us);
      graphs.clear();
      b_.stream_synchronize(owner_->handle());
      for (auto& s : slots_) {
        for (auto m : g.packed_members) { s.counts[m] = 0; }
        std::memset(s.arenas[gi].data(), 0, g.header_bytes);
      }
    }
  }

  B b_;
  config cfg_{};
  upload_backend requested_{upload_backend::packed};
  bool initialized_{false};
  int sm_count_{1};
  std::vector<buf_rt> bufs_;
  std::vector<group_rt> groups_;
  std::vector<device_buffer> owned_dst_;
  std::vector<slot_rt> slots_;
  std::size_t standalone_bytes_{align};
  std::optional<stream_view> owner_;
  std::optional<event> acquire_;
  std::thread::id owner_thread_{};
  int active_{-1};
  std::uint64_t epoch_counter_{0};
  std::vector<std::uint32_t> producer_open_;
  bool invalid_{false};
  std::string invalid_reason_;
  std::string last_reason_;
};

}  // namespace ferry::h2d
