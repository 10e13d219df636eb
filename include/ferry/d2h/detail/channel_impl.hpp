// SPDX-License-Identifier: Apache-2.0
// detail::channel_impl<B>: one channel's parts and its life: construction (device resources, kernel
// preload, the drain thread), close (drain what was published, report the rest) and destruction (wait for
// every queued copy and release before freeing). Channels are independent: each owns its ring, state block,
// published_head, drain stream and drain thread, so any number may live on one device.
//   channel_state  shared state (channel_state.hpp)
//   release_chain  every release of published_head (release_chain.hpp)
//   producer       forwards, reservation, copies, plans (producer.hpp)
//   drainer        acquire, coalesce, D2H, reclaim, deliver (drainer.hpp)
#pragma once

#include <ferry/backend/grid_dependency.hpp>
#include <ferry/d2h/detail/channel_state.hpp>
#include <ferry/d2h/detail/drainer.hpp>
#include <ferry/d2h/detail/producer.hpp>
#include <ferry/d2h/detail/release_chain.hpp>
#include <ferry/d2h/hook_schema.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace ferry::testing {
struct d2h_access;
}
namespace ferry::d2h {
template <ferry::backend::backend B>
class channel;
}

namespace ferry::d2h::detail {

/// A channel's parts, private to the channel (and the test hooks): one owner per part.
template <ferry::backend::backend B>
class channel_impl {
 public:
  using callback_type = typename drainer<B>::callback_type;

  /// Members in order: the shared state (config validated), then its device resources (init_resources, run
  /// before the parts that use them are built), the release chain, the producer, the drainer (its events).
  /// `staging`: given staging memory (staging_memory.hpp), or empty (the channel allocates pinned staging).
  /// `hooks`: the channel's hook schema (channel::schema(); held for consumers, the channel itself never reads it).
  channel_impl(config cfg, B b, callback_type cb, const staging_memory& staging = {},
               std::shared_ptr<const hook_schema> hooks = std::make_shared<const hook_schema>())
    : st{with_staging(cfg, staging), b}, rel{(init_resources(staging), st)}, prod{st, rel, progress_fn()},
      drain{st, std::move(cb)}, schema{std::move(hooks)}
  {
    st.drain_stream.synchronize();  // the zeroed state block and ring are in place before any kernel reads them
    if (st.cfg.drain == drain_mode::thread) {
      drain_thread = std::thread([this] { drain.run_loop(stop); });
    }
  }
  channel_impl(const channel_impl&) = delete;
  channel_impl& operator=(const channel_impl&) = delete;

  ~channel_impl()
  {
    stop.store(true);
    if (drain_thread.joinable()) { drain_thread.join(); }
    try {
      rel.synchronize();               // nor the state block under a queued release
      st.drain_stream.synchronize();  // never free the ring or staging under a queued copy
    } catch (...) {
    }
  }

  /// Drains every published entry (up to `timeout`), stops the drain and reports; see channel::close().
  shutdown_report close(std::chrono::milliseconds timeout);
  /// close(), then the commit check (a user kernel that never called ring_ref::commit(): invalidated_error).
  shutdown_report close_checked(std::chrono::milliseconds timeout);
  /// close(config::timeout) for destructors: never throws; an error goes to stderr.
  void close_quietly() noexcept;

  /// Runs a channel call; a backend failure inside it invalidates the channel, then propagates.
  template <class F>
  decltype(auto) guarded(F&& f)
  {
    try {
      return std::forward<F>(f)();
    } catch (const ferry::backend_error& e) {
      st.fail(e.what());
      throw;
    }
  }
  /// A producer call: `f`, or with capture disabled (config::on_error = disable) the no-op `off`. Under
  /// on_error = disable a typed error of `f` disables capture (the error kept, the open forward closed:
  /// producer::disable) and the call returns `off()`.
  /// channel::plan / try_plan: reserves and arms one replay (producer::plan), or, with capture disabled, a
  /// quiet token (the replay writes nothing, unreported).
  bool plan(const forward_plan& p, when_full full, std::optional<typename B::stream_type> s, forward_meta meta = {})
  {
    return produce([&] { return prod.plan(p, full, s, std::move(meta)); }, [&] {
      prod.arm_quiet(s);
      return true;
    });
  }
  template <class F, class Off>
  std::invoke_result_t<F> produce(F&& f, Off&& off)
  {
    if (st.capture_disabled()) [[unlikely]] {
      prod.while_disabled();
      return off();
    }
    try {
      return guarded(std::forward<F>(f));
    } catch (const ferry::error& e) {
      if (st.cfg.on_error != error_policy::disable) { throw; }
      prod.disable(e.what());
      return off();
    }
  }

 private:
  friend class ferry::d2h::channel<B>;
  friend struct ferry::testing::d2h_access;

  channel_state<B> st;
  release_chain<B> rel;
  producer<B> prod;
  drainer<B> drain;
  std::shared_ptr<const hook_schema> schema;  ///< never null

  /// The producer's wait for ring space: poll mode drives one drain step itself (nobody else drains);
  /// thread mode waits for the drain thread's reclaim (space_cv).
  typename producer<B>::progress_fn progress_fn()
  {
    if (st.cfg.drain == drain_mode::poll) {
      return [this] {
        std::unique_lock lock{drain.mutex()};
        if (drain.step() == 0) {
          lock.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      };
    }
    return [this] {
      std::unique_lock lock{st.space_mu};
      st.space_cv.wait_for(lock, std::chrono::milliseconds(1));
    };
  }

  void init_resources(const staging_memory& staging);
  void throw_if_failed(const shutdown_report& rep) const;

  std::atomic<bool> stop{false};
  std::thread drain_thread;
  std::mutex close_mu;
  std::optional<shutdown_report> final_report;
};

template <ferry::backend::backend B>
void channel_impl<B>::init_resources(const staging_memory& staging)
{
  auto& b = st.b;
  const auto attrs = b.attributes(st.dev);
  st.sm_count = std::max(1, attrs.sm_count);
  auto& where = st.cfg.tuning.head_memory;  // the platform's choice, or the tuning's override
  if (where == head_memory::platform) {
    where = attrs.concurrent_managed_access ? head_memory::managed : head_memory::pinned_mapped;
  }
  FERRY_EXPECTS(where != head_memory::managed || attrs.concurrent_managed_access, ferry::logic_error,
                "d2h channel on {} device {} ({}): head_memory 'managed' expected concurrentManagedAccess == 1, got 0; "
                "use head_memory::pinned_mapped (or the platform's choice)",
                B::name(), st.dev.value, attrs.name);
  st.ring = ferry::backend::device_buffer<B>{st.cfg.ring_bytes, b};
  st.state_buf = ferry::backend::device_buffer<B>{sizeof(device_state), b};
  if (st.cfg.tuning.bounce_capture_max_bytes != 0) {  // one slot per position of a deferred batch
    st.bounce_slot = align_up(st.cfg.tuning.bounce_capture_max_bytes, entry_alignment);
    st.bounce = ferry::backend::device_buffer<B>{st.bounce_slot * deferred_limit(st.cfg, st.fifo.capacity()), b};
  }
  b.memset_async(st.state_buf.data(), 0, sizeof(device_state), st.drain_stream.handle());
  // Coalesced drain copies span the alignment padding between entries; give those bytes a defined value
  // once, so no D2H ever reads memory nothing wrote (compute-sanitizer initcheck stays clean).
  b.memset_async(st.ring.data(), 0, st.cfg.ring_bytes, st.drain_stream.handle());
  // published_head and the size ring (size_slots: derived in channel_state) in the memory chosen above
  const std::uint64_t size_bytes = align_up(std::uint64_t{st.cfg.tuning.size_slots} * 8U, cache_line);
  if (where == head_memory::managed) {
    st.head_managed = ferry::backend::managed_buffer<B>{cache_line, b};  // its own cache line
    st.size_managed = ferry::backend::managed_buffer<B>{size_bytes, b};
    for (const auto* m : {&st.head_managed, &st.size_managed}) {
      m->advise(ferry::backend::mem_advice::preferred_location_host, st.dev);
      m->advise(ferry::backend::mem_advice::accessed_by_device, st.dev);
    }
    st.head_host = st.head_managed.template as<std::uint64_t>();
    st.head_dev = st.head_host;
    st.size_host = st.size_managed.template as<std::uint64_t>();
    st.size_dev = st.size_host;
  } else {
    st.head_mapped = ferry::backend::mapped_buffer<B>{cache_line, b};
    st.size_mapped = ferry::backend::mapped_buffer<B>{size_bytes, b};
    st.head_host = st.head_mapped.template as<std::uint64_t>();
    st.head_dev = st.head_mapped.template device_as<std::uint64_t>();
    st.size_host = st.size_mapped.template as<std::uint64_t>();
    st.size_dev = st.size_mapped.template device_as<std::uint64_t>();
  }
  ferry::backend::host_store_release(st.head_host, 0);
  st.replay_report = ferry::backend::mapped_buffer<B>{cache_line, b};
  ferry::backend::host_store_release(st.replay_report.template as<std::uint64_t>(), 0);
  ferry::backend::host_store_release(st.replay_report.template as<std::uint64_t>() + 1, 0);
  ferry::backend::host_store_release(st.replay_report.template as<std::uint64_t>() + 2, 0);
  if (!staging.empty()) {
    st.staging = std::make_shared<staging_pool>(staging.base, st.staging_bytes, staging.owner);
  } else {
    auto pinned = std::make_shared<ferry::backend::pinned_buffer<B>>(st.staging_bytes, b);
    auto* base = static_cast<std::byte*>(pinned->data());
    st.staging = std::make_shared<staging_pool>(base, st.staging_bytes, std::shared_ptr<void>(pinned, pinned.get()));
  }
  // Load every kernel the channel launches now (the kernel table, kernels.hpp: for_each_kernel): a lazy module
  // load at a first launch would wait for kernels already running on the device (see backend preload).
  int arch = std::numeric_limits<int>::max();
  for_each_kernel(typename B::tag{}, [&](auto k) { arch = std::min(arch, b.preload(k)); });
  // Programmatic launch only where the device and the code that will run both support it.
  st.launch.programmatic =
    st.cfg.tuning.programmatic_launch && ferry::backend::programmatic_launch_ok(attrs.compute_capability_major, arch);
}

}  // namespace ferry::d2h::detail

#include <ferry/d2h/detail/channel_close.inl>
