// SPDX-License-Identifier: Apache-2.0
// Host-emulated device: stream workers, events, memory, graphs. See include/ferry/backend/host/backend.hpp.
#include <ferry/backend/host/backend.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ferry::backend {

namespace {

constexpr std::size_t device_alignment = 256;
constexpr unsigned char poison_byte = 0xCD;

std::atomic<long long>& jitter_us()
{
  static std::atomic<long long> value{[] {
    const char* env = std::getenv("FERRY_HOST_JITTER_US");
    return env != nullptr ? std::atoll(env) : 0LL;
  }()};
  return value;
}

int emulated_devices()
{
  static const int n = [] {
    const char* env = std::getenv("FERRY_HOST_DEVICES");
    const int v = env != nullptr ? std::atoi(env) : 2;
    return std::max(v, 1);
  }();
  return n;
}

thread_local int tls_device = 0;

[[noreturn]] void host_fail_at(int code, std::string_view code_name, std::string_view call, std::string_view detail,
                               int line)
{
  throw host_error("host", code, code_name, call, ferry::detail::where(__FILE__, line), detail);
}
#define host_fail(code, name, call, detail) host_fail_at(code, name, call, detail, __LINE__)

/// Every allocation of the emulated device (device, pinned, managed), by base address: memory outside them
/// is the caller's pageable memory, which copies treat as CUDA does (memcpy_async).
struct allocations {
  std::mutex mu;
  std::map<std::uintptr_t, std::size_t> by_base;
  std::map<std::uintptr_t, std::size_t> registered;  ///< host_register's ranges (also in by_base)
  /// Whether [a, a + n) overlaps a known range (caller holds mu).
  [[nodiscard]] bool overlaps(std::uintptr_t a, std::size_t n) const
  {
    auto it = by_base.lower_bound(a + n);
    if (it == by_base.begin()) { return false; }
    --it;
    return it->first + it->second > a;
  }
  [[nodiscard]] bool contains(const void* p)
  {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard l{mu};
    auto it = by_base.upper_bound(a);
    if (it == by_base.begin()) { return false; }
    --it;
    return a < it->first + it->second;
  }
};
allocations& backend_memory()
{
  static auto* a = new allocations;  // never destroyed: frees may come from static destructors
  return *a;
}

void* aligned_alloc_poisoned(std::size_t bytes)
{
  const std::size_t n = std::max<std::size_t>(bytes, 1);
  void* p = ::operator new(n, std::align_val_t{device_alignment}, std::nothrow);
  if (p == nullptr) {
    throw out_of_memory(ferry::detail::format("ferry: host backend could not allocate {} bytes", bytes));
  }
  std::memset(p, poison_byte, n);
  auto& m = backend_memory();
  std::lock_guard l{m.mu};
  m.by_base[reinterpret_cast<std::uintptr_t>(p)] = n;
  return p;
}

void aligned_free(void* p) noexcept
{
  if (p == nullptr) { return; }
  {
    auto& m = backend_memory();
    std::lock_guard l{m.mu};
    m.by_base.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  ::operator delete(p, std::align_val_t{device_alignment});
}

}  // namespace

namespace host_detail {

struct stream;
struct graph {
  std::vector<node> nodes;
  std::uint64_t id{0};
  stream* origin{nullptr};
  std::vector<stream*> joined;  ///< streams that joined the capture through an event wait (forks)
};
/// Captures in progress, by id (ids are never reused, so a stale event record never matches).
std::mutex& capture_mutex()
{
  static std::mutex m;
  return m;
}
std::map<std::uint64_t, graph*>& open_captures()
{
  static std::map<std::uint64_t, graph*> m;
  return m;
}
struct graph_exec {
  std::vector<node> nodes;
};

struct stream {
  std::mutex m;
  std::condition_variable cv_work;
  std::condition_variable cv_idle;
  std::deque<op> queue;
  bool busy{false};
  bool stop{false};
  graph* capturing{nullptr};
  std::uint64_t cap_nodes{0};        ///< operations this stream added to the capture
  std::uint64_t cap_joined_upto{0};  ///< of those, how many the origin stream has waited for
  std::string error;  // first failure of an operation, reported at the next synchronize
  /// Set by stream_destroy. The struct itself is never freed (see graveyard), so every later use of the
  /// handle is a host_error (invalid_resource_handle) instead of a use-after-free or a hang.
  std::atomic<bool> destroyed{false};
  std::thread worker;

  stream() : worker([this] { run(); }) {}

  void run()
  {
    std::minstd_rand rng{static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id()))};
    std::unique_lock lock{m};
    for (;;) {
      cv_work.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) { return; }  // stop requested and drained
      op next = std::move(queue.front());
      queue.pop_front();
      const long long j = jitter_us().load(std::memory_order_relaxed);
      if (next.marker) {
        // Event completion: cheap and non-blocking; run it under the stream lock with busy == false so
        // the stream is observably idle no later than the event is observably complete.
        if (j > 0) {
          busy = true;
          lock.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % static_cast<unsigned long long>(j + 1)));
          lock.lock();
          busy = false;
        }
        next.fn();
        if (queue.empty()) { cv_idle.notify_all(); }
        continue;
      }
      busy = true;
      lock.unlock();
      if (j > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % static_cast<unsigned long long>(j + 1)));
      }
      std::string failure;
      try {
        next.fn();
      } catch (const std::exception& e) {
        failure = e.what();
      } catch (...) {
        failure = "unknown exception in a stream operation";
      }
      lock.lock();
      if (!failure.empty() && error.empty()) { error = std::move(failure); }
      busy = false;
      if (queue.empty()) { cv_idle.notify_all(); }
    }
  }
};

struct event_state {
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t recorded{0};   // generation of the latest record call
  std::uint64_t completed{0};  // highest generation reached by its stream
  std::chrono::steady_clock::time_point when{};
  bool timing{true};
  // The latest record, when it was made on a capturing stream (a capture dependency, not a node).
  std::uint64_t cap_id{0};  ///< graph::id of that capture (0: the latest record was not captured)
  stream* cap_stream{nullptr};
  std::uint64_t cap_count{0};  ///< cap_stream's captured operations at the record
};

/// The handle owns a share of the state; queued record/wait operations own the rest, so destroying an
/// event with work still queued is safe (as cudaEventDestroy is).
struct event {
  std::shared_ptr<event_state> st{std::make_shared<event_state>()};
};

// Every live stream, so that freeing memory can wait for queued work as cudaFree does.
std::mutex registry_mutex;
std::vector<stream*> registry;

void register_stream(stream* s)
{
  std::lock_guard lock{registry_mutex};
  registry.push_back(s);
}
void unregister_stream(stream* s)
{
  std::lock_guard lock{registry_mutex};
  registry.erase(std::remove(registry.begin(), registry.end(), s), registry.end());
}
/// Implicit device synchronization of cudaFree / cudaFreeHost: wait until every stream is idle.
void wait_all_streams() noexcept
{
  std::lock_guard lock{registry_mutex};
  for (stream* s : registry) {
    std::unique_lock sl{s->m};
    s->cv_idle.wait(sl, [&] { return s->queue.empty() && !s->busy; });
  }
}

/// Destroyed streams, kept (their worker joined, their queue empty) so that a handle used after
/// stream_destroy is detected and no new stream ever gets its address: a few hundred bytes per destroyed
/// stream, for the life of the process (the host backend is a test and CI backend).
std::mutex graveyard_mutex;
std::vector<std::unique_ptr<stream>> graveyard;

[[noreturn]] void destroyed_stream(std::string_view call, int line)
{
  host_fail_at(400, "invalid_resource_handle", call, "the stream was destroyed (stream_destroy) before this call",
               line);
}
/// Every call taking a stream validates it: a null or destroyed handle is a host_error, never UB or a hang.
void check_stream_at(const stream* s, std::string_view call, int line)
{
  if (s == nullptr) { host_fail_at(400, "invalid_resource_handle", call, "null stream handle", line); }
  if (s->destroyed.load(std::memory_order_acquire)) { destroyed_stream(call, line); }
}
#define check_stream(s, call) check_stream_at(s, call, __LINE__)

void enqueue(stream* s, node n)
{
  check_stream(s, "enqueue");
  std::lock_guard lock{s->m};
  if (s->stop) { destroyed_stream("enqueue", __LINE__); }
  if (s->capturing != nullptr) {
    s->capturing->nodes.push_back(std::move(n));
    ++s->cap_nodes;
    return;
  }
  s->queue.push_back(n());
  s->cv_work.notify_one();
}

}  // namespace host_detail

using host_detail::enqueue;

void host_backend::set_jitter(std::chrono::microseconds max_delay) noexcept { jitter_us().store(max_delay.count()); }
std::chrono::microseconds host_backend::jitter() noexcept { return std::chrono::microseconds{jitter_us().load()}; }

int host_backend::device_count() const { return emulated_devices(); }
device_id host_backend::current_device() const { return device_id{tls_device}; }
void host_backend::set_device(device_id d) const
{
  if (d.value < 0 || d.value >= emulated_devices()) {
    host_fail(101, "invalid_device", "set_device",
              ferry::detail::format("device {} requested, {} emulated devices", d.value, emulated_devices()));
  }
  tls_device = d.value;
}

device_attributes host_backend::attributes(device_id d) const
{
  if (d.value < 0 || d.value >= emulated_devices()) {
    host_fail(101, "invalid_device", "attributes",
              ferry::detail::format("device {} of {}", d.value, emulated_devices()));
  }
  device_attributes a;
  a.device = d;
  a.name = ferry::detail::format("ferry host-emulated device {}", d.value);
  a.concurrent_managed_access = true;
  a.host_native_atomic_supported = true;
  a.pageable_memory_access = true;
  a.stream_mem_ops_64 = false;
  a.sm_count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return a;
}

host_backend::stream_type host_backend::stream_create() const
{
  auto* s = new host_detail::stream();
  host_detail::register_stream(s);
  return s;
}

void host_backend::stream_destroy(stream_type s) const noexcept
{
  if (s == nullptr || s->destroyed.exchange(true, std::memory_order_acq_rel)) { return; }
  {
    std::lock_guard lock{s->m};
    s->stop = true;  // the worker drains what is queued, then exits (like cudaStreamDestroy)
    s->cv_work.notify_all();
  }
  s->worker.join();
  host_detail::unregister_stream(s);
  std::lock_guard lock{host_detail::graveyard_mutex};
  host_detail::graveyard.emplace_back(s);  // never freed: later uses of the handle are detected (check_stream)
}

void host_backend::stream_synchronize(stream_type s) const
{
  host_detail::check_stream(s, "stream_synchronize");
  std::unique_lock lock{s->m};
  if (s->capturing != nullptr) {
    host_fail(900, "stream_capture_unsupported", "stream_synchronize", "stream is capturing");
  }
  s->cv_idle.wait(lock, [&] { return s->queue.empty() && !s->busy; });
  if (!s->error.empty()) {
    std::string e = std::exchange(s->error, {});
    host_fail(719, "operation_failed", "stream_synchronize", e);
  }
}

bool host_backend::stream_query(stream_type s) const
{
  host_detail::check_stream(s, "stream_query");
  std::lock_guard lock{s->m};
  return s->queue.empty() && !s->busy;
}

bool host_backend::stream_is_capturing(stream_type s) const
{
  host_detail::check_stream(s, "stream_is_capturing");
  std::lock_guard lock{s->m};
  return s->capturing != nullptr;
}

host_backend::event_type host_backend::event_create(event_flags flags) const
{
  auto* e = new host_detail::event();
  e->st->timing = (static_cast<unsigned>(flags) & static_cast<unsigned>(event_flags::disable_timing)) == 0;
  return e;
}

void host_backend::event_destroy(event_type e) const noexcept { delete e; }

void host_backend::event_record(event_type ev, stream_type s) const
{
  host_detail::check_stream(s, "event_record");
  {
    std::lock_guard lock{s->m};
    if (s->capturing != nullptr) {  // a capture dependency only
      std::lock_guard el{ev->st->m};
      ev->st->cap_id = s->capturing->id;
      ev->st->cap_stream = s;
      ev->st->cap_count = s->cap_nodes;
      return;
    }
  }
  {
    std::lock_guard el{ev->st->m};
    ev->st->cap_id = 0;
  }
  event_record_external(ev, s);
}

void host_backend::event_record_external(event_type ev, stream_type s) const
{
  host_detail::check_stream(s, "event_record_external");
  enqueue(s, [e = ev->st]() -> host_detail::op {
    std::uint64_t gen = 0;
    {
      std::lock_guard lock{e->m};
      gen = ++e->recorded;
    }
    return {[e, gen] {
      std::lock_guard lock{e->m};
      if (gen > e->completed) {
        e->completed = gen;
        e->when = std::chrono::steady_clock::now();
      }
      e->cv.notify_all();
    }, /*is_marker=*/true};
  });
}

bool host_backend::event_query(event_type ev) const
{
  auto* e = ev->st.get();
  std::lock_guard lock{e->m};
  return e->completed >= e->recorded;
}

void host_backend::event_synchronize(event_type ev) const
{
  auto* e = ev->st.get();
  std::unique_lock lock{e->m};
  const std::uint64_t target = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= target; });
}

float host_backend::event_elapsed_ms(event_type start_ev, event_type end_ev) const
{
  auto* start = start_ev->st.get();
  auto* end = end_ev->st.get();
  std::scoped_lock lock{start->m, end->m};
  if (!start->timing || !end->timing) {
    host_fail(6, "invalid_resource_handle", "event_elapsed_ms", "an event was created with disable_timing");
  }
  if (start->completed < start->recorded || end->completed < end->recorded || start->completed == 0 ||
      end->completed == 0) {
    host_fail(600, "not_ready", "event_elapsed_ms", "an event has not completed");
  }
  return std::chrono::duration<float, std::milli>(end->when - start->when).count();
}

void host_backend::stream_wait_event(stream_type s, event_type ev) const
{
  host_detail::check_stream(s, "stream_wait_event");
  std::uint64_t cap_id = 0, count = 0;
  host_detail::stream* from = nullptr;
  {
    std::lock_guard el{ev->st->m};
    cap_id = ev->st->cap_id;
    from = ev->st->cap_stream;
    count = ev->st->cap_count;
  }
  if (cap_id != 0) {
    // A wait on a record made during a capture: if that capture is still open, `s` joins it (or, already in
    // it, gains the dependency, which capture order gives at replay), and the origin's wait joins the
    // recording stream back up to the record. No node either way.
    std::lock_guard reg{host_detail::capture_mutex()};
    auto it = host_detail::open_captures().find(cap_id);
    if (it != host_detail::open_captures().end()) {
      host_detail::graph* g = it->second;
      {
        std::lock_guard lock{s->m};
        if (s->capturing == nullptr) {
          s->capturing = g;
          s->cap_nodes = 0;
          s->cap_joined_upto = 0;
          g->joined.push_back(s);
        } else if (s->capturing != g) {
          host_fail(905, "stream_capture_isolation", "stream_wait_event", "the stream is capturing another graph");
        }
      }
      if (s == g->origin && from != nullptr && from != s) {
        std::lock_guard fl{from->m};
        from->cap_joined_upto = std::max(from->cap_joined_upto, count);
      }
      return;
    }
  }
  enqueue(s, [e = ev->st]() -> std::function<void()> {
    std::uint64_t target = 0;
    {
      std::lock_guard lock{e->m};
      target = e->recorded;  // the most recent record at enqueue time, as in CUDA
    }
    return [e, target] {
      std::unique_lock lock{e->m};
      e->cv.wait(lock, [&] { return e->completed >= target; });
    };
  });
}

void* host_backend::allocate_device(std::size_t bytes) const { return aligned_alloc_poisoned(bytes); }
// Frees wait for queued work first, like cudaFree's implicit synchronization: never free storage a
// queued copy or kernel may still touch.
void host_backend::free_device(void* p) const noexcept
{
  host_detail::wait_all_streams();
  aligned_free(p);
}
void* host_backend::allocate_pinned(std::size_t bytes, bool) const { return aligned_alloc_poisoned(bytes); }
void host_backend::free_pinned(void* p) const noexcept
{
  host_detail::wait_all_streams();
  aligned_free(p);
}
void* host_backend::mapped_device_pointer(void* pinned) const { return pinned; }
void host_backend::host_register(void* p, std::size_t bytes) const
{
  if (p == nullptr || bytes == 0) {
    host_fail(1, "invalid_value", "host_register",
              ferry::detail::format("expected a non-empty range, got {} bytes at {}", bytes, p));
  }
  auto& m = backend_memory();
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard l{m.mu};
  if (m.overlaps(a, bytes)) {
    host_fail(712, "host_memory_already_registered", "host_register",
              ferry::detail::format("expected memory not registered nor allocated by this backend, got {} bytes at {} "
                                    "overlapping such a range", bytes, p));
  }
  m.by_base[a] = bytes;
  m.registered[a] = bytes;
}
void host_backend::host_unregister(void* p) const noexcept
{
  if (p == nullptr) { return; }
  host_detail::wait_all_streams();  // no emulated copy into or out of it still queued
  auto& m = backend_memory();
  std::lock_guard l{m.mu};
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (m.registered.erase(a) != 0) { m.by_base.erase(a); }
}
void* host_backend::allocate_managed(std::size_t bytes) const { return aligned_alloc_poisoned(bytes); }
void host_backend::free_managed(void* p) const noexcept
{
  host_detail::wait_all_streams();
  aligned_free(p);
}

void host_backend::mem_advise(void* p, std::size_t, mem_advice, device_id d) const
{
  if (p == nullptr) { host_fail(1, "invalid_value", "mem_advise", "null pointer"); }
  if (d.value < 0 || d.value >= emulated_devices()) {
    host_fail(101, "invalid_device", "mem_advise", ferry::detail::format("device {}", d.value));
  }
}

void host_backend::memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind, stream_type s) const
{
  host_detail::check_stream(s, "memcpy_async");
  if (bytes == 0) { return; }
  if (dst == nullptr || src == nullptr) {
    host_fail(1, "invalid_value", "memcpy_async", ferry::detail::format("null pointer (dst {}, src {})", dst, src));
  }
  // CUDA's rules for the caller's pageable memory (memory this backend did not allocate), outside a capture:
  // a copy from it reads the source before the call returns (staged), a copy into it returns once it is
  // done. Without them a program correct on CUDA (writing its vector right after the call) got wrong bytes
  // here. Copies between the backend's own allocations stay asynchronous.
  if (!stream_is_capturing(s) && (kind == memcpy_kind::host_to_device || kind == memcpy_kind::device_to_host ||
                                  kind == memcpy_kind::automatic)) {
    auto& m = backend_memory();
    const bool src_pageable = kind != memcpy_kind::device_to_host && !m.contains(src);
    const bool dst_pageable = kind != memcpy_kind::host_to_device && !m.contains(dst);
    if (src_pageable && !dst_pageable) {
      auto staged = std::make_shared<std::vector<std::byte>>(static_cast<const std::byte*>(src),
                                                             static_cast<const std::byte*>(src) + bytes);
      enqueue(s, [dst, staged, bytes]() -> std::function<void()> {
        return [dst, staged, bytes] { std::memcpy(dst, staged->data(), bytes); };
      });
      return;
    }
    if (dst_pageable && !src_pageable) {
      enqueue(s, [dst, src, bytes]() -> std::function<void()> {
        return [dst, src, bytes] { std::memcpy(dst, src, bytes); };
      });
      stream_synchronize(s);
      return;
    }
  }
  enqueue(s, [dst, src, bytes]() -> std::function<void()> {
    return [dst, src, bytes] { std::memcpy(dst, src, bytes); };
  });
}

void host_backend::memset_async(void* dst, int value, std::size_t bytes, stream_type s) const
{
  host_detail::check_stream(s, "memset_async");
  if (bytes == 0) { return; }
  if (dst == nullptr) { host_fail(1, "invalid_value", "memset_async", "null pointer"); }
  enqueue(s, [dst, value, bytes]() -> std::function<void()> {
    return [dst, value, bytes] { std::memset(dst, value, bytes); };
  });
}

void host_backend::host_func(stream_type s, std::function<void()> f) const
{
  host_detail::check_stream(s, "host_func");
  enqueue(s, [f = std::move(f)]() -> std::function<void()> { return f; });
}

void host_backend::release_after(stream_type s, std::shared_ptr<void> keep) const
{
  if (!keep) { return; }
  host_detail::check_stream(s, "release_after");
  // The node gives its owner to the operation; the operation drops it when the stream thread runs it.
  enqueue(s, [k = std::move(keep)]() mutable -> std::function<void()> {
    return [k = std::move(k)]() mutable { k.reset(); };
  });
}

void host_backend::check_launch(bool has_fn, const char* name, const launch_config& cfg, stream_type s) const
{
  host_detail::check_stream(s, "launch");
  if (!has_fn) {
    host_fail(98, "invalid_device_function", "launch", ferry::detail::format("kernel '{}' has no body", name));
  }
  const auto empty = [](const dim3& d) { return d.x == 0 || d.y == 0 || d.z == 0; };
  if (empty(cfg.grid) || empty(cfg.block) || cfg.block.x * cfg.block.y * cfg.block.z > 1024) {
    host_fail(9, "invalid_configuration", "launch",
              ferry::detail::format("kernel '{}': grid ({},{},{}) block ({},{},{})", name, cfg.grid.x, cfg.grid.y,
                                    cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z));
  }
}

void host_backend::capture_begin(stream_type s) const
{
  host_detail::check_stream(s, "capture_begin");
  static std::atomic<std::uint64_t> next_id{0};
  std::lock_guard reg{host_detail::capture_mutex()};
  std::lock_guard lock{s->m};
  if (s->capturing != nullptr) { host_fail(900, "stream_capture_unsupported", "capture_begin", "already capturing"); }
  auto* g = new host_detail::graph();
  g->id = ++next_id;
  g->origin = s;
  s->capturing = g;
  s->cap_nodes = 0;
  host_detail::open_captures().emplace(g->id, g);
}

host_backend::graph_type host_backend::capture_end(stream_type s) const
{
  host_detail::check_stream(s, "capture_end");
  std::lock_guard reg{host_detail::capture_mutex()};
  host_detail::graph* g = nullptr;
  {
    std::lock_guard lock{s->m};
    if (s->capturing == nullptr) {
      host_fail(901, "stream_capture_invalidated", "capture_end", "stream is not capturing");
    }
    if (s->capturing->origin != s) {
      host_fail(903, "stream_capture_unmatched", "capture_end", "the stream joined a capture begun on another stream");
    }
    g = std::exchange(s->capturing, nullptr);
  }
  host_detail::open_captures().erase(g->id);
  bool unjoined = false;
  for (host_detail::stream* j : g->joined) {  // every fork must have been joined back to the origin
    std::lock_guard lock{j->m};
    unjoined = unjoined || j->cap_nodes > j->cap_joined_upto;
    j->capturing = nullptr;
  }
  if (unjoined) {
    delete g;
    host_fail(904, "stream_capture_unjoined", "capture_end", "a stream that joined the capture was not joined back");
  }
  return g;
}

host_backend::graph_exec_type host_backend::graph_instantiate(graph_type g) const
{
  return new host_detail::graph_exec{g->nodes};
}

void host_backend::graph_launch(graph_exec_type x, stream_type s) const
{
  host_detail::check_stream(s, "graph_launch");
  std::lock_guard lock{s->m};
  if (s->stop) { host_detail::destroyed_stream("graph_launch", __LINE__); }
  if (s->capturing != nullptr) { host_fail(900, "stream_capture_unsupported", "graph_launch", "stream is capturing"); }
  for (const auto& n : x->nodes) { s->queue.push_back(n()); }
  s->cv_work.notify_one();
}

void host_backend::graph_destroy(graph_type g) const noexcept { delete g; }
void host_backend::graph_exec_destroy(graph_exec_type x) const noexcept { delete x; }

void host_backend::raise_injected(call_kind kind, std::string_view call, const char* where) const
{
  throw host_error("host", 999, ferry::detail::format("injected_{}_fault", to_string(kind)), call, where,
                   "fault injected");
}

}  // namespace ferry::backend
