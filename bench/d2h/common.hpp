// SPDX-License-Identifier: Apache-2.0
// Shared setup of the D2H benchmarks (bench/d2h/*.cpp): the backend, the entry check, the copy layouts
// (shape_opts) and their launch shape (the library's own copy_launch_shape, so baseline and channel launch
// the same grid), the per-hook rig and its round-robin contestants, and the one way every figure is
// reported: a Google Benchmark run whose user counters carry the figures (register_measurement). The
// derived figures (overheads, publication above copies) are computed from Google Benchmark's JSON by
// bench/device/reports/run_files.py (d2h-summary).
#pragma once

#include "bench_kernels.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/d2h/detail/launch_shape.hpp>

#if defined(FERRY_BENCH_CUDA)
#include <ferry/backend/cuda/backend.hpp>
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::bench {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;

#if defined(FERRY_BENCH_CUDA)
using B = fb::cuda_backend;
inline constexpr bool host_mode = false;
#else
using B = fb::host_backend;
inline constexpr bool host_mode = true;
#endif

inline constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;

// ---- reporting -------------------------------------------------------------------------------------
/// Entries checked by the benchmarks' consumers: ferry's (every delivered entry) and the per-entry
/// baselines' own drain (the old volatile flag is an invalid publication: its bad entries are expected).
struct entry_checks {
  std::atomic<std::uint64_t> checked{0}, bad{0};
  std::atomic<std::uint64_t> baseline_checked{0}, baseline_bad{0};
};
[[nodiscard]] entry_checks& checks();

/// Figures of one measurement, reported as Google Benchmark user counters (name -> value).
using figures = std::map<std::string, double>;
struct measured {
  double seconds{0};  ///< the run's manual iteration time
  figures counters;
};
/// Registers `name` as one Google Benchmark run (one iteration, manual time, unit us): `measure` runs it.
/// Its counters, plus the entries it checked (entries_checked, entries_bad, baseline_entries_checked,
/// baseline_entries_bad), land in the benchmark's JSON entry.
void register_measurement(const std::string& name, std::function<measured()> measure);
/// A measurement whose figure is in microseconds: counter `counter` and the iteration time.
void register_us(const std::string& name, const std::string& counter, std::function<double()> measure);

// ---- data ------------------------------------------------------------------------------------------
[[nodiscard]] double median(std::vector<double> v);
/// Words of an entry equal pattern_word(seq, i): all of them, or a sample (first, last, every 4096th).
[[nodiscard]] bool check_words(const std::byte* p, std::uint64_t bytes, std::uint64_t seq, bool all);
/// Fills `bytes` of device memory with pattern_word(seq, i).
void fill_device(B b, fb::stream<B>& s, void* dev, std::uint64_t bytes, std::uint64_t seq);

// ---- copy layouts ----------------------------------------------------------------------------------
/// A copy-kernel launch layout (the fd::config knobs of the same names). The copy-only baseline launches
/// its kernel (same body as ferry's) with exactly the shape ferry's channel would use for the entry.
struct shape_opts {
  std::string label{"default"};
  std::uint32_t threads{fd::config{}.tuning.copy_block_threads};
  std::uint32_t vpt{fd::config{}.tuning.copy_vecs_per_thread};
  std::uint64_t single_max{fd::config{}.tuning.single_block_copy_max_bytes};
  std::uint64_t fused_max{fd::config{}.tuning.fused_copy_max_bytes};
  bool programmatic{fd::config{}.tuning.programmatic_launch};  ///< programmatic dependent launch (sm_90+ only)
  bool branch{fd::config{}.tuning.branch_publish};             ///< batch releases on a forked branch (ferry only)
  bool drain_paused{false};  ///< ferry runs: drain in poll mode, polled only between replays
};
/// The layout before the shape knobs (one 1-vector-per-thread block up to 32 KiB, 256-thread blocks above).
/// The old-design baselines (per-entry flag) keep it: one block, no grid join.
[[nodiscard]] shape_opts legacy_shape();
/// The default layout launched plainly (no programmatic dependent launch): what PDL buys.
[[nodiscard]] shape_opts plain_shape();
/// The default layout with batch releases on the producer stream (tuning::branch_publish off).
[[nodiscard]] shape_opts inline_shape();
/// Writes the layout's knobs into a channel config.
void apply(fd::config& cfg, const shape_opts& o);
/// The launch of a non-publishing entry of `bytes` as ferry's channel makes it (copy_launch_shape).
[[nodiscard]] fb::launch_config copy_shape(std::uint64_t bytes, int sms, const shape_opts& o);
[[nodiscard]] std::uint32_t vpt_of(const shape_opts& o);

/// ferry_kernel (diagnostic): ferry's own copy kernel (copy_entry, real ring_ref and cursor chain) launched
/// by the copy-only harness, with no channel: no FIFO, no drain, no release kernels.
/// event_per_hook (the classic design): the copy-only kernel, then an event recorded after each hook that
/// a CPU thread polls before it copies that entry D2H (forward.cpp; no device-side publication at all).
enum class variant { no_capture, copy_only, old_volatile, per_entry_release, ferry, ferry_kernel, event_per_hook };
[[nodiscard]] const char* name(variant v);
/// The layout a variant uses unless told: the default for ferry and copy-only, legacy for the old flag
/// designs, the default launched plainly (plain_shape: no programmatic launch across its event records)
/// for event per hook.
[[nodiscard]] shape_opts default_shape(variant v);
/// Launches the copy-harness kernel of `v` (copy only, old volatile, per-entry release; event per hook:
/// copy only, its event is recorded by the caller).
void launch_baseline(B b, variant v, const fb::launch_config& lc, fb::stream_view<B> s, const copy_args& a);
/// variant::ferry_kernel: ferry's multi-block copy kernel for the h-th entry of a forward, as the channel
/// would launch it (ring_ref over `ring`, cursor slot parity h % 2), without a channel.
void launch_ferry_kernel(B b, fb::stream_view<B> cs, const fb::launch_config& launch, void* ring,
                         std::uint64_t ring_bytes, void* state, std::uint64_t h, std::uint64_t bytes,
                         std::uint32_t vpt, const void* src);

// ---- per hook in a graph (per_hook.cpp) ------------------------------------------------------------
/// Buffers of one per-hook table: `hooks` back-to-back hooks of P bytes each, copied into `slots` slots.
struct per_hook_rig {
  B b{};
  std::uint64_t P, hooks, slots;
  int sms;
  fb::stream<B> s{b};
  fb::device_buffer<B> src, ring, aux, state;
  fb::mapped_buffer<B> flag;
  explicit per_hook_rig(std::uint64_t p);
  [[nodiscard]] int rounds() const { return host_mode ? 5 : (P <= MiB ? 40 : 15); }
};

/// One captured graph of the rig's hooks plus what runs around each replay (ferry: plan() before; with a
/// paused drain, polling after), and its replay times.
struct contestant {
  std::string name;
  std::optional<fb::graph_exec<B>> g;
  std::function<void()> before{[] {}};
  std::function<void(int)> after{[](int) {}};  ///< argument: replays of this contestant so far
  std::shared_ptr<fd::channel<B>> ch;
  std::vector<double> ms;
  int replays{0};
  [[nodiscard]] double us_per_hook(std::uint64_t hooks) const;
};
/// A named contestant, built on the table's rig when the table runs.
using contestant_maker = std::pair<std::string, std::function<contestant(per_hook_rig&)>>;
/// A copy-harness contestant (bench kernels, or ferry's copy kernel alone); `cursor_mode` as in copy_args.
[[nodiscard]] contestant_maker copy_maker(std::string n, variant v, shape_opts sh, std::uint32_t cursor_mode = 0);
/// A ferry channel (publish_every = K) capturing the hooks; every delivered entry is checked.
[[nodiscard]] contestant_maker ferry_maker(std::string n, std::uint32_t K, fd::head_memory placement, shape_opts sh);
/// The per-hook table for payload P: the copy-harness baselines are replayed in every round, beside one
/// ferry configuration at a time, so each ferry figure and the baselines' medians come from interleaved
/// replays. Returns us/hook per contestant name.
[[nodiscard]] figures per_hook_table(std::uint64_t P, const std::vector<contestant_maker>& ferries,
                                     const std::vector<contestant_maker>& baselines);
/// One contestant alone (the layout sweep): us/hook.
[[nodiscard]] double per_hook_us(variant v, std::uint64_t P, const shape_opts& sh, std::uint32_t K = 16);

// ---- the simulated forward (forward.cpp) -----------------------------------------------------------
/// Forward options: copy layout, K, and `drain_paused` (drain in poll mode, polled only between replays:
/// the replay runs with no D2H traffic and no drain thread, isolating the drain's contention).
struct fwd_opts {
  std::optional<shape_opts> shape;
  std::uint32_t K{16};
  bool drain_paused{false};
  bool gather{false};     ///< ferry: capture_deferred (one gather launch per K hooks) instead of capture
  bool gather_fused{false};  ///< with gather: gather_branch_publish off (the batch release in the gather's last block)
  bool vllm_mix{false};   ///< DMI's vllm-full sizes at B = 1 instead of 16 KiB per hook (forward_sizes)
};
/// Bytes of each of the H hooks of a forward: 16 KiB each, or (`vllm_mix`) DMI's vllm-full mix at decode
/// B = 1: 4 B token ids first, 297 KiB logits last, 2-6 KiB per layer hook between.
[[nodiscard]] std::vector<std::uint64_t> forward_sizes(std::uint64_t H, bool vllm_mix);
/// Median us per forward: 28 layers of a ~60 us spin kernel, H hooks of 16 KiB, graph replay.
[[nodiscard]] double forward_us(variant v, std::uint64_t H, fd::head_memory placement = fd::head_memory::managed,
                                const fwd_opts& o = {});

// ---- registration (one per file) -------------------------------------------------------------------
void register_per_hook();  ///< per_hook_graph/<bytes>
void register_forward();   ///< forward/<variant>/hooks:<H>
void register_drain();     ///< drain/ferry_64MiB, drain/memcpy_ceiling_64MiB
void register_variants();  ///< variants/...

}  // namespace ferry::bench
