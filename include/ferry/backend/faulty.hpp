// SPDX-License-Identifier: Apache-2.0
// A fault-injecting decorator over any backend, for reliability tests.
//
//   fault_plan plan;                    // counts every fallible backend call
//   faulty<host_backend> b{&plan};      // behaves exactly like host_backend ...
//   plan.fail_at(7);                    // ... except call #7 (0-based) throws host_backend's own error
//   plan.fail_at(7, /*sticky=*/true);   // ... and every later call too
//
// Release calls (free, destroy) are noexcept and never fail: destructors must not throw.
// Calls are counted across threads (an atomic counter); `plan.log()` lists the calls made so far, so a
// fault sweep can name the call it failed.
#pragma once

#include <ferry/backend/concepts.hpp>

#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

namespace ferry::backend {

class fault_plan {
 public:
  static constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();

  void fail_at(std::uint64_t index, bool sticky = false) noexcept
  {
    fail_at_.store(index);
    sticky_.store(sticky);
  }
  void disarm() noexcept { fail_at_.store(never); }
  /// Restart counting (the next call is #0) and forget the log; keeps the armed index.
  void reset_count()
  {
    calls_.store(0);
    injected_.store(0);
    std::lock_guard lock{m_};
    log_.clear();
  }
  [[nodiscard]] std::uint64_t calls() const noexcept { return calls_.load(); }
  [[nodiscard]] std::uint64_t injected() const noexcept { return injected_.load(); }
  [[nodiscard]] std::vector<std::string> log() const
  {
    std::lock_guard lock{m_};
    return log_;
  }

  /// Counts one call; true when this call must fail.
  [[nodiscard]] bool on_call(call_kind kind, const char* name)
  {
    const std::uint64_t i = calls_.fetch_add(1);
    {
      std::lock_guard lock{m_};
      log_.push_back(std::string{to_string(kind)} + ":" + name);
    }
    const std::uint64_t at = fail_at_.load();
    const bool fail = i == at || (sticky_.load() && at != never && i > at);
    if (fail) { injected_.fetch_add(1); }
    return fail;
  }

 private:
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> injected_{0};
  std::atomic<std::uint64_t> fail_at_{never};
  std::atomic<bool> sticky_{false};
  mutable std::mutex m_;
  std::vector<std::string> log_;
};

template <backend B>
class faulty : public B {
 public:
  faulty() = default;
  explicit faulty(fault_plan* plan, B base = B{}) : B{base}, plan_{plan} {}

  [[nodiscard]] fault_plan* plan() const noexcept { return plan_; }
  [[nodiscard]] const B& base() const noexcept { return *this; }

#define FERRY_FAULTY_FORWARD(kind, fn)                                       \
  template <class... A>                                                      \
  decltype(auto) fn(A&&... a) const                                          \
  {                                                                          \
    check(call_kind::kind, #fn);                                             \
    return B::fn(std::forward<A>(a)...);                                     \
  }
  FERRY_FAULTY_FORWARD(device, set_device)
  FERRY_FAULTY_FORWARD(device, attributes)
  FERRY_FAULTY_FORWARD(stream, stream_create)
  FERRY_FAULTY_FORWARD(wait, stream_synchronize)
  FERRY_FAULTY_FORWARD(query, stream_query)
  FERRY_FAULTY_FORWARD(query, stream_is_capturing)
  // capture_tail: inherited from B, no fault point (a hint that cannot fail: 0 on any error).
  FERRY_FAULTY_FORWARD(event, event_create)
  FERRY_FAULTY_FORWARD(event_record, event_record)
  FERRY_FAULTY_FORWARD(event_record, event_record_external)
  FERRY_FAULTY_FORWARD(query, event_query)
  FERRY_FAULTY_FORWARD(wait, event_synchronize)
  FERRY_FAULTY_FORWARD(query, event_elapsed_ms)
  FERRY_FAULTY_FORWARD(wait, stream_wait_event)
  FERRY_FAULTY_FORWARD(allocate, allocate_device)
  FERRY_FAULTY_FORWARD(allocate, allocate_pinned)
  FERRY_FAULTY_FORWARD(allocate, mapped_device_pointer)
  FERRY_FAULTY_FORWARD(allocate, host_register)
  FERRY_FAULTY_FORWARD(allocate, allocate_managed)
  FERRY_FAULTY_FORWARD(allocate, mem_advise)
  FERRY_FAULTY_FORWARD(copy, memcpy_async)
  FERRY_FAULTY_FORWARD(copy, memset_async)
  FERRY_FAULTY_FORWARD(copy, memcpy_batch_h2d_async)
  FERRY_FAULTY_FORWARD(launch, launch)
  FERRY_FAULTY_FORWARD(graph, capture_begin)
  FERRY_FAULTY_FORWARD(graph, graph_instantiate)
  FERRY_FAULTY_FORWARD(graph, graph_launch)
#undef FERRY_FAULTY_FORWARD

  /// An injected capture_end failure still ends the capture (as a failed cudaStreamEndCapture does: the
  /// stream leaves capture mode and the partial graph is discarded), so the stream stays usable and the
  /// graph is not leaked.
  [[nodiscard]] typename B::graph_type capture_end(typename B::stream_type s) const
  {
    if (plan_ != nullptr && plan_->on_call(call_kind::graph, "capture_end")) {
      try {
        B::graph_destroy(B::capture_end(s));
      } catch (...) {  // the injected error is the one reported
      }
      B::raise_injected(call_kind::graph, "capture_end", __FILE__ ":" FERRY_STRINGIFY(__LINE__));
    }
    return B::capture_end(s);
  }

 private:
  void check(call_kind kind, const char* name) const
  {
    if (plan_ != nullptr && plan_->on_call(kind, name)) {
      B::raise_injected(kind, name, __FILE__ ":" FERRY_STRINGIFY(__LINE__));
    }
  }
  fault_plan* plan_{nullptr};
};

}  // namespace ferry::backend
