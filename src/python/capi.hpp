// SPDX-License-Identifier: Apache-2.0
// The C ABI behind the capsule ferry._ferry._capi (ferry_capi.h): a registry of live channels by integer
// handle, and the exception -> ferry_status mapping. Other native modules (the libtorch op library) reach a
// channel through it without sharing any C++ type with this module.
#pragma once

#include "common.hpp"
#include "ferry_capi.h"

#include <ferry/d2h/errors.hpp>
#include <ferry/error.hpp>

#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace ferry::python {

/// A channel's liveness for the C ABI: calls hold `m` shared while they run; the channel's destructor sets
/// `alive` false under `m` unique (so it waits for this channel's calls in flight, and only for those).
struct channel_life {
  std::shared_mutex m;
  bool alive{true};
};

/// Type-erased entry points of one live channel (py_channel<B> registers itself).
struct channel_slot {
  void* self{nullptr};
  int backend{FERRY_BACKEND_HOST};
  int device{0};
  /// capture(self, hook, ptr, bytes, stream, keep): throws ferry's errors.
  void (*capture)(void* self, std::uint32_t hook, const void* ptr, std::uint64_t bytes, std::uintptr_t stream,
                  std::shared_ptr<void> keep){nullptr};
  /// capture_deferred(self, hook, ptr, bytes, stream, keep, unchanged, owner): throws ferry's errors.
  void (*capture_deferred)(void* self, std::uint32_t hook, const void* ptr, std::uint64_t bytes, std::uintptr_t stream,
                           std::shared_ptr<void> keep, int (*unchanged)(void*), void* owner){nullptr};
  /// flush(self, stream): throws ferry's errors.
  void (*flush)(void* self, std::uintptr_t stream){nullptr};
  /// FERRY_INFO_* flags of the channel's open forward.
  std::uint32_t (*flags)(void* self){nullptr};
  std::shared_ptr<channel_life> life;
};

/// Live channels by handle. The registry lock is held only to look a handle up; a call then holds its
/// channel's life lock, so a blocked capture (a full ring) never stalls another channel's creation.
class channel_registry {
 public:
  static channel_registry& get()
  {
    static channel_registry r;
    return r;
  }
  [[nodiscard]] std::uint64_t add(const channel_slot& s)
  {
    std::unique_lock lk{mu_};
    const std::uint64_t h = next_++;
    map_.emplace(h, s);
    return h;
  }
  /// Unregisters `h`, then waits for its calls in flight; none starts after this returns.
  void remove(std::uint64_t h)
  {
    std::shared_ptr<channel_life> life;
    {
      std::unique_lock lk{mu_};
      auto it = map_.find(h);
      if (it == map_.end()) { return; }
      life = it->second.life;
      map_.erase(it);
    }
    std::unique_lock l{life->m};
    life->alive = false;
  }
  /// Runs f(slot) while the channel stays alive; logic_error for an unknown or destroyed handle.
  template <class F>
  void with(std::uint64_t h, F&& f)
  {
    channel_slot s;
    {
      std::shared_lock lk{mu_};
      auto it = map_.find(h);
      if (it != map_.end()) { s = it->second; }
    }
    std::shared_lock<std::shared_mutex> l;
    if (s.life) { l = std::shared_lock{s.life->m}; }
    FERRY_EXPECTS(s.life && s.life->alive, ferry::logic_error,
                  "C ABI: expected the handle of a live ferry.Channel, got {} (unknown, or its channel was "
                  "destroyed)",
                  h);
    f(s);
  }

 private:
  std::shared_mutex mu_;
  std::unordered_map<std::uint64_t, channel_slot> map_;
  std::uint64_t next_{1};
};

namespace capi_detail {

inline void put(char* err, std::size_t len, const char* msg) noexcept
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
  } catch (const ferry::logic_error& e) {
    rc = FERRY_ERR_LOGIC;
    put(err, len, e.what());
  } catch (const ferry::out_of_memory& e) {
    rc = FERRY_ERR_OOM;
    put(err, len, e.what());
  } catch (const ferry::timeout_error& e) {
    rc = FERRY_ERR_TIMEOUT;
    put(err, len, e.what());
  } catch (const ferry::invalidated_error& e) {
    rc = FERRY_ERR_INVALIDATED;
    put(err, len, e.what());
  } catch (const ferry::backend_error& e) {
    rc = FERRY_ERR_BACKEND;
    put(err, len, e.what());
  } catch (const std::exception& e) {
    rc = FERRY_ERR_OTHER;
    put(err, len, e.what());
  } catch (...) {
    rc = FERRY_ERR_OTHER;
    put(err, len, "ferry C ABI: unknown exception");
  }
  if (ts != nullptr) { PyEval_RestoreThread(ts); }
  return rc;
}

inline int capture(std::uint64_t channel, std::uint32_t hook, const void* ptr, std::uint64_t bytes,
                   std::uintptr_t stream, void (*keep_alive)(void*), void* owner, char* err, std::size_t len)
{
  // The owner goes back exactly once: when the copy read the bytes, or now if nothing was enqueued.
  std::shared_ptr<void> keep;
  if (keep_alive != nullptr) {
    try {
      keep = std::shared_ptr<void>(owner, keep_alive);
    } catch (...) {
      keep_alive(owner);
      put(err, len, "ferry C ABI: capture: out of host memory");
      return FERRY_ERR_OOM;
    }
  }
  return guarded(err, len, true, [&] {
    channel_registry::get().with(channel,
                                 [&](const channel_slot& s) { s.capture(s.self, hook, ptr, bytes, stream, std::move(keep)); });
  });
}

inline int capture_deferred(std::uint64_t channel, std::uint32_t hook, const void* ptr, std::uint64_t bytes,
                            std::uintptr_t stream, void (*keep_alive)(void*), int (*unchanged)(void*), void* owner,
                            char* err, std::size_t len)
{
  std::shared_ptr<void> keep;
  if (keep_alive != nullptr) {
    try {
      keep = std::shared_ptr<void>(owner, keep_alive);
    } catch (...) {
      keep_alive(owner);
      put(err, len, "ferry C ABI: capture_deferred: out of host memory");
      return FERRY_ERR_OOM;
    }
  }
  return guarded(err, len, true, [&] {
    channel_registry::get().with(channel, [&](const channel_slot& s) {
      s.capture_deferred(s.self, hook, ptr, bytes, stream, std::move(keep), unchanged, owner);
    });
  });
}

inline int flush(std::uint64_t channel, std::uintptr_t stream, char* err, std::size_t len)
{
  return guarded(err, len, true,
                 [&] { channel_registry::get().with(channel, [&](const channel_slot& s) { s.flush(s.self, stream); }); });
}

inline int channel_info(std::uint64_t channel, int* backend, int* device, std::uint32_t* flags, char* err,
                        std::size_t len)
{
  return guarded(err, len, false, [&] {
    channel_registry::get().with(channel, [&](const channel_slot& s) {
      if (backend != nullptr) { *backend = s.backend; }
      if (device != nullptr) { *device = s.device; }
      if (flags != nullptr) { *flags = s.flags(s.self); }
    });
  });
}

inline void set_python_error(int status, const char* msg)
{
  auto& x = errors();
  PyObject* t = x.error;
  switch (status) {
    case FERRY_ERR_LOGIC: t = x.logic; break;
    case FERRY_ERR_OOM: t = x.oom; break;
    case FERRY_ERR_TIMEOUT: t = x.timeout; break;
    case FERRY_ERR_INVALIDATED: t = x.invalidated; break;
    case FERRY_ERR_BACKEND: t = x.backend; break;
    default: break;
  }
  PyErr_SetString(t, msg);
}

}  // namespace capi_detail

/// The table in the ferry._ferry._capi capsule (static storage: the capsule never frees it).
inline const ferry_capi* capi_table()
{
  static const ferry_capi t{FERRY_CAPI_VERSION, sizeof(ferry_capi), &capi_detail::capture, &capi_detail::channel_info,
                              &capi_detail::set_python_error, &capi_detail::capture_deferred,
                              &capi_detail::flush};
  return &t;
}

}  // namespace ferry::python
