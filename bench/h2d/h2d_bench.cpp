// SPDX-License-Identifier: Apache-2.0
// H2D metadata publication benchmark (Google Benchmark + a JSON summary for docs/perf).
//
// Built twice: ferry_bench_h2d (CUDA backend, FERRY_BENCH_CUDA) and ferry_bench_h2d_host (host backend,
// a demo that runs anywhere). Measured like shared/anchors-h200.md:
//   GPU span : event before the first upload operation -> end of a first-consumer kernel that reads every
//              published byte (checksum kernel: one block of 256 threads per 4 KiB chunk of a member, one
//              16-byte load per thread, chunk descriptors in the kernel parameters: a realistic cheap first
//              consumer, the same for every variant), median of many iterations after a warm-up;
//   floor    : the same span with no upload (event, consumer, event);
//   CPU      : wall time of publish() (eager: validation + arena header + enqueue) or stage() (graph).
// Eager spans include the CPU's enqueue latency (the GPU is idle when the first event runs), as in the
// reference figures. Data are random and non-zero; every variant verifies the published bytes on its first
// and last iteration, and the process exits non-zero on a mismatch.
//
//   --ferry_json=PATH  write {"device","commit","date","command","cases":{...}} (stripped before gbench)
//   FERRY_BENCH_ITERS  iterations per JSON cell (default 1000; 200 on the host backend); the "variants"
//                      grid (scatter tile bytes x threads x speculation, graph, decode256 and small64) uses
//                      half as many
//   FERRY_BENCH_VARIANTS=0  skip the variants grid
#include <ferry/backend.hpp>
#include <ferry/h2d.hpp>
#include <ferry/h2d/detail/kernels.hpp>  // scatter_kernel: the bare-API floor
#include <ferry/testing/checksum.hpp>
#if defined(FERRY_BENCH_CUDA)
#include <ferry/backend/cuda/backend.hpp>
#endif

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fb = ferry::backend;
namespace fh = ferry::h2d;

#if defined(FERRY_BENCH_CUDA)
using B = fb::cuda_backend;
#else
using B = fb::host_backend;
#endif

bool g_mismatch = false;

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
std::vector<member> decode256()
{
  using u = fh::count_unit;
  return {
    {"input_ids", u::elements, 4, 0, 256},     {"positions", u::elements, 8, 0, 256},
    {"seq_lens", u::elements, 4, 0, 256},      {"slot_mapping", u::elements, 8, 0, 256},
    {"block_tables", u::rows, 4, 256, 256},    {"query_start_loc", u::elements, 4, 0, 257},
    {"temperature", u::elements, 4, 0, 256},   {"top_p", u::elements, 4, 0, 256},
    {"top_k", u::elements, 4, 0, 256},         {"min_p", u::elements, 4, 0, 256},
    {"seeds", u::elements, 8, 0, 256},         {"logits_indices", u::elements, 4, 0, 256},
  };
}

std::vector<member> uniform(std::size_t n, std::size_t bytes)
{
  std::vector<member> v;
  for (std::size_t i = 0; i < n; ++i) { v.push_back({fmt::format("m{}", i), fh::count_unit::bytes, 1, 0, bytes}); }
  return v;
}

double median(std::vector<double> v)
{
  if (v.empty()) { return -1.0; }
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

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
  runner(const std::vector<member>& members, variant v, fh::upload_backend k, bool graph, knobs kn = {})
    : members_{members}, variant_{v}, backend_{k}, graph_{graph}
  {
    stream_.emplace(b_);
    t0_.emplace(b_, fb::event_flags::timing);
    t1_.emplace(b_, fb::event_flags::timing);
    pub_ = std::make_unique<fh::publisher<B>>(b_);
    for (const auto& m : members_) {
      handles_.push_back(pub_->declare({.name = m.name, .groups = {"meta"}, .unit = m.unit, .element_size = m.element_size,
                                        .row_size = m.row_size, .capacity = m.count}));
    }
    fh::config c;
    c.slots = 2;
    c.backend = k;
    c.device = b_.current_device();
    c.calibration_iterations = 25;
    if (kn.tile_bytes != 0) { c.tile_bytes = kn.tile_bytes; }
    if (kn.threads != 0) { c.threads_per_tile = kn.threads; }
    c.speculation = kn.speculation;
    pub_->initialize(c, stream_->view());
    // Consumer chunks: every member's published bytes, cut into consumer_chunk pieces (one block each).
    std::vector<ferry::testing::checksum_chunk> chunks;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      const auto base = reinterpret_cast<std::uintptr_t>(pub_->device_pointer(handles_[i]));
      const std::size_t n = members_[i].bytes();
      for (std::size_t off = 0; off < n; off += consumer_chunk) {
        chunks.push_back({base + off, std::min(consumer_chunk, n - off)});
      }
    }
    constexpr std::size_t inl = ferry::testing::checksum_params::inline_max;
    consumer_.count = static_cast<std::uint32_t>(chunks.size());
    for (std::size_t i = 0; i < chunks.size() && i < inl; ++i) { consumer_.chunk[i] = chunks[i]; }
    if (chunks.size() > inl) {
      const std::size_t extra = (chunks.size() - inl) * sizeof(chunks[0]);
      more_.emplace(extra, b_);
      upload(more_->data(), chunks.data() + inl, extra);
      consumer_.more = more_->template as<const ferry::testing::checksum_chunk>();
    }
    out_.emplace(8 * consumer_threads * chunks.size(), b_);
    consumer_.out = out_->template as<std::uint64_t>();
    // Random non-zero data in both slots' sources; the stamp word changes every iteration.
    std::mt19937_64 rng{0xF3EE + members_.size()};
    for (std::size_t slot = 0; slot < 2; ++slot) {
      auto s = pub_->begin(slot);
      auto p = pub_->producer("meta");
      for (std::size_t i = 0; i < members_.size(); ++i) {
        auto span = p.source<std::uint8_t>(handles_[i]);
        for (auto& x : span) { x = static_cast<std::uint8_t>(rng() | 1u); }
        p.set_count(handles_[i], members_[i].count);
      }
      if (graph_) {
        graphs_.push_back(fb::graph_exec<B>::capture(stream_->view(), [&](fb::stream_view<B> sv) {
          if (variant_ == variant::upload) { pub_->capture_upload("meta", slot, sv); }
          consume(sv);
        }));
      }
      s.finish();  // counts set, nothing published: the next epoch of this slot starts clean
    }
    stream_->synchronize();
  }

  [[nodiscard]] std::string chosen() const
  {
    return std::string{fh::to_string(pub_->info("meta").backend)};
  }
  [[nodiscard]] std::string chosen_graph() const
  {
    return std::string{fh::to_string(pub_->info("meta").graph_backend)};
  }
  [[nodiscard]] std::uint32_t tiles() const { return pub_->info("meta").tiles; }

  /// One iteration: returns {gpu span us, cpu publish/stage us}.
  std::pair<double, double> iterate(std::uint64_t i, bool verify)
  {
    const std::size_t slot = i % 2;
    auto s = pub_->begin(slot);
    double cpu_us = 0;
    if (variant_ == variant::upload) {
      {
        auto p = pub_->producer("meta");
        for (std::size_t m = 0; m < members_.size(); ++m) {
          auto span = p.source<std::uint8_t>(handles_[m]);
          const std::uint64_t stamp = (i << 8) | 0x80u | m;
          std::memcpy(span.data(), &stamp, std::min<std::size_t>(8, span.size()));
          p.set_count(handles_[m], members_[m].count);
        }
      }
      if (graph_) {
        const auto c0 = std::chrono::steady_clock::now();
        pub_->stage("meta");
        cpu_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
        t0_->record(*stream_);
        graphs_[slot].launch(*stream_);
      } else {
        t0_->record(*stream_);
        const auto c0 = std::chrono::steady_clock::now();
        pub_->publish("meta", stream_->view());
        cpu_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
        consume(stream_->view());
      }
    } else {
      t0_->record(*stream_);
      if (graph_) {
        graphs_[slot].launch(*stream_);
      } else {
        consume(stream_->view());
      }
    }
    t1_->record(*stream_);
    s.finish();
    t1_->synchronize();
    const double gpu_us = static_cast<double>(t1_->elapsed_ms_since(*t0_)) * 1000.0;
    if (verify && variant_ == variant::upload) { check(slot); }
    return {gpu_us, cpu_us};
  }

  struct stats {
    double gpu_us, cpu_us;
  };
  stats measure(int iters, int warmup = 50)
  {
    std::vector<double> gpu, cpu;
    for (int i = 0; i < warmup + iters; ++i) {
      const bool verify = i == 0 || i == warmup + iters - 1;
      auto [g, c] = iterate(static_cast<std::uint64_t>(i), verify);
      if (i >= warmup) {
        gpu.push_back(g);
        cpu.push_back(c);
      }
    }
    return {median(gpu), median(cpu)};
  }

 private:
  static constexpr std::uint32_t consumer_threads = 256;
  static constexpr std::size_t consumer_chunk = 16 * consumer_threads;  // one 16-byte load per thread

  void consume(fb::stream_view<B> s)
  {
    b_.launch(ferry::testing::checksum_kernel(B::tag{}), fb::launch_config{{consumer_.count}, {consumer_threads}, 0},
              s.handle(), consumer_);
  }

  void upload(void* dst, const void* src, std::size_t n)
  {
    fb::pinned_buffer<B> tmp{n, b_};
    std::memcpy(tmp.data(), src, n);
    b_.memcpy_async(dst, tmp.data(), n, fb::memcpy_kind::host_to_device, stream_->handle());
    stream_->synchronize();
  }

  /// Published bytes == the slot's sources (read through a fresh producer of the next epoch of the slot
  /// would rewrite them; read them before, through the device copy and a host copy of the arena).
  void check(std::size_t slot)
  {
    stream_->synchronize();
    auto s = pub_->begin(slot);  // waits for the slot; the sources still hold what was published
    auto p = pub_->producer("meta");
    for (std::size_t m = 0; m < members_.size(); ++m) {
      auto span = p.source<std::uint8_t>(handles_[m]);
      const std::size_t n = members_[m].bytes();
      fb::pinned_buffer<B> tmp{n, b_};
      b_.memcpy_async(tmp.data(), pub_->device_pointer(handles_[m]), n, fb::memcpy_kind::device_to_host,
                      stream_->handle());
      stream_->synchronize();
      if (std::memcmp(tmp.data(), span.data(), n) != 0) {
        std::fprintf(stderr, "ferry_bench_h2d: MISMATCH in member '%s' (%s%s)\n", members_[m].name.c_str(),
                     std::string{fh::to_string(backend_)}.c_str(), graph_ ? ", graph" : "");
        g_mismatch = true;
      }
      p.set_count(handles_[m], members_[m].count);
    }
    // Leave the epoch unpublished (sources unchanged).
  }

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

struct named_case {
  const char* name;
  std::vector<member> members;
};

std::vector<named_case> anchor_cases()
{
  return {{"decode256", decode256()}, {"tiny4", uniform(4, 64)}, {"small32", uniform(32, 256)}, {"small64", uniform(64, 512)}};
}

const fh::upload_backend kAll[] = {fh::upload_backend::direct, fh::upload_backend::batch, fh::upload_backend::packed,
                                   fh::upload_backend::zerocopy, fh::upload_backend::automatic};

std::string json_num(double v) { return v < 0 ? "null" : fmt::format("{:.3f}", v); }

std::string json_escape(std::string s)
{
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') { o.push_back('\\'); }
    if (static_cast<unsigned char>(c) >= 0x20) { o.push_back(c); }
  }
  return o;
}

/// CPU cost of the bare API calls publish() makes (no validation): packed = one H2D copy of `bytes` from
/// pinned memory + one scatter-sized launch; zerocopy = the launch alone. publish()'s CPU time minus these
/// is ferry's own overhead.
std::string api_floor_json(int iters)
{
  B b{};
  fb::stream<B> st{b};
  const std::size_t bytes = 80 * 1024;
  fb::pinned_buffer<B> host{bytes, b};
  fb::device_buffer<B> dev{bytes, b};
  std::memset(host.data(), 1, bytes);
  ferry::h2d::detail::scatter_params p{};
  p.tile_count = 0;  // launches, copies nothing
  auto k = ferry::h2d::detail::scatter_kernel(B::tag{});
  b.preload(k);
  auto time = [&](bool copy) {
    std::vector<double> v;
    for (int i = 0; i < iters + 50; ++i) {
      const auto c0 = std::chrono::steady_clock::now();
      if (copy) { b.memcpy_async(dev.data(), host.data(), bytes, fb::memcpy_kind::host_to_device, st.handle()); }
      b.launch(k, fb::launch_config{{28}, {128}, 0}, st.handle(), p);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
      st.synchronize();
      if (i >= 50) { v.push_back(us); }
    }
    return median(std::move(v));
  };
  const double both = time(true);
  const double launch = time(false);
  std::fprintf(stderr, "ferry_bench_h2d: bare API CPU: memcpy(80 KiB)+launch %.2f us, launch %.2f us\n", both, launch);
  return fmt::format(",\n  \"api_cpu_us\": {{\"memcpy_plus_launch\": {}, \"launch\": {}}}", json_num(both),
                     json_num(launch));
}

/// Scatter knob grid (graph and eager) for decode256 and small64: tile bytes x threads per tile, packed and
/// zerocopy (graph: speculation 1 and 2 for zerocopy), plus speculation 0 at the default tile.
std::string variants_json(int iters)
{
  struct row {
    std::string backend;
    std::size_t tile;
    std::uint32_t threads;
    int spec;
    bool graph;
    double us;
  };
  std::string out = ",\n  \"variants\": {";
  bool first_case = true;
  for (auto& c : anchor_cases()) {
    if (std::string_view{c.name} != "decode256" && std::string_view{c.name} != "small64") { continue; }
    std::vector<row> rows;
    auto run = [&](fh::upload_backend k, std::size_t tile, std::uint32_t th, int spec, bool graph) {
      runner r{c.members, variant::upload, k, graph, knobs{tile, th, spec}};
      rows.push_back({std::string{fh::to_string(k)}, tile, th, spec, graph, r.measure(iters).gpu_us});
    };
    for (std::size_t tile : {1024, 2048, 4096, 8192, 16384, 32768}) {
      for (std::uint32_t th : {64u, 128u, 256u}) {
        run(fh::upload_backend::packed, tile, th, -1, true);
        run(fh::upload_backend::zerocopy, tile, th, 1, true);
        run(fh::upload_backend::zerocopy, tile, th, 2, true);
        run(fh::upload_backend::packed, tile, th, -1, false);
        run(fh::upload_backend::zerocopy, tile, th, -1, false);
      }
    }
    run(fh::upload_backend::packed, 4096, 128, 0, true);
    run(fh::upload_backend::zerocopy, 4096, 128, 0, true);
    std::fprintf(stderr, "\nvariants %s (us, median of %d): tile threads | graph: packed zc(spec1) zc(spec2) | eager: packed zc\n",
                 c.name, iters);
    for (std::size_t i = 0; i + 5 <= rows.size() - 2; i += 5) {
      std::fprintf(stderr, "  %5zu %4u | %7.2f %7.2f %7.2f | %7.2f %7.2f\n", rows[i].tile, rows[i].threads, rows[i].us,
                   rows[i + 1].us, rows[i + 2].us, rows[i + 3].us, rows[i + 4].us);
    }
    std::fprintf(stderr, "  spec0 at 4096/128 graph: packed %.2f zc %.2f\n", rows[rows.size() - 2].us, rows.back().us);
    out += fmt::format("{}\n    \"{}\": [", first_case ? "" : ",", c.name);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      out += fmt::format("{}\n      {{\"backend\": \"{}\", \"tile_bytes\": {}, \"threads\": {}, \"speculation\": {}, "
                         "\"graph\": {}, \"us\": {}}}",
                         i == 0 ? "" : ",", r.backend, r.tile, r.threads, r.spec, r.graph ? "true" : "false", json_num(r.us));
    }
    out += "\n    ]";
    first_case = false;
  }
  out += "\n  }";
  return out;
}

int write_json(const std::string& path)
{
  int iters = std::is_same_v<B, fb::host_backend> ? 200 : 1000;
  if (const char* e = std::getenv("FERRY_BENCH_ITERS")) { iters = std::max(1, std::atoi(e)); }
  auto env = [](const char* n) { const char* v = std::getenv(n); return std::string{v != nullptr ? v : ""}; };
  B b{};
  const std::string device = b.attributes(b.current_device()).name;
  std::string out = fmt::format("{{\n  \"device\": \"{}\",\n  \"backend\": \"{}\",\n  \"commit\": \"{}\",\n  \"date\": \"{}\",\n  \"command\": \"{}\",\n  \"iterations\": {},\n  \"cases\": {{",
                                json_escape(device), B::name(), json_escape(env("FERRY_COMMIT")), json_escape(env("FERRY_DATE")),
                                json_escape(env("FERRY_COMMAND")), iters);
  bool first_case = true;
  for (auto& c : anchor_cases()) {
    std::map<std::string, std::string> cell;
    std::size_t bytes = 0;
    for (const auto& m : c.members) { bytes += m.bytes(); }
    // Every cell of the case is replayed round-robin (one iteration of each per round, after 50 warm-up
    // rounds), so clock or machine drift during the case hits every backend alike and "auto within 5% of
    // the best fixed backend" compares like with like.
    struct contestant {
      std::string key;
      std::unique_ptr<runner> r;
      std::vector<double> gpu, cpu;
    };
    std::vector<contestant> rs;
    rs.push_back({"floor", std::make_unique<runner>(c.members, variant::floor, fh::upload_backend::direct, false)});
    rs.push_back({"floor_graph", std::make_unique<runner>(c.members, variant::floor, fh::upload_backend::direct, true)});
    for (auto k : kAll) {
      const std::string kn{fh::to_string(k)};
      rs.push_back({kn, std::make_unique<runner>(c.members, variant::upload, k, false)});
      if (k != fh::upload_backend::batch) {  // cudaMemcpyBatchAsync cannot be captured
        rs.push_back({kn + "_graph", std::make_unique<runner>(c.members, variant::upload, k, true)});
      }
    }
    constexpr int warmup = 50;
    // The order within a round is shuffled every round (fixed seed): in a fixed order each cell always
    // followed the same predecessor, and auto's graph cell (the same zero-copy backend as zerocopy_graph,
    // right after a different eager cell) measured 0.03-0.38 us above zerocopy_graph for tiny4, small32
    // and small64 in each of three runs (docs/perf/journal.md).
    std::vector<std::size_t> order(rs.size());
    for (std::size_t k = 0; k < order.size(); ++k) { order[k] = k; }
    std::mt19937 shuffle_rng{0x5EED};
    for (int i = 0; i < warmup + iters; ++i) {
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      for (const std::size_t k : order) {
        auto& x = rs[k];
        const bool verify = i == 0 || i == warmup + iters - 1;
        auto [g, cpu] = x.r->iterate(static_cast<std::uint64_t>(i), verify);
        if (i >= warmup) {
          x.gpu.push_back(g);
          x.cpu.push_back(cpu);
        }
      }
    }
    cell["batch_graph_us"] = "null";
    for (auto& x : rs) {
      cell[x.key + "_us"] = json_num(median(x.gpu));
      if (x.key.rfind("floor", 0) != 0) { cell[x.key + "_cpu_us"] = json_num(median(x.cpu)); }
      if (x.key == "auto") {
        cell["auto_choice"] = "\"" + x.r->chosen() + "\"";
        cell["auto_graph_choice"] = "\"" + x.r->chosen_graph() + "\"";
      }
      if (x.key == "packed") { cell["tiles"] = fmt::format("{}", x.r->tiles()); }
    }
    std::string fields;
    for (const auto& [key, v] : cell) { fields += fmt::format("{}\"{}\": {}", fields.empty() ? "" : ", ", key, v); }
    out += fmt::format("{}\n    \"{}\": {{\"members\": {}, \"bytes\": {}, {}}}", first_case ? "" : ",", c.name,
                       c.members.size(), bytes, fields);
    first_case = false;
    std::fprintf(stderr, "ferry_bench_h2d: %s done\n", c.name);
  }
  out += "\n  }";
  out += api_floor_json(iters);
  if (env("FERRY_BENCH_VARIANTS") != "0" && !std::is_same_v<B, fb::host_backend>) {
    out += variants_json(std::max(1, iters / 2));
  }
  out += "\n}\n";
  std::ofstream f{path};
  f << out;
  std::fputs(out.c_str(), stdout);
  return f.good() ? 0 : 1;
}

// ---- Google Benchmark registrations: anchor cases and sweeps, every backend, eager and graph ------------

void run_bm(benchmark::State& state, std::vector<member> members, variant v, fh::upload_backend k, bool graph)
{
  runner r{members, v, k, graph};
  for (int i = 0; i < 20; ++i) { (void)r.iterate(static_cast<std::uint64_t>(i), i == 0); }
  std::vector<double> gpu, cpu;
  std::uint64_t i = 20;
  for (auto _ : state) {
    auto [g, c] = r.iterate(i++, false);
    state.SetIterationTime(g * 1e-6);
    gpu.push_back(g);
    cpu.push_back(c);
  }
  (void)r.iterate(i, true);
  state.counters["gpu_median_us"] = median(gpu);
  state.counters["cpu_median_us"] = median(cpu);
  std::size_t bytes = 0;
  for (const auto& m : members) { bytes += m.bytes(); }
  state.counters["bytes"] = static_cast<double>(bytes);
  if (k == fh::upload_backend::automatic && v == variant::upload) { state.SetLabel("auto=" + r.chosen()); }
}

void register_all()
{
  const int iters = std::is_same_v<B, fb::host_backend> ? 50 : 300;
  std::vector<named_case> cases = anchor_cases();
  if (std::is_same_v<B, fb::host_backend>) {
    cases.resize(2);  // the host demo stays small
  } else {
    for (std::size_t n : {1, 2, 8, 16, 128, 256}) { cases.push_back({"", uniform(n, 256)}); }
    for (std::size_t sz : {16, 1024, 4096, 16384, 65536}) { cases.push_back({"", uniform(16, sz)}); }
  }
  static std::vector<std::string> names;  // benchmark keeps the pointer
  for (auto& c : cases) {
    const std::string cname = c.name[0] != '\0' ? std::string{c.name}
                                                : fmt::format("sweep_{}x{}B", c.members.size(), c.members.front().bytes());
    for (bool graph : {false, true}) {
      const std::string mode = graph ? "graph" : "eager";
      benchmark::RegisterBenchmark(fmt::format("h2d/{}/floor/{}", cname, mode).c_str(), run_bm, c.members,
                                   variant::floor, fh::upload_backend::direct, graph)
        ->UseManualTime()
        ->Iterations(iters)
        ->Unit(benchmark::kMicrosecond);
      for (auto k : kAll) {
        if (graph && k == fh::upload_backend::batch) { continue; }
        benchmark::RegisterBenchmark(fmt::format("h2d/{}/{}/{}", cname, fh::to_string(k), mode).c_str(), run_bm,
                                     c.members, variant::upload, k, graph)
          ->UseManualTime()
          ->Iterations(iters)
          ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv)
{
  std::string json_path;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a{argv[i]};
    if (a.rfind("--ferry_json=", 0) == 0) {
      json_path = std::string{a.substr(13)};
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  if (B{}.device_count() <= 0) {
    std::fprintf(stderr, "ferry_bench_h2d: no %s device\n", std::string{B::name()}.c_str());
    return 2;
  }
  int rc = 0;
  try {
    if (!json_path.empty()) { rc = write_json(json_path); }
    benchmark::Initialize(&n, args.data());
    register_all();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry_bench_h2d: %s\n", e.what());
    return 1;
  }
  if (g_mismatch) {
    std::fprintf(stderr, "ferry_bench_h2d: published bytes did not match their sources\n");
    return 3;
  }
  return rc;
}
