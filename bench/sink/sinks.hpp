// SPDX-License-Identifier: Apache-2.0
// ferry_bench_sinks (issue 28): the native sinks under a graphed vllm-full forward. The parts, one file each:
//   forward_rig.cpp   the forward (28 layers of a spin kernel, DMI's vllm-full hook sizes at `tokens` per step, 341
//                     hooks captured with capture_deferred, graph replay; every hook's bytes a function of (tag, hook,
//                     word) written by the layer kernel on the device) and its contestants' interleaved rounds
//   disk.cpp          the disk's sequential write bandwidth (O_DIRECT, as `dd oflag=direct conv=fsync`)
//   safetensors.cpp   the safetensors sink: policy block (sink_write_gbps) and policy drop (forward overhead)
//   shard_check.cpp   the shards read back: every tensor's bytes, names, dtype and shape; whole forwards
//   shm.cpp           the shared-memory stream: a reader process's GB/s with 64 MiB entries, the forward's cost
//   shm_reader.cpp    that reader process (the binary's --reader mode); reader_process.cpp spawns it
//   main.cpp          options, the JSON on stdout (a readable log on stderr)
#pragma once

#include "common.hpp"  // bench/d2h: the backend B, median, forward_sizes, the layer kernel

#include <ferry/sink.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ferry::bench::sinks {

namespace fs = std::filesystem;
namespace fk = ferry::sink;
using clk = std::chrono::steady_clock;

/// Options (main.cpp parses them; --quick: the host smoke sizes).
struct options {
  fs::path dir;                     ///< where the disk test and the shards go (a disk, not /dev/shm)
  std::uint64_t volume{8ULL << 30};  ///< policy block: bytes the forwards capture (the sink writes about that much)
  std::uint64_t tokens{16};          ///< rows per hook per step
  std::uint64_t spin_ns{60'000};     ///< per layer (28 layers: 1.7 ms, a Qwen3-0.6B step of 16 tokens on the H200)
  std::uint32_t k{128};              ///< config::publish_every (one gather per K hooks)
  int rounds{15};                    ///< interleaved rounds (after one warm-up round)
  int steps{20};                     ///< back-to-back steps per contestant per round
  std::uint64_t shard_bytes{1ULL << 30};
  std::uint64_t queue_bytes{64ULL << 20};  ///< the sink's max_queue_bytes
  std::uint64_t io_threads{2};      ///< safetensors_tuning (--io-threads, --write-mib, --write-buffers)
  std::uint64_t write_bytes{16ULL << 20};
  std::uint64_t write_buffers{6};
  std::uint64_t lend_min{256ULL << 10};  ///< safetensors_tuning::lend_min_bytes (--lend-kib; 0: every entry copied)
  std::uint64_t open_shards{0};  ///< safetensors_tuning::open_shards (--open-shards; 0: two on tmpfs, else one)
  bool fsync{true};
  bool direct_io{true};  ///< safetensors_config::direct_io (--no-direct-io: buffered shards, entries lent)
  std::uint64_t shm_entry{64ULL << 20};     ///< reader throughput: entry bytes
  std::uint64_t shm_entries{256};
  std::uint64_t shm_staging{1ULL << 30};    ///< throughput run's staging (capped by /dev/shm's free space)
  std::uint64_t full_every{8};              ///< the reader checks every byte of every Nth entry (all: a sample)
  int checkers{4};                          ///< the reader's threads for those full checks
  int check_threads{8};                     ///< read-back of the shards
  bool safetensors{true}, shm{true}, keep{false}, quick{false};
  /// The checks' own test (--inject-fault): one byte of the first block shard flipped before the read-back, and one
  /// entry of the reader's throughput run expected with another pattern; each must be found, exactly once.
  bool inject_fault{false};
};

/// A tiny JSON writer (objects, numbers, strings, booleans) for the binary's output.
class json_out {
 public:
  /// depth: how deep the object sits in the document (its indentation), for raw().
  explicit json_out(std::size_t depth = 0) : first_(depth + 1, true) {}
  json_out& key(const std::string& k);
  json_out& num(const std::string& k, double v, int digits = 4);
  json_out& u64(const std::string& k, std::uint64_t v);
  json_out& str(const std::string& k, const std::string& v);
  json_out& boolean(const std::string& k, bool v);
  json_out& open(const std::string& k);  ///< a nested object
  json_out& close();
  json_out& raw(const std::string& k, const std::string& value);  ///< a value written by another json_out
  [[nodiscard]] std::string text() const { return s_ + "\n" + std::string(2 * (first_.size() - 1), ' ') + "}"; }

 private:
  void sep();
  std::string s_{"{"};
  std::vector<bool> first_;
  std::string indent() const { return "\n" + std::string(2 * first_.size(), ' '); }
};

/// Median, min and max of a contestant's per-step times (us).
struct spread {
  double median{0}, min{0}, max{0};
};
[[nodiscard]] spread spread_of(const std::vector<double>& us);

// ---- the forward (forward_rig.cpp) -------------------------------------------------------------------------
/// Hook h of every forward: bytes[h] = tokens x row_bytes[h] at act + off[h]; word i of forward `tag` is
/// pattern_word(key(tag, h), i).
struct forward_shape {
  std::uint64_t hooks{341}, tokens{16};
  std::vector<std::uint64_t> row_bytes, bytes, off;
  std::uint64_t step_bytes{0};  ///< sum of bytes: one forward's capture
  std::uint64_t span{0};        ///< bytes of the activation buffer (each hook 256-byte aligned)
  explicit forward_shape(std::uint64_t tokens);
  [[nodiscard]] std::uint64_t key(std::uint64_t tag, std::uint64_t hook) const { return tag * hooks + hook; }
  /// The sinks' schema: token_ids (i64, row {}), hook<h> (bf16, row {row_bytes / 2}), logits (bf16).
  [[nodiscard]] fd::hook_schema schema() const;
};

/// One contestant of the forward: its channel (none: no capture) and graph.
struct contestant {
  std::string name;
  std::unique_ptr<fd::channel<B>> ch;
  std::optional<fb::graph_exec<B>> g;
  fd::forward_plan plan;
  std::vector<double> us;     ///< per step, one value per round
  std::uint64_t replays{0};
};

class forward_rig {
 public:
  explicit forward_rig(const options& o);
  forward_rig(const forward_rig&) = delete;
  forward_rig& operator=(const forward_rig&) = delete;

  [[nodiscard]] const forward_shape& shape() const { return shape_; }
  /// The channel configuration of every capturing contestant (ring: 4 forwards).
  [[nodiscard]] fd::config channel_config() const;
  /// A contestant capturing into `ch` (null: the forward alone); its graph is captured here.
  [[nodiscard]] std::unique_ptr<contestant> make(std::string name, std::unique_ptr<fd::channel<B>> ch);
  /// One step: plan (tag = the forward counter) and replay.
  void step(contestant& c);
  /// `n` back-to-back steps of `c`; us per step (events around them). Waits for `c`'s entries to be delivered.
  double run(contestant& c, int n);
  /// A warm-up round, then `rounds` rounds of `steps` steps of each contestant (order rotated every round).
  void interleave(const std::vector<contestant*>& cs, int rounds, int steps);
  /// Waits (up to 120 s) until every entry `c` captured was delivered to its consumer.
  void wait_delivered(contestant& c);
  [[nodiscard]] std::uint64_t forwards() const { return tag_; }  ///< forwards replayed so far (= the next tag)
  [[nodiscard]] B backend() const { return b_; }
  [[nodiscard]] fb::stream<B>& stream() { return s_; }
  [[nodiscard]] std::string device_name() const;

 private:
  options o_;
  forward_shape shape_;
  B b_{};
  int sms_{1};
  fb::stream<B> s_;
  fb::device_buffer<B> act_, mix_, aux_;
  std::uint64_t tag_{0};
};

// ---- the parts ------------------------------------------------------------------------------------------------
/// disk.cpp: `bytes` written with O_DIRECT in 16 MiB writes, then fsync; GB/s. `method` says how.
struct disk_result {
  double gbps{0}, seconds{0};
  std::uint64_t bytes{0};
  std::size_t files{1};  ///< files written at once
  std::string method, error;
};
[[nodiscard]] disk_result disk_write(const fs::path& dir, std::uint64_t bytes, std::size_t files = 1);
[[nodiscard]] std::uint64_t free_bytes(const fs::path& dir);

/// shard_check.cpp: what the read-back of a run directory found.
struct run_check {
  std::uint64_t shards{0}, file_bytes{0}, data_bytes{0};
  std::uint64_t entries_checked{0}, entries_bad{0};
  std::uint64_t forwards{0}, forwards_torn{0};  ///< distinct tags; tags without exactly `hooks` tensors
  std::set<std::uint64_t> tags;
  std::uint64_t problems{0};  ///< index / header / file problems (each also makes entries bad or missing)
  std::string first_problem;
  double seconds{0};
};
[[nodiscard]] run_check check_run(const fs::path& dir, const forward_shape& shape, int threads);

/// safetensors.cpp: writes the "safetensors" object.
void run_safetensors(const options& o, forward_rig& rig, json_out& out, bool& ok);
/// shm.cpp: writes the "shm" object.
void run_shm(const options& o, forward_rig& rig, json_out& out, bool& ok);

// ---- the reader process (shm_reader.cpp) ----------------------------------------------------------------------
/// What the reader process checks: entries of `hooks` hooks (hooks == 1: every entry `entry_bytes`; else the
/// forward_shape of `tokens`), word i of an entry pattern_word(tag * hooks + hook, i).
struct reader_args {
  std::string name;
  std::uint64_t hooks{1}, tokens{0}, entry_bytes{0}, full_every{8}, warmup{8};
  int checkers{4};
  bool fault{false};  ///< --inject-fault: the 3rd entry is expected with another pattern (so it is bad)
};
/// What the reader reported (its last line).
struct reader_result {
  std::uint64_t entries{0}, bytes{0}, sampled{0}, full{0}, bad{0};
  double gbps{0}, seconds{0};
  std::string first_bad, error;
};
/// The reader's main (--reader ...): returns the process's exit status.
int reader_main(const std::vector<std::string>& args);
/// The reader process: spawned from this binary, stdout piped; killed (SIGKILL) and reaped if still running at
/// destruction.
class reader_process {
 public:
  explicit reader_process(const reader_args& a);
  reader_process(const reader_process&) = delete;
  reader_process& operator=(const reader_process&) = delete;
  ~reader_process();
  /// Waits up to `timeout` for the line starting with "attached".
  [[nodiscard]] bool attached(std::chrono::milliseconds timeout);
  /// Waits up to `timeout` for its result line and its exit.
  [[nodiscard]] reader_result result(std::chrono::milliseconds timeout);

 private:
  std::optional<std::string> line(std::chrono::milliseconds timeout);
  int pid_{-1}, out_{-1};
  std::string buf_;
};
/// What the reader checks of every entry, in words (the JSON's "check" string).
[[nodiscard]] std::string reader_check_text(std::uint64_t full_every, int checkers);

}  // namespace ferry::bench::sinks
