// SPDX-License-Identifier: Apache-2.0
// ferry_bench_sinks: ferry's native sinks (issue 28) on the backend it was built for (CUDA when FERRY_ENABLE_CUDA,
// else the host-emulated device), under a graphed vllm-full forward of `tokens` rows per hook (sinks.hpp):
//   safetensors  the disk's O_DIRECT write rate beside the sink's sustained rate (policy block, fsync on), and the
//                forward's cost with the sink (policy drop) and with a null in-process consumer
//   shm          a reader process's GB/s with 64 MiB entries, and the forward's cost with that reader attached vs
//                with a null in-process consumer
// Everything captured is checked: the shards read back byte by byte, the stream's entries in the reader process.
// JSON on stdout (the keys of docs/perf/h200/sinks.json's "safetensors" and "shm", plus drops, stalls, spreads and
// sizes; bench/device/reports/run_files.py sinks merges it), a readable log on stderr. Exit status 1 when a
// check failed (a bad, missing or torn entry, an error), 2 for bad options.
//
// Usage: ferry_bench_sinks [--quick] [--dir DIR] [--volume-gib X] [--tokens N] [--rounds R] [--steps S] [--k K]
//          [--shard-mib N] [--queue-mib N] [--io-threads N] [--write-mib N] [--write-buffers N] [--lend-kib N] [--open-shards N] [--no-fsync] [--no-direct-io] [--shm-entry-mib N] [--shm-entries N] [--shm-staging-mib N]
//          [--full-every N] [--checkers N] [--check-threads N] [--only safetensors|shm] [--keep] [--inject-fault]
//   --dir: where the disk test and the shards go (default: <this binary's folder>/sinks-run; a disk, not /dev/shm)
//   --quick: the host smoke sizes (1 token, 24 MiB, 2 rounds of 2 steps, 24 entries of 1 MiB)
//   --inject-fault: the checks' test: a byte of a shard flipped before the read-back, an entry of the reader's
//     throughput run expected with another pattern; the exit status is 0 only if each is found exactly once
// Environment: FERRY_COMMIT, FERRY_DATE, FERRY_COMMAND are copied into the JSON.
#include "sinks.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <string>
#include <unistd.h>

namespace ferry::bench::sinks {

// ---- json_out -----------------------------------------------------------------------------------------------
void json_out::sep()
{
  if (!first_.back()) { s_ += ","; }
  first_.back() = false;
  s_ += indent();
}
json_out& json_out::key(const std::string& k)
{
  sep();
  s_ += "\"" + k + "\": ";
  return *this;
}
json_out& json_out::num(const std::string& k, double v, int digits)
{
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  key(k);
  s_ += std::isfinite(v) ? b : "null";
  return *this;
}
json_out& json_out::u64(const std::string& k, std::uint64_t v)
{
  key(k);
  s_ += std::to_string(v);
  return *this;
}
json_out& json_out::str(const std::string& k, const std::string& v)
{
  key(k);
  s_ += '"';
  for (const char c : v) {
    if (c == '"' || c == '\\') {
      s_ += '\\';
      s_ += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      s_ += b;
    } else {
      s_ += c;
    }
  }
  s_ += '"';
  return *this;
}
json_out& json_out::boolean(const std::string& k, bool v)
{
  key(k);
  s_ += v ? "true" : "false";
  return *this;
}
json_out& json_out::open(const std::string& k)
{
  key(k);
  s_ += "{";
  first_.push_back(true);
  return *this;
}
json_out& json_out::raw(const std::string& k, const std::string& value)
{
  key(k);
  s_ += value;
  return *this;
}
json_out& json_out::close()
{
  first_.pop_back();
  s_ += indent() + "}";
  return *this;
}

namespace {

[[noreturn]] void usage(const std::string& why)
{
  std::fprintf(stderr, "ferry_bench_sinks: %s (see the usage at the top of bench/sink/main.cpp)\n", why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv)
{
  options o;
  std::vector<std::string> a(argv + 1, argv + argc);
  for (const auto& x : a) {
    if (x == "--inject-fault") { o.inject_fault = true; }
    if (x == "--quick") {
      o.quick = true;
      o.tokens = 1;
      o.volume = 24 * MiB;
      o.rounds = 2;
      o.steps = 2;
      o.shard_bytes = 4 * MiB;
      o.queue_bytes = 2 * MiB;
      o.shm_entry = 1 * MiB;
      o.shm_entries = 24;
      o.shm_staging = 8 * MiB;
      o.full_every = 4;
      o.checkers = 2;
      o.check_threads = 2;
    }
  }
  const auto mib = [](const std::string& v) { return static_cast<std::uint64_t>(std::stod(v) * MiB); };
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string& k = a[i];
    if (k == "--quick" || k == "--inject-fault") { continue; }
    if (k == "--no-fsync") { o.fsync = false; continue; }
    if (k == "--no-direct-io") { o.direct_io = false; continue; }
    if (k == "--keep") { o.keep = true; continue; }
    if (i + 1 >= a.size()) { usage("option " + k + " without a value, or unknown"); }
    const std::string v = a[++i];
    try {
      if (k == "--dir") { o.dir = v; }
      else if (k == "--volume-gib") { o.volume = static_cast<std::uint64_t>(std::stod(v) * (1ULL << 30)); }
      else if (k == "--tokens") { o.tokens = std::stoull(v); }
      else if (k == "--rounds") { o.rounds = std::stoi(v); }
      else if (k == "--steps") { o.steps = std::stoi(v); }
      else if (k == "--k") { o.k = static_cast<std::uint32_t>(std::stoul(v)); }
      else if (k == "--shard-mib") { o.shard_bytes = mib(v); }
      else if (k == "--queue-mib") { o.queue_bytes = mib(v); }
      else if (k == "--io-threads") { o.io_threads = std::stoull(v); }
      else if (k == "--write-mib") { o.write_bytes = mib(v); }
      else if (k == "--write-buffers") { o.write_buffers = std::stoull(v); }
      else if (k == "--lend-kib") { o.lend_min = std::stoull(v) << 10; }
      else if (k == "--open-shards") { o.open_shards = std::stoull(v); }
      else if (k == "--shm-entry-mib") { o.shm_entry = mib(v); }
      else if (k == "--shm-entries") { o.shm_entries = std::stoull(v); }
      else if (k == "--shm-staging-mib") { o.shm_staging = mib(v); }
      else if (k == "--full-every") { o.full_every = std::stoull(v); }
      else if (k == "--checkers") { o.checkers = std::stoi(v); }
      else if (k == "--check-threads") { o.check_threads = std::stoi(v); }
      else if (k == "--only") {
        if (v != "safetensors" && v != "shm") { usage("--only takes safetensors or shm, got " + v); }
        o.safetensors = v == "safetensors";
        o.shm = v == "shm";
      } else { usage("unknown option " + k); }
    } catch (const std::logic_error&) {
      usage("option " + k + ": not a number: " + v);
    }
  }
  if (o.tokens == 0 || o.rounds < 1 || o.steps < 1 || o.k == 0 || o.shm_entries < 2 || o.full_every == 0) {
    usage("tokens, rounds, steps, k, full-every must be >= 1 and shm-entries >= 2");
  }
  if (o.dir.empty()) {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    o.dir = n > 0 ? fs::path{std::string{self, static_cast<std::size_t>(n)}}.parent_path() / "sinks-run" : fs::path{"sinks-run"};
  }
  return o;
}

}  // namespace
}  // namespace ferry::bench::sinks

int main(int argc, char** argv)
{
  namespace fs_ = ferry::bench::sinks;
  if (argc > 1 && std::string{argv[1]} == "--reader") {
    return fs_::reader_main(std::vector<std::string>(argv + 2, argv + argc));
  }
  const fs_::options o = fs_::parse(argc, argv);
  fs_::json_out out;
  bool ok = true;
  try {
    fs_::forward_rig rig{o};
    const auto& sh = rig.shape();
    out.str("backend", std::string{ferry::bench::B::name()}).str("device", rig.device_name());
    for (const auto& [env, k] : {std::pair{"FERRY_COMMIT", "commit"}, std::pair{"FERRY_DATE", "date"},
                                 std::pair{"FERRY_COMMAND", "command"}}) {
      if (const char* v = std::getenv(env)) { out.str(k, v); }
    }
    out.boolean("quick", o.quick).boolean("fault_injected", o.inject_fault).open("forward").u64("hooks", sh.hooks).u64("tokens", sh.tokens).u64("step_bytes", sh.step_bytes)
      .u64("layers", 28).u64("spin_ns_per_layer", o.spin_ns).u64("publish_every", o.k)
      .str("capture", "capture_deferred (one gather per publish_every hooks), graph replay").close();
    std::fprintf(stderr, "ferry_bench_sinks on %s (%s): %llu hooks, %llu tokens per step, %.2f MB per step\n",
                 rig.device_name().c_str(), std::string{ferry::bench::B::name()}.c_str(), static_cast<unsigned long long>(sh.hooks),
                 static_cast<unsigned long long>(sh.tokens), sh.step_bytes / 1e6);
    for (const bool st : {true, false}) {
      if (st ? !o.safetensors : !o.shm) { continue; }
      fs_::json_out part{1};
      bool part_ok = true;
      try {
        if (st) { fs_::run_safetensors(o, rig, part, part_ok); } else { fs_::run_shm(o, rig, part, part_ok); }
      } catch (const std::exception& e) {
        part = fs_::json_out{1};
        part.str("error", e.what());
        part_ok = false;
        std::fprintf(stderr, "%s: error: %s\n", st ? "safetensors" : "shm", e.what());
      }
      out.raw(st ? "safetensors" : "shm", part.text());
      ok = ok && part_ok;
    }
  } catch (const std::exception& e) {
    out.str("error", e.what());
    ok = false;
    std::fprintf(stderr, "ferry_bench_sinks: error: %s\n", e.what());
  }
  out.boolean("checks_passed", ok);
  std::printf("%s\n", out.text().c_str());
  std::fprintf(stderr, "ferry_bench_sinks: %s\n", !ok ? "a CHECK FAILED (see the JSON)"
                                                    : o.inject_fault ? "each injected fault was found, once" : "every check passed");
  return ok ? 0 : 1;
}
