// SPDX-License-Identifier: Apache-2.0
// Definitions of ferry::h2d::publisher<B>'s public members (declared in ferry/h2d/publisher.hpp): the order
// of the checks, the backend calls and the failure handling around them. The private helpers they call
// (the guards' access, the checks, guarded() and validate_publication()) are in publisher_checks.inl;
// layout, slot state, storage, enqueue and calibration live in the other detail headers.
#pragma once

#include <ferry/h2d/detail/calibrate.hpp>
#include <ferry/h2d/detail/env.hpp>
#include <ferry/h2d/detail/kernels.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

namespace ferry::h2d {

template <ferry::backend::backend B>
publisher<B>::~publisher()
{
  life_->pub = nullptr;  // guards that outlive the publisher are refused from now on
  // Never throws; a failed wait (the owner stream destroyed first: on the host backend an error, on
  // CUDA/HIP undefined behaviour) is reported on stderr, once.
  bool reported = false;
  const auto report = [&](const char* what, const char* why) {
    if (!reported) { std::fprintf(stderr, "ferry: h2d publisher destroyed: %s failed: %s\n", what, why); }
    reported = true;
  };
  if (owner_) {
    try {
      b_.stream_synchronize(owner_->handle());
    } catch (const std::exception& e) {
      report("synchronizing the owner stream", e.what());
    } catch (...) {
      report("synchronizing the owner stream", "unknown error");
    }
  }
  for (std::size_t i = 0; i < std::min(store_.slots.size(), slots_.size()); ++i) {
    if (slots_[i].recorded) {
      try {
        store_.slots[i].done->synchronize();
      } catch (const std::exception& e) {
        report("waiting for a slot's completion", e.what());
      } catch (...) {
        report("waiting for a slot's completion", "unknown error");
      }
    }
  }
}

template <ferry::backend::backend B>
buffer_handle publisher<B>::declare(buffer_spec spec)
{
  FERRY_EXPECTS(!initialized_, logic_error, "h2d buffer '{}': declare() after initialize()", spec.name);
  return decl_.declare(std::move(spec));
}

template <ferry::backend::backend B>
void publisher<B>::initialize(const config& cfg, stream_view owner)
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
  FERRY_EXPECTS(!decl_.buffers.empty(), logic_error, "h2d publisher: initialize() with no declared buffer");
  cfg_ = cfg;
  detail::apply_env(cfg_);
  requested_ = cfg_.backend.value_or(upload_backend::packed);
  FERRY_EXPECTS(b_.current_device() == cfg.device, logic_error,
                "h2d publisher: initialize() on device {} but config names device {}", b_.current_device().value,
                cfg.device.value);
  owner_.emplace(owner);
  owner_thread_ = std::this_thread::get_id();
  const auto attrs = b_.attributes(cfg.device);
  // Load the scatter now: a lazy module load at its first launch would wait for kernels already running.
  b_.preload(detail::scatter_kernel(typename B::tag{}));
  plan_ = detail::plan_arenas(decl_, requested_ != upload_backend::direct);
  store_.bind_destinations(b_, decl_);
  detail::check_overlaps(decl_, plan_, store_.dst);
  store_.allocate_slots(b_, plan_, cfg_.slots, requested_, owner);
  acquire_.emplace(b_, ferry::backend::event_flags::disable_timing);
  b_.stream_synchronize(owner.handle());
  store_.build_tables(b_, decl_, plan_, cfg_, attrs.sm_count, owner);
  slots_.reset(cfg_.slots, decl_.buffers.size());
  sources_.reset(cfg_.debug_sources.value_or(false), cfg_.slots);
  if (requested_ == upload_backend::automatic) {
    detail::calibrate(uploader(), slots_, owner, cfg_.calibration_iterations);
  }
  initialized_ = true;
}

template <ferry::backend::backend B>
slot_guard<B> publisher<B>::begin(std::size_t slot)
{
  check_usable("begin");
  slots_.check_begin(slot);
  sources_.verify(decl_, "begin()");
  if (slots_[slot].recorded) {
    guarded("begin: source reuse wait", [&] { store_.slots[slot].done->synchronize(); });
  }
  sources_.release_slot(slot);  // the slot's uploads have read its sources: writable again
  const auto epoch = slots_.start_epoch(slot);
  return slot_guard<B>{life_, slot, epoch};
}

template <ferry::backend::backend B>
slot_guard<B> publisher<B>::resume(std::size_t slot)
{
  check_usable("resume");
  sources_.verify(decl_, "resume()");
  const auto epoch = slots_.resume(slot);
  return slot_guard<B>{life_, slot, epoch};
}

template <ferry::backend::backend B>
void publisher<B>::finish()
{
  check_usable("finish");
  slots_.check_finish();
  const auto slot = static_cast<std::size_t>(slots_.active());
  guarded("finish: completion record", [&] { store_.slots[slot].done->record(*owner_); });
  slots_.finished();
}

template <ferry::backend::backend B>
producer_guard<B> publisher<B>::open_producer(group_handle g, std::optional<std::size_t> expected_slot)
{
  check_usable("producer");
  (void)decl_.group(g);
  sources_.verify(decl_, "producer()");
  slots_.open_producer(decl_, g, expected_slot);
  return producer_guard<B>{life_, g, static_cast<std::size_t>(slots_.active()), slots_.current().epoch};
}

template <ferry::backend::backend B>
void publisher<B>::set_count(buffer_handle buf, std::size_t count)
{
  check_usable("set_count");
  slots_.set_count(decl_, buf, count);
}

template <ferry::backend::backend B>
void publisher<B>::publish(group_handle g, stream_view stream)
{
  auto& s = validate_publication(g, stream, true);
  const auto slot = static_cast<std::size_t>(slots_.active());
  slots_.commit(decl_, g);
  guarded("publish", [&] { uploader().publish(g.value, store_.slots[slot], s.counts, stream); },
          decl_.groups[g.value].name);
  record_sources(g);
}

template <ferry::backend::backend B>
producer_guard<B> publisher<B>::rewrite(std::string_view group, std::string_view reason)
{
  check_usable("rewrite");
  const group_handle g = group_of(group);
  const auto& gr = decl_.group(g);
  FERRY_EXPECTS(!reason.empty(), logic_error, "h2d group '{}': a second publication must supply a reason", gr.name);
  FERRY_EXPECTS(slots_.active() >= 0, logic_error, "h2d group '{}': rewrite() with no active slot", gr.name);
  check_owner_thread(gr.name);
  slots_.check_rewrite(decl_, g);
  sources_.verify(decl_, "rewrite()");
  guarded("rewrite: source acquire", [&] {
    acquire_->record(*owner_);
    acquire_->synchronize();
  });
  const auto active = static_cast<std::size_t>(slots_.active());
  for (auto m : gr.members) {  // the earlier upload has read them: the producer may write them again
    if (slots_.current().published_epoch[m] == slots_.current().epoch) { sources_.drop(active, m); }
  }
  slots_.reopen(decl_, g);
  last_reason_.assign(reason);
  return producer(g);
}

template <ferry::backend::backend B>
void publisher<B>::stage(group_handle g)
{
  auto& s = validate_publication(g, *owner_, false);
  check_baked_counts(g, s);
  slots_.commit(decl_, g);
  if (plan_.groups[g.value].arena_bytes > 0) {
    uploader().header(g.value, store_.slots[static_cast<std::size_t>(slots_.active())], s.counts);
  }
  record_sources(g);
}

template <ferry::backend::backend B>
void publisher<B>::capture_upload(std::string_view group, std::size_t slot, stream_view stream)
{
  check_usable("capture_upload");
  const group_handle g = group_of(group);
  const auto& gr = decl_.groups[g.value];
  FERRY_EXPECTS(slot < slots_.size(), logic_error, "h2d group '{}': slot {} out of range", gr.name, slot);
  FERRY_EXPECTS(stream == *owner_, logic_error, "h2d group '{}': capture on a stream other than the owner stream",
                gr.name);
  bool capturing = false;
  guarded("capture_upload: capture query", [&] { capturing = b_.stream_is_capturing(stream.handle()); });
  FERRY_EXPECTS(capturing, logic_error, "h2d group '{}': capture_upload() outside stream capture", gr.name);
  const upload_backend k = plan_.groups[g.value].arena_bytes > 0 ? store_.groups[g.value].graph_backend
                                                                 : upload_backend::direct;
  FERRY_EXPECTS(k != upload_backend::batch, logic_error,
                "h2d group '{}': the batch backend (cudaMemcpyBatchAsync) is not graph-capturable", gr.name);
  if (k == upload_backend::direct) { slots_.check_direct_capture(decl_, g, slot); }
  guarded("capture_upload: enqueue",
          [&] { uploader().capture(g.value, store_.slots[slot], slots_[slot].counts, k, stream); });
  auto& baked = baked_[{g.value, slot}];
  baked.clear();
  for (auto m : k == upload_backend::direct ? gr.members : plan_.groups[g.value].direct_members) {
    baked.emplace_back(m, slots_[slot].counts[m]);
  }
}

template <ferry::backend::backend B>
void publisher<B>::recover()
{
  FERRY_EXPECTS(initialized_, logic_error, "h2d publisher: recover() before initialize()");
  FERRY_EXPECTS(invalid_, logic_error, "h2d publisher: recover() on a publisher that is not invalidated");
  check_owner_thread("recover");
  b_.stream_synchronize(owner_->handle());
  for (std::size_t i = 0; i < store_.slots.size(); ++i) {
    if (slots_[i].recorded) { store_.slots[i].done->synchronize(); }
  }
  invalid_ = false;
  invalid_reason_.clear();
  slots_.recover();
  sources_.release_all();
}

template <ferry::backend::backend B>
group_info publisher<B>::info(std::string_view group) const
{
  const auto gi = group_of(group).value;
  static const detail::group_layout unplanned{};  // before initialize()
  const auto& gl = gi < plan_.groups.size() ? plan_.groups[gi] : unplanned;
  const bool arena = gl.arena_bytes > 0;
  group_info i;
  i.name = decl_.groups[gi].name;
  i.backend = arena ? store_.groups[gi].backend : upload_backend::direct;
  i.covered = gl.covered;
  i.batch_native = batch_native();
  i.arena_bytes = gl.arena_bytes;
  i.tiles = arena ? store_.groups[gi].tile_count : 0;
  for (auto m : decl_.groups[gi].members) { i.members.push_back(decl_.buffers[m].spec.name); }
  if (gi < store_.groups.size()) {
    i.calibration_us = store_.groups[gi].calibration_us;
    i.calibration_graph_us = store_.groups[gi].calibration_graph_us;
  }
  i.graph_backend = arena ? store_.groups[gi].graph_backend : upload_backend::direct;
  return i;
}

}  // namespace ferry::h2d
