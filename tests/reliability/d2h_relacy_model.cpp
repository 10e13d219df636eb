// SPDX-License-Identifier: Apache-2.0
// Relacy model of the D2H task-ring publication protocol (spec: d2h-task-ring-publication.txt,
// implementation: include/ferry/d2h/channel.hpp).
//
//   thread 0 ("GPU producer" = CPU reserve + copy kernel + batched publish)
//     for seq in 0..N-1:
//       reserve ring space: wait until seq - reclaimed < C (acquire); while waiting, flush the
//         unpublished entries with a release of published_head (channel::wait_for_space does this);
//       the CPU FIFO entry (seq, offset, reserved, size_slot) is CPU-known (computed by both sides);
//       write the payload words into ring slot seq % C (rl::var, value = f(seq, word));
//       dynamic entries: write the GPU-resolved actual size (<= reserved) into size_slot;
//       produced = seq + 1; every K entries and at each forward boundary (and at the end):
//         published_head.store(produced, release)       <- the one system-scope release per batch
//   thread 1 (CPU drainer)
//     H = published_head.load(acquire); only then "submit the D2H" for entries [drained, H):
//       read the size slot and every payload word, check them (no lost / stale / torn entry);
//       check head monotonic, in-flight <= C, actual <= reserved;
//     after the copy completed: reclaimed.store(H, release)   (ring + size slots reusable)
//
// Mutants (template parameter; also -DFERRY_MUTANT=relaxed_publish|early_reclaim for a hand build
// whose default mode is that mutant):
//   relaxed_publish : published_head is stored memory_order_relaxed  -> data race on the payload vars
//   early_reclaim   : ring space is released before the copy reads the payload -> the producer
//                     overwrites a slot the copy still reads (data race / stale-value assert)
//   size_after_release : a dynamic entry's size slot (a GPU-resolved size: capture_dynamic, capture_rows) is
//                     written after the release that publishes it -> the drain reads it unordered (data race)
//
// Usage: d2h_relacy_model [model|relaxed_publish|early_reclaim|size_after_release|all] [--iterations N] [--bound B] [--verbose]
//   model           : every correct configuration must pass (exit 0), else exit 1
//   <mutant>        : every configuration must be CAUGHT by relacy (exit 0), else exit 1
#include <relacy/relacy.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <ostream>
#include <streambuf>
#include <string>

namespace {

enum class mutant { none, relaxed_publish, early_reclaim, size_after_release };

const char* name(mutant m)
{
  switch (m) {
    case mutant::none: return "model";
    case mutant::relaxed_publish: return "relaxed_publish";
    case mutant::early_reclaim: return "early_reclaim";
    case mutant::size_after_release: return "size_after_release";
  }
  return "?";
}

constexpr unsigned kWords = 3;  // payload words per ring slot (the entry's reservation upper bound)

/// Value of payload word `w` of entry `seq` (never 0: 0 is the "never written" sentinel).
constexpr std::uint64_t payload(std::uint64_t seq, unsigned w) { return (seq + 1) * 1000 + w + 1; }
/// Entries with odd seq are dynamic: their actual size is GPU-resolved, 1..kWords words.
constexpr bool is_dynamic(std::uint64_t seq) { return (seq & 1) != 0; }
constexpr unsigned actual_words(std::uint64_t seq) { return is_dynamic(seq) ? 1 + unsigned(seq / 2 % kWords) : kWords; }

/// One CPU FIFO entry: everything the CPU knows before the GPU runs.
struct fifo_entry {
  std::uint64_t seq;
  unsigned offset;     // first word of the entry's ring slot: (seq % C) * kWords
  unsigned reserved;   // reservation upper bound, in words
  int size_slot;       // -1 for a static entry; else dyn_index % C (one slot per outstanding dynamic entry)
};

template <unsigned C>
constexpr fifo_entry fifo_at(std::uint64_t seq)
{
  return fifo_entry{seq, unsigned(seq % C) * kWords, kWords, is_dynamic(seq) ? int((seq / 2) % C) : -1};
}

/// K: publish every K entries; C: ring capacity (entries); N: entries in the run; F: entries per forward.
template <unsigned K, unsigned C, unsigned N, unsigned F, mutant M>
struct d2h_model : rl::test_suite<d2h_model<K, C, N, F, M>, 2> {
  static_assert(K >= 1 && C >= 1 && N >= 1 && F >= 1);

  rl::var<std::uint64_t> ring[C * kWords];  // GPU payload ring (device memory)
  rl::var<std::uint64_t> size_ring[C];      // managed size slots of dynamic entries
  rl::atomic<std::uint64_t> published_head;  // CPU/GPU-shared, system-scope release/acquire
  rl::atomic<std::uint64_t> reclaimed;       // entries whose D2H completed (ring space free)

  void before()
  {
    for (auto& w : ring) { w($) = 0; }
    for (auto& s : size_ring) { s($) = 0; }
    published_head.store(0, rl::memory_order_relaxed);
    reclaimed.store(0, rl::memory_order_relaxed);
  }

  void publish(std::uint64_t produced)
  {
    if constexpr (M == mutant::relaxed_publish) {
      published_head.store(produced, rl::memory_order_relaxed);
    } else {
      published_head.store(produced, rl::memory_order_release);
    }
  }

  void producer()
  {
    std::uint64_t published = 0;
    for (std::uint64_t seq = 0; seq < N; ++seq) {
      const fifo_entry e = fifo_at<C>(seq);
      // Reserve ring space: the slot is reusable only once the CPU reclaimed it after its D2H completed.
      rl::backoff b;
      for (;;) {
        const std::uint64_t rec = reclaimed.load(rl::memory_order_acquire);
        RL_ASSERT(rec <= seq);
        if (seq - rec < C) { break; }
        if (published < seq) {  // flush-on-full: never wait on space held by unpublished entries
          publish(seq);
          published = seq;
        }
        b.yield($);
      }
      // Copy kernel: payload words (only the actual size for a dynamic entry) and the size slot.
      const unsigned actual = actual_words(seq);
      RL_ASSERT(actual >= 1 && actual <= e.reserved);
      for (unsigned w = 0; w < actual; ++w) { ring[e.offset + w]($) = payload(seq, w); }
      // The size slot is written before the release that publishes the entry (the copy kernel's and the
      // selection kernel's commit, ring_ref::commit(c, actual)); the mutant writes it after that release.
      if (e.size_slot >= 0 && M != mutant::size_after_release) { size_ring[e.size_slot]($) = actual; }
      const std::uint64_t produced = seq + 1;
      const bool batch = (produced - published) >= K;
      const bool forward_end = produced % F == 0 || produced == N;
      if (batch || forward_end) {  // writer join, then one release per batch / forward
        publish(produced);
        published = produced;
      }
      if (e.size_slot >= 0 && M == mutant::size_after_release) { size_ring[e.size_slot]($) = actual; }
    }
    RL_ASSERT(published == N);  // a partial batch never stays hidden
  }

  void drainer()
  {
    std::uint64_t last_head = 0;  // highest published_head acquired
    std::uint64_t drained = 0;    // entries copied and reclaimed
    while (drained < N) {
      const std::uint64_t h = published_head.load(rl::memory_order_acquire);
      RL_ASSERT(h >= last_head);  // monotonic
      RL_ASSERT(h <= N);
      last_head = h;
      if (h == drained) {
        rl::backoff b;
        b.yield($);
        continue;
      }
      // Everything in [drained, h) is published and not yet reclaimed: it must fit in the ring.
      RL_ASSERT(h - drained <= C);
      if constexpr (M == mutant::early_reclaim) {
        reclaimed.store(h, rl::memory_order_release);  // BUG: space released when the D2H is enqueued
      }
      // "D2H" of the newly published range: read sizes and payload, check every word.
      for (std::uint64_t seq = drained; seq < h; ++seq) {
        const fifo_entry e = fifo_at<C>(seq);
        unsigned actual = e.reserved;
        if (e.size_slot >= 0) {
          const std::uint64_t sz = size_ring[e.size_slot]($);
          RL_ASSERT(sz >= 1);           // written (not lost / stale sentinel)
          RL_ASSERT(sz <= e.reserved);  // actual <= reserved
          RL_ASSERT(sz == actual_words(seq));
          actual = unsigned(sz);
        }
        for (unsigned w = 0; w < actual; ++w) {
          const std::uint64_t v = ring[e.offset + w]($);
          RL_ASSERT(v == payload(seq, w));  // no lost, stale (older seq) or torn (mixed) entry
        }
      }
      if constexpr (M != mutant::early_reclaim) {
        reclaimed.store(h, rl::memory_order_release);  // copy complete: ring + size slots reusable
      }
      drained = h;
    }
  }

  void thread(unsigned idx)
  {
    if (idx == 0) {
      producer();
    } else {
      drainer();
    }
  }
};

struct run_opts {
  rl::iteration_t iterations{0};
  unsigned bound{3};
  bool verbose{false};
};

struct outcome {
  bool passed;             // relacy found no failure
  rl::test_result_e result;
  rl::iteration_t stop_iteration;
  unsigned ms;
  std::string log;
};

/// Relacy replaces the global operator new/delete while it simulates, so a std::ostringstream that grows
/// inside the simulation (history output) frees its buffer through relacy and aborts. This stream buffer
/// captures into fixed storage and never allocates; text past the capacity is dropped.
class capture_buf : public std::streambuf {
 public:
  capture_buf() { reset(); }
  void reset() { setp(buf_, buf_ + sizeof buf_); }
  std::string str() const { return std::string(pbase(), pptr()); }

 protected:
  int_type overflow(int_type ch) override { return traits_type::not_eof(ch); }  // full: drop

 private:
  char buf_[1 << 20];
};

template <class Test>
outcome run_one(rl::scheduler_type_e sched, rl::iteration_t iterations, unsigned context_bound = 1)
{
  static capture_buf buf;  // 1 MiB, not on the stack
  buf.reset();
  std::ostream out(&buf);
  rl::test_params p;
  p.iteration_count = iterations;
  p.search_type = sched;
  p.context_bound = context_bound;
  p.output_stream = &out;
  p.progress_stream = &out;
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = rl::simulate<Test>(p);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  return outcome{ok, p.test_result, p.stop_iteration, unsigned(ms), buf.str()};
}

/// First `n` lines of a relacy log (the failure kind and the start of the history).
std::string head_lines(const std::string& s, int n)
{
  std::size_t pos = 0;
  for (int i = 0; i < n && pos != std::string::npos; ++i) {
    pos = s.find('\n', pos);
    if (pos != std::string::npos) { ++pos; }
  }
  return pos == std::string::npos ? s : s.substr(0, pos);
}

template <unsigned K, unsigned C, unsigned N, unsigned F, mutant M>
bool run_config(const run_opts& o)
{
  using T = d2h_model<K, C, N, F, M>;
  char cfg[96];
  std::snprintf(cfg, sizeof cfg, "K=%u C=%u N=%u F=%u words=%u", K, C, N, F, kWords);
  if constexpr (M == mutant::none) {
    // Correct model: random schedules, then a context-bounded systematic search.
    const rl::iteration_t it = o.iterations ? o.iterations : 200000;
    const outcome r = run_one<T>(rl::sched_random, it);
    std::printf("[%s] %s sched_random: %s after %llu iterations (%u ms)\n", name(M), cfg,
                r.passed ? "PASS" : "FAIL", (unsigned long long)r.stop_iteration, r.ms);
    if (!r.passed || o.verbose) { std::printf("%s\n", head_lines(r.log, r.passed ? 8 : 200).c_str()); }
    if (!r.passed) { return false; }
    const outcome b = run_one<T>(rl::sched_bound, 0, o.bound);
    std::printf("[%s] %s sched_bound(context_bound=%u, exhaustive within the bound): %s after %llu "
                "iterations (%u ms)\n",
                name(M), cfg, o.bound, b.passed ? "PASS" : "FAIL", (unsigned long long)b.stop_iteration, b.ms);
    if (!b.passed || o.verbose) { std::printf("%s\n", head_lines(b.log, b.passed ? 8 : 200).c_str()); }
    return b.passed;
  } else {
    const rl::iteration_t it = o.iterations ? o.iterations : 20000;
    const outcome r = run_one<T>(rl::sched_random, it);
    if (r.passed) {
      std::printf("[%s] %s: NOT CAUGHT in %llu random iterations (%u ms)\n", name(M), cfg,
                  (unsigned long long)r.stop_iteration, r.ms);
      return false;
    }
    std::printf("[%s] %s: CAUGHT at iteration %llu: %s (%u ms)\n", name(M), cfg,
                (unsigned long long)r.stop_iteration, rl::test_result_str(r.result), r.ms);
    if (o.verbose) { std::printf("%s\n", r.log.c_str()); }
    return true;
  }
}

template <mutant M>
bool run_all(const run_opts& o)
{
  bool ok = true;
  // (K, C, N, F): per-entry publish; K < C; K > C (flush-on-full); forward boundary splitting a batch;
  // ring of 3 with wrap-around of both the payload and the size ring.
  ok &= run_config<1, 2, 4, 4, M>(o);
  ok &= run_config<2, 2, 5, 3, M>(o);
  ok &= run_config<3, 2, 6, 6, M>(o);
  ok &= run_config<2, 3, 7, 4, M>(o);
  return ok;
}

}  // namespace

int main(int argc, char** argv)
{
#if defined(FERRY_MUTANT)
#define FERRY_STR2(x) #x
#define FERRY_STR(x) FERRY_STR2(x)
  std::string mode = FERRY_STR(FERRY_MUTANT);
#else
  std::string mode = "model";
#endif
  run_opts o;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      o.iterations = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--bound") == 0 && i + 1 < argc) {
      o.bound = unsigned(std::strtoul(argv[++i], nullptr, 10));
    } else if (std::strcmp(argv[i], "--verbose") == 0) {
      o.verbose = true;
    } else {
      mode = argv[i];
    }
  }
  bool ok = false;
  if (mode == "model") {
    ok = run_all<mutant::none>(o);
  } else if (mode == "relaxed_publish") {
    ok = run_all<mutant::relaxed_publish>(o);
  } else if (mode == "early_reclaim") {
    ok = run_all<mutant::early_reclaim>(o);
  } else if (mode == "size_after_release") {
    ok = run_all<mutant::size_after_release>(o);
  } else if (mode == "all") {
    ok = run_all<mutant::none>(o);
    ok &= run_all<mutant::relaxed_publish>(o);
    ok &= run_all<mutant::early_reclaim>(o);
    ok &= run_all<mutant::size_after_release>(o);
  } else {
    std::fprintf(stderr, "usage: %s [model|relaxed_publish|early_reclaim|all] [--iterations N] [--bound B] [--verbose]\n",
                 argv[0]);
    return 2;
  }
  std::printf("%s: %s\n", mode.c_str(), ok ? (mode == "model" || mode == "all" ? "OK" : "mutant caught in every config")
                                         : "FAILED");
  return ok ? 0 : 1;
}
