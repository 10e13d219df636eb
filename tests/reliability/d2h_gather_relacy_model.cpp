// SPDX-License-Identifier: Apache-2.0
// Relacy model of the D2H gather kernel's cross-block join and release (kernels/d2h/gather/gather_publish.cuh:
// gather_block_phase / gather_join_arrive / publish_phase; the host backend runs the same body).
//
//   threads 0..G-1 ("blocks" of the gather grid; a block's threads are joined by __syncthreads(), which is
//   program order of the one modelled thread): for each of R gathers launched back to back on one stream,
//   each the last writer of a forward (end_forward's boundary gather: it also normalizes the cursor):
//       c = slot[0] (the cursor, rl::var; every forward starts at parity 0); block 0: slot[1] = c + N
//       write the block's payload words of the batch (rl::var, value = f(gather, block, word));
//       old = join.fetch_add(1, acq_rel)                       <- release of the block's stores,
//                                                                 acquire of every earlier arrival's
//       if old + 1 == G: join.store(0, relaxed); slot[0] = slot[1] (gather_release: the normalization);
//                        produced += n; published_head.store(produced, release)
//       the kernel boundary before the next gather: done.fetch_add(1, acq_rel), then wait until every
//       block of this gather is done (acquire): stream order, modelled as a grid-wide happens-before edge
//   thread G (CPU drainer): H = published_head.load(acquire); for every gather covered by H, read and check
//       every payload word of every block (no stale or torn word; relacy flags any unordered access).
//
// Mutants (each must be CAUGHT in every configuration):
//   relaxed_join   : the arrival is a relaxed fetch_add without a fence (the reviewed bug): the last block's
//                    release does not cover the other blocks' stores -> data race on the payload
//   early_release  : the block arrives (and the last one releases) before writing its payload words
//   early_normalize: block 0 normalizes (slot[0] = its new cursor) when it commits, before the join: another
//                    block may still be reading slot[0] -> data race on the cursor
//
// Usage: d2h_gather_relacy_model [model|relaxed_join|early_release|early_normalize|all] [--iterations N] [--bound B] [--verbose]
#include <relacy/relacy.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <streambuf>
#include <string>

namespace {

enum class mutant { none, relaxed_join, early_release, early_normalize };

const char* name(mutant m)
{
  switch (m) {
    case mutant::none: return "model";
    case mutant::relaxed_join: return "relaxed_join";
    case mutant::early_release: return "early_release";
    case mutant::early_normalize: return "early_normalize";
  }
  return "?";
}

constexpr unsigned kWords = 2;  // payload words per block per gather

constexpr std::uint64_t payload(unsigned gather, unsigned block, unsigned w)
{
  return (gather + 1) * 10000 + (block + 1) * 100 + w + 1;  // never 0 ("never written")
}

/// G blocks per gather, R gathers, N entries published per gather.
template <unsigned G, unsigned R, mutant M>
struct gather_model : rl::test_suite<gather_model<G, R, M>, G + 1> {
  static constexpr unsigned N = 3;

  rl::var<std::uint64_t> ring[R * G * kWords];
  rl::var<std::uint64_t> produced;      // device_state::produced: only the last block of a gather touches it
  rl::var<std::uint64_t> slot[2];       // device_state::slot[].phys (the two-slot cursor)
  rl::atomic<std::uint32_t> join;       // device_state::gather_join
  rl::atomic<std::uint32_t> done[R];    // completion of gather r's blocks (the kernel boundary)
  rl::atomic<std::uint64_t> published_head;

  void before()
  {
    for (auto& w : ring) { w($) = 0; }
    produced($) = 0;
    slot[0]($) = 0;
    slot[1]($) = 0;
    join.store(0, rl::memory_order_relaxed);
    for (auto& d : done) { d.store(0, rl::memory_order_relaxed); }
    published_head.store(0, rl::memory_order_relaxed);
  }

  void after() { RL_ASSERT(join.load(rl::memory_order_relaxed) == 0); }  // reset for the next gather

  void write_payload(unsigned r, unsigned blk)
  {
    for (unsigned w = 0; w < kWords; ++w) { ring[(r * G + blk) * kWords + w]($) = payload(r, blk, w); }
  }

  void arrive(unsigned r)
  {
    (void)r;
    std::uint32_t old;
    if constexpr (M == mutant::relaxed_join) {
      old = join.fetch_add(1, rl::memory_order_relaxed);  // BUG: no release of this block's stores
    } else {
      old = join.fetch_add(1, rl::memory_order_acq_rel);
    }
    if (old + 1 == G) {
      join.store(0, rl::memory_order_relaxed);
      if constexpr (M != mutant::early_normalize) { slot[0]($) = slot[1]($); }  // gather_release: normalize
      const std::uint64_t p = produced($) + N;
      produced($) = p;
      published_head.store(p, rl::memory_order_release);  // publish_phase: st.release.sys
    }
  }

  /// gather_commit's cursor step: every block reads slot[0] once; block 0 commits slot[1] from that value.
  void place(unsigned r, unsigned blk)
  {
    const std::uint64_t c = slot[0]($);
    RL_ASSERT(c == r * N);  // the previous forward's boundary gather normalized the cursor
    if (blk == 0) {
      slot[1]($) = c + N;
      if constexpr (M == mutant::early_normalize) { slot[0]($) = c + N; }  // BUG: others may still read slot[0]
    }
  }

  void block(unsigned blk)
  {
    for (unsigned r = 0; r < R; ++r) {
      place(r, blk);
      if constexpr (M == mutant::early_release) {
        arrive(r);
        write_payload(r, blk);
      } else {
        write_payload(r, blk);
        arrive(r);  // after the block barrier
      }
      // Kernel boundary: the next gather starts after every block of this one completed.
      done[r].fetch_add(1, rl::memory_order_acq_rel);
      rl::backoff b;
      while (done[r].load(rl::memory_order_acquire) != G) { b.yield($); }
    }
  }

  void drainer()
  {
    unsigned checked = 0;  // gathers whose payload was read
    std::uint64_t last = 0;
    while (checked < R) {
      const std::uint64_t h = published_head.load(rl::memory_order_acquire);
      RL_ASSERT(h >= last && h % N == 0 && h <= R * N);
      last = h;
      if (h / N == checked) {
        rl::backoff b;
        b.yield($);
        continue;
      }
      for (; checked < h / N; ++checked) {
        for (unsigned blk = 0; blk < G; ++blk) {
          for (unsigned w = 0; w < kWords; ++w) {
            RL_ASSERT(ring[(checked * G + blk) * kWords + w]($) == payload(checked, blk, w));
          }
        }
      }
    }
  }

  void thread(unsigned idx)
  {
    if (idx < G) {
      block(idx);
    } else {
      drainer();
    }
  }
};

struct run_opts {
  rl::iteration_t iterations{0};
  unsigned bound{2};
  bool verbose{false};
};

/// Relacy replaces operator new/delete while it simulates: capture its output into fixed storage.
class capture_buf : public std::streambuf {
 public:
  capture_buf() { reset(); }
  void reset() { setp(buf_, buf_ + sizeof buf_); }
  std::string str() const { return std::string(pbase(), pptr()); }

 protected:
  int_type overflow(int_type ch) override { return traits_type::not_eof(ch); }

 private:
  char buf_[1 << 20];
};

struct outcome {
  bool passed;
  rl::test_result_e result;
  rl::iteration_t stop_iteration;
  unsigned ms;
  std::string log;
};

template <class Test>
outcome run_one(rl::scheduler_type_e sched, rl::iteration_t iterations, unsigned context_bound = 1)
{
  static capture_buf buf;
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

std::string head_lines(const std::string& s, int n)
{
  std::size_t pos = 0;
  for (int i = 0; i < n && pos != std::string::npos; ++i) {
    pos = s.find('\n', pos);
    if (pos != std::string::npos) { ++pos; }
  }
  return pos == std::string::npos ? s : s.substr(0, pos);
}

template <unsigned G, unsigned R, mutant M>
bool run_config(const run_opts& o)
{
  using T = gather_model<G, R, M>;
  char cfg[64];
  std::snprintf(cfg, sizeof cfg, "blocks=%u gathers=%u words=%u", G, R, kWords);
  if constexpr (M == mutant::none) {
    const rl::iteration_t it = o.iterations ? o.iterations : 100000;
    const outcome r = run_one<T>(rl::sched_random, it);
    std::printf("[%s] %s sched_random: %s after %llu iterations (%u ms)\n", name(M), cfg, r.passed ? "PASS" : "FAIL",
                (unsigned long long)r.stop_iteration, r.ms);
    if (!r.passed || o.verbose) { std::printf("%s\n", head_lines(r.log, r.passed ? 8 : 200).c_str()); }
    if (!r.passed) { return false; }
    const outcome b = run_one<T>(rl::sched_bound, 0, o.bound);
    std::printf("[%s] %s sched_bound(context_bound=%u): %s after %llu iterations (%u ms)\n", name(M), cfg, o.bound,
                b.passed ? "PASS" : "FAIL", (unsigned long long)b.stop_iteration, b.ms);
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
    std::printf("[%s] %s: CAUGHT at iteration %llu: %s (%u ms)\n", name(M), cfg, (unsigned long long)r.stop_iteration,
                rl::test_result_str(r.result), r.ms);
    if (o.verbose) { std::printf("%s\n", r.log.c_str()); }
    return true;
  }
}

template <mutant M>
bool run_all(const run_opts& o)
{
  bool ok = true;
  ok &= run_config<2, 1, M>(o);  // two blocks, one gather
  ok &= run_config<3, 1, M>(o);  // three blocks: a middle arrival
  ok &= run_config<2, 2, M>(o);  // two gathers back to back: the counter reset between them
  return ok;
}

}  // namespace

int main(int argc, char** argv)
{
  std::string mode = "model";
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
  } else if (mode == "relaxed_join") {
    ok = run_all<mutant::relaxed_join>(o);
  } else if (mode == "early_release") {
    ok = run_all<mutant::early_release>(o);
  } else if (mode == "early_normalize") {
    ok = run_all<mutant::early_normalize>(o);
  } else if (mode == "all") {
    ok = run_all<mutant::none>(o);
    ok &= run_all<mutant::relaxed_join>(o);
    ok &= run_all<mutant::early_release>(o);
    ok &= run_all<mutant::early_normalize>(o);
  } else {
    std::fprintf(stderr, "usage: %s [model|relaxed_join|early_release|early_normalize|all] [--iterations N] [--bound B] [--verbose]\n",
                 argv[0]);
    return 2;
  }
  std::printf("%s: %s\n", mode.c_str(),
              ok ? (mode == "model" || mode == "all" ? "OK" : "mutant caught in every config") : "FAILED");
  return ok ? 0 : 1;
}
