// SPDX-License-Identifier: Apache-2.0
// The GIL and object lifetime across ferry's threads: releasing the GIL for a blocking call, the interpreter
// exit (what live objects settle first: exit_hooks; then no call releases the GIL), and Python references that
// a thread without the GIL gives up (a source owner released on the host backend's stream thread): they wait
// in a graveyard until a binding call drains it with the GIL held.
#pragma once

#include <Python.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace ferry::python {

/// Interpreter exit. CPython (before 3.14) ends a daemon thread that takes the GIL back after finalization
/// began with pthread_exit, and its forced unwinding through a C++ destructor (a GIL guard's) aborts the
/// whole process ("terminate called without an active exception"): a daemon thread polling a channel at
/// exit would crash the interpreter. ferry's atexit hook (module.cpp; atexit runs before finalization)
/// marks the exit, then waits, the GIL released, at most `exit_wait` for every ferry call that released
/// the GIL to take it back; from then on no ferry call releases the GIL and poll() does not wait, so such a
/// thread ends in Python code, outside ferry. (A call still blocked after exit_wait is not covered.)
struct exit_state {
  static constexpr std::chrono::seconds exit_wait{2};
  std::atomic<bool> exiting{false};
  std::mutex mu;
  std::condition_variable cv;
  int in_flight{0};  ///< calls between releasing and retaking the GIL (guarded by mu)
};
/// The process-wide exit state (never destroyed: threads may still use it while the module is torn down).
[[nodiscard]] inline exit_state& exit_state_of_process()
{
  static auto* s = new exit_state;
  return *s;
}
[[nodiscard]] inline bool interpreter_exiting() noexcept
{
  return exit_state_of_process().exiting.load(std::memory_order_acquire);
}

/// Releases the GIL for a blocking or long call (nb::gil_scoped_release), except after interpreter exit
/// began (exit_state); counted, so the atexit hook can wait for the call to take the GIL back.
/// Construct it with the GIL held.
class gil_release {
 public:
  gil_release()
  {
    if (interpreter_exiting()) { return; }  // read under the GIL: the hook sets it under the GIL too
    auto& st = exit_state_of_process();
    {
      std::lock_guard l{st.mu};
      ++st.in_flight;
    }
    save_ = PyEval_SaveThread();
  }
  ~gil_release()
  {
    if (save_ == nullptr) { return; }
    PyEval_RestoreThread(save_);
    auto& st = exit_state_of_process();
    std::lock_guard l{st.mu};
    if (--st.in_flight == 0) { st.cv.notify_all(); }
  }
  gil_release(const gil_release&) = delete;
  gil_release& operator=(const gil_release&) = delete;

 private:
  PyThreadState* save_{nullptr};
};

/// What live objects settle at interpreter exit, before the exit is marked (every stream and tensor is still
/// alive then; module teardown may destroy a stream before the channel that uses it): a Channel with a
/// forward open ends it and says so in one line (d2h_poll.cpp). An object adds itself once (construction)
/// and removes itself with the GIL held before it is destroyed; the hooks run with the GIL held and never
/// release it, so no object is destroyed while its hook runs.
class exit_hooks {
 public:
  using hook = void (*)(void*);
  static exit_hooks& get()
  {
    static auto* h = new exit_hooks;  // never destroyed: objects may remove themselves during teardown
    return *h;
  }
  void add(void* self, hook fn)
  {
    std::lock_guard l{mu_};
    hooks_.emplace_back(self, fn);
  }
  void remove(void* self) noexcept
  {
    std::lock_guard l{mu_};
    for (auto it = hooks_.begin(); it != hooks_.end(); ++it) {
      if (it->first == self) {
        hooks_.erase(it);
        return;
      }
    }
  }
  /// Runs every hook once, in the order added (the GIL held); a hook added meanwhile does not run.
  void run()
  {
    std::vector<std::pair<void*, hook>> todo;
    {
      std::lock_guard l{mu_};
      todo = hooks_;
    }
    for (auto& [self, fn] : todo) {
      bool live = false;
      {
        std::lock_guard l{mu_};
        for (const auto& h : hooks_) { live = live || h.first == self; }
      }
      if (live) { fn(self); }
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<void*, hook>> hooks_;
};

/// The atexit hook's body (called with the GIL held): runs the exit hooks, marks the exit, then waits, the
/// GIL released, up to exit_wait for the calls in flight to take the GIL back.
inline void on_interpreter_exit()
{
  exit_hooks::get().run();
  auto& st = exit_state_of_process();
  st.exiting.store(true, std::memory_order_release);
  PyThreadState* save = PyEval_SaveThread();
  {
    std::unique_lock l{st.mu};
    st.cv.wait_for(l, exit_state::exit_wait, [&] { return st.in_flight == 0; });
  }
  PyEval_RestoreThread(save);
}

/// Objects whose last owner let go without the GIL: destroyed by drain_released() with the GIL held.
class graveyard {
 public:
  using deleter = void (*)(void*);
  static graveyard& get()
  {
    static auto* g = new graveyard;  // never destroyed: threads may still give objects up at exit
    return *g;
  }
  /// Destroys `p` with `del` now when this thread holds the GIL, else at the next drain().
  void give(void* p, deleter del)
  {
    if (PyGILState_Check() != 0) {
      del(p);
      return;
    }
    std::lock_guard l{mu_};
    dead_.push_back({p, del});
    pending_.store(true, std::memory_order_release);
  }
  /// Destroys what was given up without the GIL (the caller holds it). Nothing after interpreter exit.
  void drain()
  {
    if (!pending_.load(std::memory_order_acquire) || interpreter_exiting()) { return; }
    std::vector<std::pair<void*, deleter>> d;
    {
      std::lock_guard l{mu_};
      d.swap(dead_);
      pending_.store(false, std::memory_order_relaxed);
    }
    for (auto& [p, del] : d) { del(p); }
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<void*, deleter>> dead_;
  std::atomic<bool> pending_{false};
};

/// Drains the graveyard at the end of a binding call (the GIL held again).
inline void drain_released() { graveyard::get().drain(); }

}  // namespace ferry::python
