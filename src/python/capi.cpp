// SPDX-License-Identifier: Apache-2.0
// The C ABI behind the capsule ferry._ferry._capi (ferry_capi.h): a registry of live channels by integer
// handle, the C ABI calls (each a conversion to the channel's core call: its owner and check become a
// d2h::source_owner), and native sinks. Other native modules (the libtorch op library) reach a channel
// through it without sharing any C++ type with this module.
#include "d2h_channel.hpp"
#include "errors.hpp"

#include <algorithm>
#include <cstring>
#include <shared_mutex>
#include <unordered_map>

namespace ferry::python {

namespace {

/// A channel's liveness for the C ABI: calls hold `m` shared while they run; unregistering sets `alive`
/// false under `m` unique (so it waits for this channel's calls in flight, and only for those).
struct registered {
  channel_calls calls;
  std::shared_ptr<std::shared_mutex> m{std::make_shared<std::shared_mutex>()};
  std::shared_ptr<bool> alive{std::make_shared<bool>(true)};
};

/// Live channels by handle. The registry lock is held only to look a handle up; a call then holds its
/// channel's lock, so a blocked capture (a full ring) never stalls another channel's creation.
struct registry {
  std::shared_mutex mu;
  std::unordered_map<std::uint64_t, registered> map;
  std::uint64_t next{1};
  static registry& get()
  {
    static auto* r = new registry;  // never destroyed: native modules may call during teardown
    return *r;
  }
  /// Runs f(calls) while the channel stays registered; logic_error for an unknown or removed handle.
  template <class F>
  void with(std::uint64_t h, F&& f)
  {
    registered r;
    {
      std::shared_lock lk{mu};
      if (auto it = map.find(h); it != map.end()) { r = it->second; }
    }
    std::shared_lock l{*r.m};
    FERRY_EXPECTS(r.calls.self != nullptr && *r.alive, ferry::logic_error,
                  "C ABI: expected the handle of a live ferry.Channel, got {} (unknown, or its channel was destroyed)",
                  h);
    f(r.calls);
  }
};

void put(char* err, std::size_t len, const char* msg) noexcept
{
  if (err == nullptr || len == 0) { return; }
  const std::size_t n = std::min(len - 1, std::strlen(msg));
  std::memcpy(err, msg, n);
  err[n] = '\0';
}

/// Runs f() with the GIL released if this thread holds it; maps ferry's exceptions to a ferry_status.
template <class F>
int guarded(char* err, std::size_t len, bool release_gil, F&& f) noexcept
{
  PyThreadState* ts =
    (release_gil && Py_IsInitialized() != 0 && PyGILState_Check() != 0) ? PyEval_SaveThread() : nullptr;
  int rc = FERRY_OK;
  try {
    f();
    put(err, len, "");
  } catch (const std::exception& e) {
    rc = status_of(e);
    put(err, len, e.what());
  } catch (...) {
    rc = FERRY_ERR_OTHER;
    put(err, len, "ferry C ABI: unknown exception");
  }
  if (ts != nullptr) { PyEval_RestoreThread(ts); }
  return rc;
}

/// A C ABI caller's owner: given back through keep_alive exactly once, checked through unchanged.
struct capi_owner {
  void (*keep_alive)(void*);
  int (*unchanged)(void*);
  void* owner;
  capi_owner(void (*k)(void*), int (*u)(void*), void* o) noexcept : keep_alive{k}, unchanged{u}, owner{o} {}
  capi_owner(const capi_owner&) = delete;
  capi_owner& operator=(const capi_owner&) = delete;
  ~capi_owner()
  {
    if (keep_alive != nullptr) { keep_alive(owner); }
  }
  static std::size_t check(void* const* owners, std::size_t n)
  {
    for (std::size_t i = 0; i < n; ++i) {
      const auto* o = static_cast<const capi_owner*>(owners[i]);
      if (o->unchanged != nullptr && o->unchanged(o->owner) == 0) { return i; }
    }
    return n;
  }
};

int capture_any(std::uint64_t channel, std::uint32_t hook, const void* ptr, std::uint64_t bytes, std::uintptr_t stream,
                void (*keep_alive)(void*), int (*unchanged)(void*), void* owner, bool deferred, char* err,
                std::size_t len)
{
  // The owner goes back exactly once: when the copy no longer needs the bytes, or now if nothing was enqueued.
  fd::source_owner o;
  if (keep_alive != nullptr || unchanged != nullptr) {
    try {
      o.keep = std::make_shared<capi_owner>(keep_alive, unchanged, owner);
    } catch (...) {
      if (keep_alive != nullptr) { keep_alive(owner); }
      put(err, len, "ferry C ABI: capture: out of host memory");
      return FERRY_ERR_OOM;
    }
    o.unchanged = deferred ? &capi_owner::check : nullptr;
  }
  return guarded(err, len, true, [&] {
    registry::get().with(channel, [&](const channel_calls& c) {
      o.host_written = c.backend == FERRY_BACKEND_HOST;  // the C ABI's host-backend sources are host memory
      c.capture(c.self, hook, ptr, bytes, stream, std::move(o), deferred);
    });
  });
}

int capture(std::uint64_t channel, std::uint32_t hook, const void* ptr, std::uint64_t bytes, std::uintptr_t stream,
            void (*keep_alive)(void*), void* owner, char* err, std::size_t len)
{
  return capture_any(channel, hook, ptr, bytes, stream, keep_alive, nullptr, owner, false, err, len);
}

int capture_deferred(std::uint64_t channel, std::uint32_t hook, const void* ptr, std::uint64_t bytes,
                     std::uintptr_t stream, void (*keep_alive)(void*), int (*unchanged)(void*), void* owner, char* err,
                     std::size_t len)
{
  return capture_any(channel, hook, ptr, bytes, stream, keep_alive, unchanged, owner, true, err, len);
}

int capture_rows(std::uint64_t channel, std::uint32_t hook, const void* ptr, std::uint64_t n_rows,
                 std::uint64_t row_bytes, const ferry_row_selection* sel, std::uintptr_t stream,
                 void (*keep_alive)(void*), void* owner, char* err, std::size_t len)
{
  fd::source_owner o;
  if (keep_alive != nullptr) {
    try {
      o.keep = std::make_shared<capi_owner>(keep_alive, nullptr, owner);
    } catch (...) {
      keep_alive(owner);
      put(err, len, "ferry C ABI: capture_rows: out of host memory");
      return FERRY_ERR_OOM;
    }
  }
  return guarded(err, len, true, [&] {
    FERRY_EXPECTS(sel != nullptr && sel->form <= 2, ferry::logic_error,
                  "ferry C ABI capture_rows (hook {}): expected a selection of form 0, 1 or 2, got {}", hook,
                  sel == nullptr ? std::string{"NULL"} : std::to_string(sel->form));
    const fd::row_selection s{static_cast<fd::selection_form>(sel->form), sel->index_bytes, sel->indices,
                              sel->query_start_loc, sel->n_requests, sel->window_begin, sel->window_end,
                              sel->count, sel->device_count, sel->max_count};
    registry::get().with(channel, [&](const channel_calls& c) {
      o.host_written = c.backend == FERRY_BACKEND_HOST;
      c.capture_rows(c.self, hook, ptr, n_rows, row_bytes, s, stream, std::move(o));
    });
  });
}

int flush(std::uint64_t channel, std::uintptr_t stream, char* err, std::size_t len)
{
  return guarded(err, len, true,
                 [&] { registry::get().with(channel, [&](const channel_calls& c) { c.flush(c.self, stream); }); });
}

int channel_info(std::uint64_t channel, int* backend, int* device, std::uint32_t* flags, char* err, std::size_t len)
{
  return guarded(err, len, false, [&] {
    registry::get().with(channel, [&](const channel_calls& c) {
      if (backend != nullptr) { *backend = c.backend; }
      if (device != nullptr) { *device = c.device; }
      if (flags != nullptr) { *flags = c.flags(c.self); }
    });
  });
}

/// The table in the ferry._ferry._capi capsule (static storage: the capsule never frees it).
const ferry_capi* capi_table()
{
  static const ferry_capi t{FERRY_CAPI_VERSION, sizeof(ferry_capi), &capture, &channel_info, &set_python_error,
                            &capture_deferred, &flush, &capture_rows};
  return &t;
}

}  // namespace

std::uint64_t register_channel(const channel_calls& c)
{
  auto& r = registry::get();
  std::unique_lock lk{r.mu};
  const std::uint64_t h = r.next++;
  r.map.emplace(h, registered{c});
  return h;
}

void unregister_channel(std::uint64_t handle)
{
  auto& r = registry::get();
  registered e;
  {
    std::unique_lock lk{r.mu};
    auto it = r.map.find(handle);
    if (it == r.map.end()) { return; }
    e = it->second;
    r.map.erase(it);
  }
  std::unique_lock l{*e.m};
  *e.alive = false;
}

namespace {

/// `obj` as a native sink of this module (ferry.sinks), or null.
py_sink* native_sink_of(nb::handle obj)
{
  py_sink* p = nullptr;
  if (!obj.is_valid() || obj.is_none() || !nb::try_cast<py_sink*>(obj, p)) { return nullptr; }
  return p;
}

}  // namespace

fd::sink_ref sink_ref_of(nb::handle sink)
{
  if (!sink.is_valid() || sink.is_none()) { return fd::sink_ref{fd::sink_ref::callback_type{}}; }
  if (py_sink* p = native_sink_of(sink); p != nullptr) { return p->ref(); }  // ferry.sinks.*: C++ takes the views
  FERRY_EXPECTS(PyCapsule_CheckExact(sink.ptr()) != 0 && PyCapsule_IsValid(sink.ptr(), FERRY_SINK_NAME) != 0,
                ferry::logic_error, "Channel: expected sink to be a ferry.sinks sink or a PyCapsule named '{}', got {}",
                FERRY_SINK_NAME, type_of(sink));
  const auto* s = static_cast<const ferry_sink*>(PyCapsule_GetPointer(sink.ptr(), FERRY_SINK_NAME));
  FERRY_EXPECTS(s != nullptr && s->fn != nullptr && s->version == FERRY_SINK_VERSION, ferry::logic_error,
                "Channel: expected a ferry_sink of version {} with a function, got version {}{}", FERRY_SINK_VERSION,
                s != nullptr ? s->version : 0U, s != nullptr && s->fn == nullptr ? " without one" : "");
  // Runs on the drain thread, no GIL: the entry's staging goes back when the view dies after fn.
  return fd::sink_ref{[fn = s->fn, ctx = s->ctx](fd::entry_view&& v) {
    ferry_entry e{v.hook().value, v.ok() ? 1U : 0U, v.seq().value, v.size(), nullptr};
    if (v.ok()) { e.data = v.bytes().data(); }
    fn(ctx, &e);
  }};
}

nb::object sink_stats(nb::handle sink)
{
  py_sink* p = native_sink_of(sink);
  return p != nullptr ? nb::object(p->stats()) : nb::none();
}

void init_capi(nb::module_& m)
{
  m.attr("_capi") = nb::steal(PyCapsule_New(const_cast<ferry_capi*>(capi_table()), FERRY_CAPI_NAME, nullptr));
}

}  // namespace ferry::python
