// SPDX-License-Identifier: Apache-2.0
// ferry_gpu_stress: D2H stress for a real GPU (H200), with the same logic on the host backend for CI
// (reliability issue item 6).
//
// Phases: one channel each, every combination of head placement {managed, pinned_mapped} x K (publish_every)
// {1, 4, 16, 64}, in a seeded random order, each taking an equal share of the requested entries (so each
// placement carries half). The producer (main thread) mixes
//   * eager batches: a fill kernel writes pattern(seq, .) into a window of source slots (and each slot's
//     GPU-resolved size), then forwards of random length capture those slots (random sizes 16 B .. cap,
//     about 1 in 8 through capture_dynamic with the device-resident size);
//   * graph replays of 3 planned forwards per phase (captured once, each replay preceded by the fill kernel for
//     the replay's seqs on the same stream, then channel::replay = plan + launch).
// In both, a share of the fixed-size entries (--deferred-percent, default 30) goes through capture_deferred,
// mixed with immediate ones: the gather kernel copies each batch at its flush point (the K-th deferred entry,
// the next immediate capture, end_forward, and an explicit flush() after about 1 in 16 eager ones). The fill
// of the next window is enqueued after end_forward (the last flush point), so the sources are unmodified
// until each batch's flush. Deferred entries are counted per mode (stdout, JSON) and checked like the rest.
// Source slot capacities are 16 B .. 64 KiB, mostly small. About 1 in 256 dynamic entries deliberately resolves
// to more than its reservation: it must come back as entry_status::size_overflow (counted, not forbidden).
// The drain thread's callback checks every entry: seq order (loss, duplicate, out of order), hook, size,
// status, and every payload byte against pattern(seq, .) (a wrong word is classified stale when it is another
// nearby seq's word at that index, else torn).
// Beside it, a separate CPU thread keeps re-launching an L2 "hammer" kernel on its own stream over a buffer
// about twice the H200 L2 (128 MiB; 8 MiB on the host backend) until the stress ends.
//
//   ferry_gpu_stress [--host] [--entries N] [--seed S] [--json PATH] [--hammer-mib M] [--no-hammer]
//                    [--deferred-percent P] [--fault F]
//     default entries: 10^7 (CUDA), 10^5 (host). --fault F (ferry::testing::d2h_fault, test-only) is a negative
//     control: the run must then report forbidden outcomes and fail. --fault deferred_source_overwritten is the
//     harness's own: before each eager end_forward it overwrites the source of every deferred entry of the
//     forward; those flushed already keep their bytes (stream order), the partial batch end_forward flushes
//     must come back stale or torn (the gather reads the source at its flush, the contract's reason).
// Last line: "gpu_stress: N entries checked, F forbidden, O overflow-reported, T s".
// Exit status 1 if F > 0 or fewer than N entries were checked.
#include "gpu_stress_kernels.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/testing/d2h_access.hpp>
#include <ferry/testing/pattern.hpp>
#if defined(FERRY_HAS_CUDA)
#include <ferry/backend/cuda/backend.hpp>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace ferry::gpu_stress {
namespace {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
using namespace std::chrono_literals;

struct options {
  std::uint64_t entries{0};  // 0: backend default
  std::uint64_t seed{20240607};
  std::string json;
  std::uint64_t hammer_mib{0};  // 0: backend default
  bool hammer{true};
  std::uint32_t deferred_percent{30};  // share of fixed-size entries captured through capture_deferred
  bool overwrite_deferred{false};      // negative control: break the deferred source contract
  ferry::testing::d2h_fault fault{ferry::testing::d2h_fault::none};  // negative control: the checker must fail
};

/// Shape of the run per backend: a real GPU gets big rings and windows, the host backend small ones.
struct shape {
  std::uint64_t default_entries;
  std::size_t ring_bytes;
  std::uint32_t size_slots, fifo_capacity;
  std::uint32_t table;          // source slots
  std::uint32_t eager_max;      // entries per eager batch (1 .. eager_max)
  std::uint32_t graph_min, graph_max;  // entries per captured forward
  std::uint32_t fwd_max;        // entries per eager forward
  std::uint64_t hammer_mib;
  std::uint32_t hammer_block;
  std::chrono::microseconds hammer_gap;  // pause between hammer launches (host: leave the cores to the stress)
};

constexpr shape gpu_shape{10'000'000, std::size_t{256} << 20, 8192, 65536, 4096, 1024, 8, 512, 256, 128, 256, 0us};
constexpr shape host_shape{100'000, std::size_t{8} << 20, 1024, 8192, 512, 128, 4, 64, 64, 8, 64, 2000us};

// ---- the checker (runs on the channel's drain thread) ----------------------------------------------------

struct expect_t {
  std::uint32_t hook;
  std::uint64_t size;  // static: bytes; dynamic: GPU-resolved actual
  bool overflow;
};

struct forbidden_counts {
  std::uint64_t torn{0}, stale{0}, lost{0}, duplicated{0}, out_of_order{0}, size_mismatch{0}, hook_mismatch{0},
      status_mismatch{0}, unexpected{0}, errors{0};
  [[nodiscard]] std::uint64_t total() const
  {
    return torn + stale + lost + duplicated + out_of_order + size_mismatch + hook_mismatch + status_mismatch +
           unexpected + errors;
  }
  void add(const forbidden_counts& o)
  {
    torn += o.torn, stale += o.stale, lost += o.lost, duplicated += o.duplicated, out_of_order += o.out_of_order;
    size_mismatch += o.size_mismatch, hook_mismatch += o.hook_mismatch, status_mismatch += o.status_mismatch;
    unexpected += o.unexpected, errors += o.errors;
  }
};

std::atomic<int> g_reports{0};
void report(const std::string& what)
{
  if (g_reports.fetch_add(1) < 30) { std::fprintf(stderr, "FORBIDDEN: %s\n", what.c_str()); }
}

class checker {
 public:
  /// Producer: called before the entry can be delivered (before capture / replay of `seq`).
  void expect(std::uint64_t seq, expect_t e)
  {
    std::lock_guard lock{m_};
    if (seq != q_base_ + q_.size()) {  // harness bug, not a ferry one; still fails the run
      ++f_.errors;
      report("harness: expectation for seq " + std::to_string(seq) + " out of order");
    }
    q_.push_back(e);
  }

  void check(const fd::entry_view& v)
  {
    const std::uint64_t s = v.seq().value;
    expect_t e{};
    {
      std::lock_guard lock{m_};
      if (s < next_) {
        if (missing_.erase(s) != 0) {
          ++f_.out_of_order;
          report("seq " + std::to_string(s) + " delivered after " + std::to_string(next_ - 1) + " (out of order)");
        } else {
          ++f_.duplicated;
          report("seq " + std::to_string(s) + " delivered twice");
        }
        return;
      }
      if (s > next_) {
        f_.lost += s - next_;
        report("seqs " + std::to_string(next_) + " .. " + std::to_string(s - 1) + " skipped (lost)");
        for (std::uint64_t x = next_; x < s && missing_.size() < 100000; ++x) { missing_.insert(x); }
      }
      if (s < q_base_ || s - q_base_ >= q_.size()) {
        ++f_.unexpected;
        report("seq " + std::to_string(s) + " was never produced");
        next_ = s + 1;
        return;
      }
      e = q_[s - q_base_];
      next_ = s + 1;
      while (q_base_ < next_ && !q_.empty()) {
        q_.pop_front();
        ++q_base_;
      }
    }
    // Payload checks outside the lock (only this thread touches the counters below until the phase ends).
    ++checked_;
    const std::string at = "seq " + std::to_string(s);
    if (v.hook().value != e.hook) {
      ++f_.hook_mismatch;
      report(at + ": hook " + std::to_string(v.hook().value) + ", expected " + std::to_string(e.hook));
    }
    if (v.size() != e.size) {
      ++f_.size_mismatch;
      report(at + ": size " + std::to_string(v.size()) + ", expected " + std::to_string(e.size));
      return;
    }
    if (e.overflow) {
      if (v.status() == fd::entry_status::size_overflow) {
        ++overflow_reported_;
      } else {
        ++f_.status_mismatch;
        report(at + ": actual " + std::to_string(e.size) + " > reservation, not reported as size_overflow");
      }
      return;
    }
    if (!v.ok()) {
      ++f_.status_mismatch;
      report(at + ": status not ok");
      return;
    }
    const auto b = v.bytes();
    const std::size_t words = b.size() / 8;
    const std::uint64_t bad = ferry::testing::first_pattern_mismatch(b.data(), b.size(), s);
    if (bad < words * 8) {
      const std::size_t i = bad / 8;
      std::uint64_t w;
      std::memcpy(&w, b.data() + bad, 8);
      classify(s, i, w, at + ": payload word " + std::to_string(i) + " of " + std::to_string(words));
    } else if (bad < b.size()) {
      ++f_.torn;
      report(at + ": payload byte " + std::to_string(bad) + " of " + std::to_string(b.size()));
    }
  }

  /// After the phase (drain stopped): entries produced but never delivered are lost.
  void finish(std::uint64_t produced)
  {
    std::lock_guard lock{m_};
    if (next_ < produced) {
      f_.lost += produced - next_;
      report("seqs " + std::to_string(next_) + " .. " + std::to_string(produced - 1) + " never delivered (lost)");
    }
  }

  [[nodiscard]] std::uint64_t checked() const { return checked_; }
  [[nodiscard]] std::uint64_t overflow_reported() const { return overflow_reported_; }
  forbidden_counts& counts() { return f_; }

 private:
  void classify(std::uint64_t s, std::size_t i, std::uint64_t w, const std::string& what)
  {
    for (std::uint64_t d = 1; d <= 4096; ++d) {
      if ((s >= d && w == ferry::testing::pattern_word(s - d, i)) || w == ferry::testing::pattern_word(s + d, i)) {
        ++f_.stale;
        report(what + ": stale (word of seq " + std::to_string(s >= d && w == ferry::testing::pattern_word(s - d, i) ? s - d : s + d) + ")");
        return;
      }
    }
    ++f_.torn;
    report(what + ": torn (0x" + [&] {
      char buf[20];
      std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(w));
      return std::string{buf};
    }() + ")");
  }

  std::mutex m_;
  std::deque<expect_t> q_;
  std::uint64_t q_base_{0}, next_{0};
  std::set<std::uint64_t> missing_;
  std::uint64_t checked_{0}, overflow_reported_{0};
  forbidden_counts f_;
};

// ---- the stress -------------------------------------------------------------------------------------------

struct result {
  std::uint64_t checked{0}, overflow_reported{0}, overflow_expected{0}, produced{0};
  std::uint64_t deferred_eager{0}, deferred_graph{0};  // entries produced through capture_deferred
  std::uint64_t per_placement[2]{0, 0};
  forbidden_counts f;
  std::uint64_t hammer_launches{0};
  std::string device;
};

const char* placement_name(fd::head_memory p) { return p == fd::head_memory::managed ? "managed" : "pinned_mapped"; }

template <class B>
class stress {
 public:
  stress(B b, const shape& sh, const options& o) : b_{b}, sh_{sh}, opt_{o}, rng_{o.seed}
  {
    dev_ = b_.current_device();
    // Source slot table: capacities 16 B .. 64 KiB, mostly small.
    caps_.resize(sh_.table);
    offsets_.resize(sh_.table);
    std::uint64_t off = 0;
    for (std::uint32_t k = 0; k < sh_.table; ++k) {
      const auto r = rng_() % 100;
      const std::uint64_t c = r < 70 ? 16 + rng_() % 241 : r < 90 ? 257 + rng_() % 3840
                            : r < 99 ? 4097 + rng_() % 28672 : 32769 + rng_() % 32768;
      caps_[k] = static_cast<std::uint32_t>(c);
      offsets_[k] = off;
      off += (c + 255) / 256 * 256;
    }
    src_ = fb::device_buffer<B>{off, b_};
    caps_dev_ = fb::device_buffer<B>{sh_.table * sizeof(std::uint32_t), b_};
    offsets_dev_ = fb::device_buffer<B>{sh_.table * sizeof(std::uint64_t), b_};
    actual_dev_ = fb::device_buffer<B>{sh_.table * sizeof(std::uint64_t), b_};
    fb::pinned_buffer<B> staging{std::max(caps_dev_.size(), offsets_dev_.size()), b_};
    fb::stream<B> s{b_};
    std::memcpy(staging.data(), caps_.data(), caps_dev_.size());
    b_.memcpy_async(caps_dev_.data(), staging.data(), caps_dev_.size(), fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
    std::memcpy(staging.data(), offsets_.data(), offsets_dev_.size());
    b_.memcpy_async(offsets_dev_.data(), staging.data(), offsets_dev_.size(), fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
  }

  result run()
  {
    result res;
    const auto attr = b_.attributes(dev_);
    res.device = std::string{B::name()} + ": " + attr.name;
    const std::uint64_t target = opt_.entries != 0 ? opt_.entries : sh_.default_entries;

    // Memory stress beside the channel: its own stream, re-launched from its own thread until the end.
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> launches{0};
    std::string hammer_error;
    const std::uint64_t mib = opt_.hammer_mib != 0 ? opt_.hammer_mib : sh_.hammer_mib;
    std::uint64_t words = 1;
    while (words * 2 <= (mib << 20) / 8) { words *= 2; }
    fb::device_buffer<B> hbuf{words * 8, b_};
    fb::stream<B> hs{b_};
    b_.memset_async(hbuf.data(), 0, words * 8, hs.handle());
    hs.synchronize();
    const std::uint32_t hgrid = static_cast<std::uint32_t>(std::max(attr.sm_count, 4));
    std::thread hammer{[&] {
      try {
        b_.set_device(dev_);
        std::uint64_t round = 0;
        while (opt_.hammer && !stop.load(std::memory_order_relaxed)) {
          hammer_args a{hbuf.template as<std::uint64_t>(), words, round++};
          b_.launch(hammer_kernel(typename B::tag{}), fb::launch_config{{hgrid}, {sh_.hammer_block}, 0}, hs.handle(), a);
          launches.fetch_add(1, std::memory_order_relaxed);
          if (round % 4 == 0) { hs.synchronize(); }  // bound the queue
          if (sh_.hammer_gap.count() > 0) { std::this_thread::sleep_for(sh_.hammer_gap); }
        }
        hs.synchronize();
      } catch (const std::exception& e) {
        hammer_error = e.what();
      }
    }};

    // Every (placement, K) combination once, in a seeded order; equal shares of the entries.
    std::vector<std::pair<fd::head_memory, std::uint32_t>> phases;
    for (auto p : {fd::head_memory::managed, fd::head_memory::pinned_mapped}) {
      for (std::uint32_t k : {1U, 4U, 16U, 64U}) { phases.emplace_back(p, k); }
    }
    std::shuffle(phases.begin(), phases.end(), rng_);
    const std::uint64_t share = (target + phases.size() - 1) / phases.size();
    for (std::size_t i = 0; i < phases.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto [placement, k] = phases[i];
      const auto ph = run_phase(placement, k, share);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("gpu_stress: phase %zu/%zu head_memory=%s K=%u: %llu produced, %llu checked, %llu overflow "
                  "(expected %llu), deferred eager=%llu graph=%llu, %llu forbidden, %.2f s\n",
                  i + 1, phases.size(), placement_name(placement), k, static_cast<unsigned long long>(ph.produced),
                  static_cast<unsigned long long>(ph.checked), static_cast<unsigned long long>(ph.overflow_reported),
                  static_cast<unsigned long long>(ph.overflow_expected),
                  static_cast<unsigned long long>(ph.deferred_eager), static_cast<unsigned long long>(ph.deferred_graph),
                  static_cast<unsigned long long>(ph.f.total()), sec);
      std::fflush(stdout);
      res.checked += ph.checked;
      res.overflow_reported += ph.overflow_reported;
      res.overflow_expected += ph.overflow_expected;
      res.produced += ph.produced;
      res.deferred_eager += ph.deferred_eager;
      res.deferred_graph += ph.deferred_graph;
      res.per_placement[placement == fd::head_memory::managed ? 0 : 1] += ph.checked;
      res.f.add(ph.f);
    }
    stop.store(true);
    hammer.join();
    res.hammer_launches = launches.load();
    if (!hammer_error.empty()) {
      ++res.f.errors;
      report("hammer thread: " + hammer_error);
    }
    if (opt_.deferred_percent > 0 && res.produced >= 10'000 && (res.deferred_eager == 0 || res.deferred_graph == 0)) {
      ++res.f.errors;
      report("deferred entries requested (" + std::to_string(opt_.deferred_percent) + "%) but eager " +
             std::to_string(res.deferred_eager) + ", graph " + std::to_string(res.deferred_graph) + " produced");
    }
    if (opt_.hammer && res.hammer_launches == 0) {
      ++res.f.errors;
      report("hammer kernel never launched");
    }
    return res;
  }

 private:
  struct graph_node {
    std::uint32_t hook;
    bool dynamic;
    bool deferred;       // captured through capture_deferred (fixed-size only)
    std::uint64_t size;  // static size (dynamic: reservation = slot cap)
  };
  struct planned {
    std::uint32_t first_slot{0};
    std::vector<graph_node> nodes;
    fb::graph_exec<B> exec;
    fd::forward_plan plan;
  };

  [[nodiscard]] std::uint32_t slot_of(std::uint32_t first, std::uint32_t j) const
  {
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(first) + j) % sh_.table);
  }
  [[nodiscard]] const void* src_at(std::uint32_t slot) const
  {
    return static_cast<const std::byte*>(src_.data()) + offsets_[slot];
  }
  [[nodiscard]] const std::uint64_t* actual_at(std::uint32_t slot) const
  {
    return actual_dev_.template as<std::uint64_t>() + slot;
  }
  void fill(std::uint32_t first_slot, std::uint32_t count, std::uint64_t first_seq, const fb::stream<B>& s)
  {
    fill_args a{static_cast<std::byte*>(src_.data()), offsets_dev_.template as<std::uint64_t>(),
                caps_dev_.template as<std::uint32_t>(), actual_dev_.template as<std::uint64_t>(), sh_.table,
                first_slot, first_seq};
    b_.launch(fill_kernel(typename B::tag{}), fb::launch_config{{count}, {128}, 0}, s.handle(), a);
  }

  struct phase_result {
    std::uint64_t produced{0}, checked{0}, overflow_reported{0}, overflow_expected{0};
    std::uint64_t deferred_eager{0}, deferred_graph{0};
    forbidden_counts f;
  };

  phase_result run_phase(fd::head_memory placement, std::uint32_t k, std::uint64_t n)
  {
    phase_result r;
    checker chk;
    std::uint64_t seq = 0;
    // The gathers' batch releases: on the branch (the default) in the managed phases, fused into the
    // gather's last block (acq_rel block join) in the pinned_mapped ones.
    const bool gather_branch = placement == fd::head_memory::managed;
    const std::string tag = std::string{"phase "} + placement_name(placement) + " K=" + std::to_string(k) +
                            (gather_branch ? " gather release on the branch" : " gather release fused");
    try {
      fb::stream<B> s{b_};
      fd::config cfg;
      cfg.ring_bytes = sh_.ring_bytes;
      cfg.publish_every = k;
      cfg.tuning.head_memory = placement;
      cfg.tuning.size_slots = sh_.size_slots;
      cfg.fifo_capacity = sh_.fifo_capacity;
      cfg.timeout = 30s;
      cfg.drain = fd::drain_mode::thread;
      cfg.tuning.gather_branch_publish = gather_branch;
      fd::channel<B> ch{cfg, b_, [&chk](fd::entry_view&& v) { chk.check(v); }};
      ferry::testing::d2h_access::set_fault(ch, opt_.fault);
      if (opt_.fault != ferry::testing::d2h_fault::none && std::string_view{B::name()} == "host") {
        ferry::testing::d2h_access::set_copy_delay(ch, std::chrono::microseconds{50});  // widen the fault's window
      }

      auto expect = [&](std::uint64_t q, std::uint32_t hook, bool dynamic, std::uint64_t size, std::uint32_t slot) {
        if (dynamic) {
          const std::uint64_t actual = dyn_actual(q, caps_[slot]);
          const bool over = dyn_overflows(q);
          r.overflow_expected += over ? 1 : 0;
          chk.expect(q, {hook, actual, over});
        } else {
          chk.expect(q, {hook, size, false});
        }
      };

      // Planned forwards: captured once per phase (the graph holds the channel's kernels).
      std::vector<planned> graphs(3);
      for (auto& g : graphs) {
        const std::uint32_t m = std::min(sh_.table, sh_.graph_min + static_cast<std::uint32_t>(rng_() % (sh_.graph_max - sh_.graph_min + 1)));
        g.first_slot = static_cast<std::uint32_t>(rng_() % sh_.table);
        for (std::uint32_t j = 0; j < m; ++j) {
          const std::uint32_t cap = caps_[slot_of(g.first_slot, j)];
          const bool dyn = rng_() % 8 == 0;
          const bool deferred = !dyn && rng_() % 100 < opt_.deferred_percent;
          g.nodes.push_back(
              {static_cast<std::uint32_t>(rng_()), dyn, deferred, dyn || rng_() % 2 ? cap : 16 + rng_() % (cap - 15)});
        }
        g.exec = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> sv) {
          ch.begin_forward(sv);
          for (std::uint32_t j = 0; j < m; ++j) {
            const auto& nd = g.nodes[j];
            const std::uint32_t slot = slot_of(g.first_slot, j);
            if (nd.dynamic) {
              ch.capture_dynamic(fd::hook_id{nd.hook}, src_at(slot), nd.size, actual_at(slot), sv);
            } else if (nd.deferred) {
              ch.capture_deferred(fd::hook_id{nd.hook}, src_at(slot), nd.size, sv);
            } else {
              ch.capture(fd::hook_id{nd.hook}, src_at(slot), nd.size, sv);
            }
          }
          g.plan = ch.end_forward(sv);
        });
        if (g.plan.size() != m) {
          ++r.f.errors;
          report(tag + ": captured forward planned " + std::to_string(g.plan.size()) + " entries, expected " + std::to_string(m));
        }
      }

      std::vector<std::uint32_t> deferred_slots;  // sources of the open eager forward's deferred entries
      while (seq < n) {
        if (rng_() % 100 < 35) {
          // Eager batch: fill a window of slots for seqs [seq, seq + m), then forwards over it.
          const std::uint32_t m = static_cast<std::uint32_t>(
              std::min<std::uint64_t>(1 + rng_() % sh_.eager_max, n - seq));
          const auto first = static_cast<std::uint32_t>(rng_() % sh_.table);
          fill(first, m, seq, s);
          std::uint32_t j = 0;
          while (j < m) {
            ch.begin_forward(s);
            deferred_slots.clear();
            for (std::uint64_t len = 1 + rng_() % sh_.fwd_max; len > 0 && j < m; --len, ++j, ++seq) {
              const std::uint32_t slot = slot_of(first, j);
              const std::uint32_t cap = caps_[slot];
              const auto hook = static_cast<std::uint32_t>(rng_());
              if (rng_() % 8 == 0) {
                expect(seq, hook, true, cap, slot);
                ch.capture_dynamic(fd::hook_id{hook}, src_at(slot), cap, actual_at(slot), s);
              } else {
                const std::uint64_t size = rng_() % 2 ? cap : 16 + rng_() % (cap - 15);
                expect(seq, hook, false, size, slot);
                if (rng_() % 100 < opt_.deferred_percent) {
                  ch.capture_deferred(fd::hook_id{hook}, src_at(slot), size, s);
                  deferred_slots.push_back(slot);
                  ++r.deferred_eager;
                  if (rng_() % 16 == 0) { ch.flush(s); }
                } else {
                  ch.capture(fd::hook_id{hook}, src_at(slot), size, s);
                }
              }
            }
            if (opt_.overwrite_deferred) {  // another seq's pattern: far from every seq of the run
              for (const std::uint32_t slot : deferred_slots) { fill(slot, 1, seq + (std::uint64_t{1} << 40), s); }
            }
            (void)ch.end_forward(s);
          }
        } else {
          // Graph replay: fill the graph's window for this replay's seqs, then plan + launch.
          const auto& g = graphs[rng_() % graphs.size()];
          const auto m = static_cast<std::uint32_t>(g.nodes.size());
          fill(g.first_slot, m, seq, s);
          for (std::uint32_t j = 0; j < m; ++j) {
            const auto& nd = g.nodes[j];
            expect(seq + j, nd.hook, nd.dynamic, nd.size, slot_of(g.first_slot, j));
            r.deferred_graph += nd.deferred ? 1 : 0;
          }
          ch.replay(g.exec, g.plan, s);
          seq += m;
        }
      }
      s.synchronize();
      const auto rep = ch.close(std::chrono::milliseconds{60'000});
      if (!rep.clean() || rep.delivered != seq) {
        ++r.f.errors;
        report(tag + ": close() not clean or delivered " + std::to_string(rep.delivered) + " of " + std::to_string(seq));
      }
      const auto st = ch.stats();
      if (st.entries_drained != seq || st.entries_published != seq || st.entries_reserved != seq) {
        ++r.f.errors;
        report(tag + ": stats reserved/published/drained " + std::to_string(st.entries_reserved) + "/" +
               std::to_string(st.entries_published) + "/" + std::to_string(st.entries_drained) + ", produced " +
               std::to_string(seq));
      }
      if (st.size_overflows != r.overflow_expected) {
        ++r.f.errors;
        report(tag + ": stats size_overflows " + std::to_string(st.size_overflows) + ", expected " +
               std::to_string(r.overflow_expected));
      }
      if (st.callback_errors != 0) {
        ++r.f.errors;
        report(tag + ": " + std::to_string(st.callback_errors) + " callback errors");
      }
      if (st.high_watermark > cfg.ring_bytes) {
        ++r.f.errors;
        report(tag + ": high watermark above the ring");
      }
    } catch (const std::exception& e) {
      ++r.f.errors;
      report(tag + ": " + e.what());
    }
    // The channel (and its drain thread) is gone: the checker is ours alone now.
    chk.finish(seq);
    r.produced = seq;
    r.checked = chk.checked();
    r.overflow_reported = chk.overflow_reported();
    r.f.add(chk.counts());
    if (r.overflow_reported != r.overflow_expected) {
      ++r.f.errors;
      report(tag + ": " + std::to_string(r.overflow_reported) + " overflows reported, expected " +
             std::to_string(r.overflow_expected));
    }
    return r;
  }

  B b_;
  shape sh_;
  options opt_;
  std::mt19937_64 rng_;
  fb::device_id dev_{};
  std::vector<std::uint32_t> caps_;
  std::vector<std::uint64_t> offsets_;
  fb::device_buffer<B> src_, caps_dev_, offsets_dev_, actual_dev_;
};

template <class B>
int run_main(const shape& sh, const options& o)
{
  B b;
  b.set_device(fb::device_id{0});
  const auto t0 = std::chrono::steady_clock::now();
  result res;
  try {
    stress<B> st{b, sh, o};
    res = st.run();
  } catch (const std::exception& e) {
    ++res.f.errors;
    report(std::string{"setup: "} + e.what());
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::uint64_t target = o.entries != 0 ? o.entries : sh.default_entries;
  const auto& f = res.f;
  std::printf("gpu_stress: device %s; %llu produced (deferred: eager %llu, graph %llu); hammer launches %llu; per "
              "placement checked managed=%llu pinned_mapped=%llu; forbidden: torn=%llu stale=%llu lost=%llu duplicated=%llu out_of_order=%llu "
              "size_mismatch=%llu hook_mismatch=%llu status_mismatch=%llu unexpected=%llu errors=%llu\n",
              res.device.c_str(), static_cast<unsigned long long>(res.produced),
              static_cast<unsigned long long>(res.deferred_eager), static_cast<unsigned long long>(res.deferred_graph),
              static_cast<unsigned long long>(res.hammer_launches),
              static_cast<unsigned long long>(res.per_placement[0]), static_cast<unsigned long long>(res.per_placement[1]),
              static_cast<unsigned long long>(f.torn), static_cast<unsigned long long>(f.stale),
              static_cast<unsigned long long>(f.lost), static_cast<unsigned long long>(f.duplicated),
              static_cast<unsigned long long>(f.out_of_order), static_cast<unsigned long long>(f.size_mismatch),
              static_cast<unsigned long long>(f.hook_mismatch), static_cast<unsigned long long>(f.status_mismatch),
              static_cast<unsigned long long>(f.unexpected), static_cast<unsigned long long>(f.errors));
  std::printf("gpu_stress: %llu entries checked, %llu forbidden, %llu overflow-reported, %.1f s\n",
              static_cast<unsigned long long>(res.checked), static_cast<unsigned long long>(f.total()),
              static_cast<unsigned long long>(res.overflow_reported), sec);
  std::fflush(stdout);
  if (!o.json.empty()) {
    if (std::FILE* j = std::fopen(o.json.c_str(), "w")) {
      std::string dev;
      for (char c : res.device) {
        if (c == '"' || c == '\\') { dev += '\\'; }
        dev += c;
      }
      std::fprintf(j,
                   "{\"entries_checked\": %llu, \"forbidden\": %llu, \"overflow_reported\": %llu, \"seconds\": %.3f, "
                   "\"device\": \"%s\", \"placements\": {\"managed\": %llu, \"pinned_mapped\": %llu}, "
                   "\"deferred\": {\"percent\": %u, \"eager\": %llu, \"graph\": %llu}}\n",
                   static_cast<unsigned long long>(res.checked), static_cast<unsigned long long>(f.total()),
                   static_cast<unsigned long long>(res.overflow_reported), sec, dev.c_str(),
                   static_cast<unsigned long long>(res.per_placement[0]),
                   static_cast<unsigned long long>(res.per_placement[1]), o.deferred_percent,
                   static_cast<unsigned long long>(res.deferred_eager),
                   static_cast<unsigned long long>(res.deferred_graph));
      std::fclose(j);
    } else {
      std::fprintf(stderr, "gpu_stress: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  if (res.checked < target) {
    std::fprintf(stderr, "gpu_stress: only %llu of %llu requested entries checked\n",
                 static_cast<unsigned long long>(res.checked), static_cast<unsigned long long>(target));
  }
  return f.total() == 0 && res.checked >= target ? 0 : 1;
}

}  // namespace
}  // namespace ferry::gpu_stress

int main(int argc, char** argv)
{
  using namespace ferry::gpu_stress;
  options o;
  bool host = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--host") {
      host = true;
    } else if (a == "--no-hammer") {
      o.hammer = false;
    } else if (a == "--entries" && i + 1 < argc) {
      o.entries = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--json" && i + 1 < argc) {
      o.json = argv[++i];
    } else if (a == "--fault" && i + 1 < argc) {
      const std::string_view f = argv[++i];
      o.overwrite_deferred = f == "deferred_source_overwritten";
      o.fault = f == "drain_without_acquire"          ? ferry::testing::d2h_fault::drain_without_acquire
                : f == "reclaim_before_copy_complete" ? ferry::testing::d2h_fault::reclaim_before_copy_complete
                                                      : ferry::testing::d2h_fault::none;
    } else if (a == "--deferred-percent" && i + 1 < argc) {
      o.deferred_percent = static_cast<std::uint32_t>(std::min<unsigned long long>(100, std::strtoull(argv[++i], nullptr, 10)));
    } else if (a == "--hammer-mib" && i + 1 < argc) {
      o.hammer_mib = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--host] [--entries N] [--seed S] [--json PATH] [--hammer-mib M] [--no-hammer] [--deferred-percent P] [--fault drain_without_acquire|reclaim_before_copy_complete|deferred_source_overwritten]\n",
                   argv[0]);
      return 2;
    }
  }
#if defined(FERRY_HAS_CUDA)
  if (!host) { return run_main<ferry::backend::cuda_backend>(gpu_shape, o); }
#endif
  (void)host;
  (void)gpu_shape;
  return run_main<ferry::backend::host_backend>(host_shape, o);
}
