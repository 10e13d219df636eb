// SPDX-License-Identifier: Apache-2.0
// Shared setup of the H2D benchmarks (bench/h2d/*.cpp): the backend, the anchor cases' member layouts, the
// runner (one publisher configuration measured eager or in a graph, with its first-consumer kernel and its
// check of the published bytes), and the JSON helpers of the summary.
#pragma once

#include <ferry/backend.hpp>
#include <ferry/h2d.hpp>
#include <ferry/testing/checksum.hpp>
#if defined(FERRY_BENCH_CUDA)
#include <ferry/backend/cuda/backend.hpp>
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry::bench {

#if defined(FERRY_BENCH_CUDA)
using B = ferry::backend::cuda_backend;
#else
using B = ferry::backend::host_backend;
#endif
/// The host backend runs a small demo: fewer iterations, fewer cases, no variants grid.
inline constexpr bool host_demo = std::is_same_v<B, ferry::backend::host_backend>;

namespace fb = ferry::backend;
namespace fh = ferry::h2d;

// ---- cases -----------------------------------------------------------------------------------------
struct member {
  std::string name;
  fh::count_unit unit;
  std::size_t element_size;
  std::size_t row_size;
  std::size_t count;  ///< published count (== capacity)
  [[nodiscard]] std::size_t bytes() const
  {
    return count * (unit == fh::count_unit::rows ? row_size : unit == fh::count_unit::elements ? element_size : 1);
  }
};

/// Decode step of a batch of 256 requests: 12 members, 79,876 bytes.
[[nodiscard]] std::vector<member> decode256();
/// `n` members of `bytes` bytes each.
[[nodiscard]] std::vector<member> uniform(std::size_t n, std::size_t bytes);
[[nodiscard]] std::size_t total_bytes(const std::vector<member>& members);

struct named_case {
  const char* name;
  std::vector<member> members;
};
/// The cases of shared/anchors-h200.md: decode256, tiny4, small32, small64.
[[nodiscard]] std::vector<named_case> anchor_cases();

/// Every upload backend, `automatic` last.
inline constexpr fh::upload_backend all_backends[] = {fh::upload_backend::direct, fh::upload_backend::batch,
                                                      fh::upload_backend::packed, fh::upload_backend::zerocopy,
                                                      fh::upload_backend::automatic};

// ---- data and reporting ----------------------------------------------------------------------------
/// The median (-1 for no values: null in the JSON).
[[nodiscard]] double median(std::vector<double> v);
/// `v` with 3 decimals, null when negative (not measured).
[[nodiscard]] std::string json_num(double v);
[[nodiscard]] std::string json_escape(std::string s);
/// Set when a verified iteration found published bytes that differ from their sources (exit status 3).
void note_mismatch();
[[nodiscard]] bool mismatch_seen();

// ---- the runner (runner.cpp) -----------------------------------------------------------------------
enum class variant { floor, upload };

/// Scatter knobs of one measurement (0 / -1: the publisher's defaults).
struct knobs {
  std::size_t tile_bytes{0};
  std::uint32_t threads{0};
  int speculation{-1};
};

/// One configured measurement: a publisher over `members` with backend `k`, eager or in a graph.
class runner {
 public:
  runner(const std::vector<member>& members, variant v, fh::upload_backend k, bool graph, knobs kn = {});

  [[nodiscard]] std::string chosen() const { return std::string{fh::to_string(pub_->info("meta").backend)}; }
  [[nodiscard]] std::string chosen_graph() const
  {
    return std::string{fh::to_string(pub_->info("meta").graph_backend)};
  }
  [[nodiscard]] std::uint32_t tiles() const { return pub_->info("meta").tiles; }

  /// One iteration: returns {gpu span us, cpu publish/stage us}.
  std::pair<double, double> iterate(std::uint64_t i, bool verify);

  struct stats {
    double gpu_us, cpu_us;
  };
  /// Medians of `iters` iterations after `warmup`; the first and the last are verified.
  stats measure(int iters, int warmup = 50);

 private:
  static constexpr std::uint32_t consumer_threads = 256;
  static constexpr std::size_t consumer_chunk = 16 * consumer_threads;  // one 16-byte load per thread

  void consume(fb::stream_view<B> s);
  void upload(void* dst, const void* src, std::size_t n);
  void check(std::size_t slot);

  std::vector<member> members_;
  variant variant_;
  fh::upload_backend backend_;
  bool graph_;
  B b_{};
  std::optional<fb::stream<B>> stream_;
  std::optional<fb::event<B>> t0_, t1_;
  std::unique_ptr<fh::publisher<B>> pub_;
  std::vector<fh::buffer_handle> handles_;
  ferry::testing::checksum_params consumer_{};
  std::optional<fb::device_buffer<B>> more_, out_;
  std::vector<fb::graph_exec<B>> graphs_;
};

// ---- the JSON summary (summary.cpp, variants.cpp) and Google Benchmark's runs (gbench.cpp) ---------
/// Measures the anchor cases round-robin and writes the summary to `path` (and stdout); 0 when written.
int write_json(const std::string& path);
/// `,\n  "variants": {...}`: the scatter knob grid of decode256 and small64 (CUDA only).
[[nodiscard]] std::string variants_json(int iters);
/// Registers h2d/<case>/<backend>/<eager|graph> for the anchor cases and the sweeps.
void register_all();

}  // namespace ferry::bench
