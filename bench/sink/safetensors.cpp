// SPDX-License-Identifier: Apache-2.0
// The safetensors sink under the graphed vllm-full forward (ferry_bench_sinks, "safetensors"):
//   disk      the disk's O_DIRECT write bandwidth, same filesystem, same size, before and after the sink's run, on
//             as many files at once as the sink writes (stats().open_shards: two on tmpfs); disk_write_gbps is the
//             better of the two (the disk's figure the sink is held against). Where that is more than one file,
//             one_file_gbps is a single file's rate (dd's), measured before them
//   block     policy block, fsync on: the forward replayed back to back until `volume` bytes were captured;
//             sink_write_gbps = the shards' tensor data bytes (not their headers, nor a header's padding: the first
//             shard reserves room for a header guessed large) / (first replay -> the sink's close() returned: every shard
//             and index.json fsynced). Capture outruns the disk: the forward is throttled, nothing is lost
//   drop      policy drop, interleaved rounds beside the forward alone (no_capture) and an in-process consumer
//             that drops each entry (null_consumer): forward_overhead_pct and null_consumer_overhead_pct vs
//             no capture, whole forwards dropped and counted
// Both runs are read back (shard_check.cpp): every tensor byte-exact, every forward whole, block's all there.
#include "sinks.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace ferry::bench::sinks {

namespace {

fk::safetensors_config sink_config(const options& o, const forward_shape& sh, const fs::path& dir, fk::queue_policy p)
{
  fk::safetensors_config sc;
  sc.directory = dir;
  sc.schema = sh.schema();
  sc.shard_bytes = o.shard_bytes;
  sc.max_queue_bytes = o.queue_bytes;
  sc.tuning = {.io_threads = o.io_threads, .write_buffers = o.write_buffers, .write_bytes = o.write_bytes,
               .lend_min_bytes = o.lend_min, .open_shards = o.open_shards};
  sc.policy = p;
  sc.block_timeout = std::chrono::seconds(60);
  sc.fsync = o.fsync;
  sc.direct_io = o.direct_io;
  sc.overwrite = true;
  return sc;
}

/// --inject-fault: one byte in the middle of the shard's data section, inverted.
void flip_a_byte(const fs::path& shard)
{
  std::fstream f{shard, std::ios::in | std::ios::out | std::ios::binary};
  std::uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  const auto size = static_cast<std::uint64_t>(fs::file_size(shard));
  const auto at = static_cast<std::streamoff>(8 + n + (size - 8 - n) / 2);
  char c = 0;
  f.seekg(at);
  f.read(&c, 1);
  c = static_cast<char>(~c);
  f.seekp(at);
  f.write(&c, 1);
  if (!f) { throw std::runtime_error("--inject-fault: could not flip a byte of " + shard.string()); }
}

double pct_over(double x, double base) { return base > 0 ? (x / base - 1) * 100 : 0; }

void put_spread(json_out& out, const std::string& k, const contestant& c)
{
  const spread s = spread_of(c.us);
  out.num(k + "_us", s.median, 2).num(k + "_min_us", s.min, 2).num(k + "_max_us", s.max, 2);
}

void put_check(json_out& out, const run_check& r)
{
  out.u64("shards", r.shards).u64("file_bytes", r.file_bytes).u64("data_bytes", r.data_bytes).u64("entries_checked", r.entries_checked)
    .u64("entries_bad", r.entries_bad).u64("forwards_found", r.forwards).u64("forwards_torn", r.forwards_torn)
    .u64("problems", r.problems).num("check_seconds", r.seconds, 2);
  if (!r.first_problem.empty()) { out.str("first_problem", r.first_problem); }
}

}  // namespace

void run_safetensors(const options& o, forward_rig& rig, json_out& out, bool& ok)
{
  const forward_shape& sh = rig.shape();
  fs::create_directories(o.dir);
  std::uint64_t n = std::max<std::uint64_t>(1, (o.volume + sh.step_bytes - 1) / sh.step_bytes);
  const std::uint64_t room = free_bytes(o.dir);
  if (room < n * sh.step_bytes + n * sh.step_bytes / 8 + 512 * MiB) {  // the disk test's file, or the run, and slack
    n = std::max<std::uint64_t>(1, (room > 512 * MiB ? (room - 512 * MiB) * 8 / 9 : 0) / sh.step_bytes);
    std::fprintf(stderr, "safetensors: %s has %.1f GiB free: %llu forwards instead\n", o.dir.c_str(),
                 static_cast<double>(room) / (1 << 30), static_cast<unsigned long long>(n));
  }
  const std::uint64_t volume = n * sh.step_bytes;
  std::fprintf(stderr, "safetensors: %s, %llu forwards of %.2f MB (%.2f GiB), shards of %.0f MiB, fsync %s\n",
               o.dir.c_str(), static_cast<unsigned long long>(n), sh.step_bytes / 1e6,
               static_cast<double>(volume) / (1 << 30), static_cast<double>(o.shard_bytes) / MiB, o.fsync ? "on" : "off");
  out.str("dir", o.dir.string()).u64("volume_bytes", volume).u64("step_bytes", sh.step_bytes)
    .u64("shard_bytes", o.shard_bytes).u64("max_queue_bytes", o.queue_bytes).boolean("fsync", o.fsync);

  // ---- policy block: the sink's sustained rate
  const fs::path block_dir = o.dir / "ferry-bench-st-block";
  std::uint64_t first_tag = 0;
  double seconds = 0, step_us = 0;
  fk::safetensors_stats bs;
  fd::counters bc;
  std::string error;
  std::size_t files = 1;
  disk_result d1, one;
  {
    fk::safetensors sink{sink_config(o, sh, block_dir, fk::queue_policy::block)};
    files = static_cast<std::size_t>(sink.stats().open_shards);  // the medium measured as the sink writes it
    if (files > 1) {
      one = disk_write(o.dir, volume);
      std::fprintf(stderr, "  disk (one file): %.3f GB/s %s\n", one.gbps, one.error.c_str());
    }
    d1 = disk_write(o.dir, volume, files);
    std::fprintf(stderr, "  disk (before): %.3f GB/s, %.2f GiB in %.2f s; %s %s\n", d1.gbps,
                 static_cast<double>(d1.bytes) / (1 << 30), d1.seconds, d1.method.c_str(), d1.error.c_str());
    auto c = rig.make("safetensors_block", std::make_unique<fd::channel<B>>(rig.channel_config(), rig.backend(), sink));
    first_tag = rig.forwards();
    const auto t0 = clk::now();
    for (std::uint64_t i = 0; i < n; ++i) { rig.step(*c); }
    rig.stream().synchronize();
    step_us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / static_cast<double>(n);
    try {
      (void)c->ch->close();
      bc = c->ch->stats();
      bs = sink.close();
    } catch (const std::exception& e) {
      error = e.what();
      bs = sink.stats();
    }
    seconds = std::chrono::duration<double>(clk::now() - t0).count();
  }
  if (o.inject_fault) { flip_a_byte(block_dir / "shard-00000.safetensors"); }
  const run_check cb = check_run(block_dir, sh, o.check_threads);
  std::uint64_t missing = 0;
  for (std::uint64_t t = first_tag; t < first_tag + n; ++t) { missing += cb.tags.count(t) == 0 ? 1 : 0; }
  const double sink_gbps = static_cast<double>(cb.data_bytes) / seconds / 1e9;
  std::fprintf(stderr, "  sink (block): %.3f GB/s: %.2f GiB of tensor data in %.2f s (forward %.1f us/step throttled); "
               "stalls %llu, queue high watermark %.1f MiB; read back: %llu entries, %llu bad, %llu forwards missing, "
               "%llu torn, %llu problems%s%s\n", sink_gbps, static_cast<double>(cb.data_bytes) / (1 << 30), seconds,
               step_us, static_cast<unsigned long long>(bs.stalls), static_cast<double>(bs.queue_high_watermark) / MiB,
               static_cast<unsigned long long>(cb.entries_checked), static_cast<unsigned long long>(cb.entries_bad),
               static_cast<unsigned long long>(missing), static_cast<unsigned long long>(cb.forwards_torn),
               static_cast<unsigned long long>(cb.problems), cb.first_problem.empty() ? "" : ": ", cb.first_problem.c_str());
  std::fprintf(stderr, "  writer (io_threads %llu, open shards %llu (0: two on tmpfs, else one), writes of %.0f MiB, %llu buffers, direct_io %s, entries of %llu KiB and "
               "more lent where buffered: %llu lent): copying %.2f s, waiting for a "
               "buffer %.2f s, waiting for an entry %.2f s, rolling shards over %.2f s\n", static_cast<unsigned long long>(o.io_threads),
               static_cast<unsigned long long>(o.open_shards),
               static_cast<double>(o.write_bytes) / MiB, static_cast<unsigned long long>(o.write_buffers),
               o.direct_io ? "on" : "off", static_cast<unsigned long long>(o.lend_min >> 10),
               static_cast<unsigned long long>(bs.lent_entries), bs.writer_copy_seconds, bs.writer_wait_seconds,
               bs.writer_idle_seconds, bs.writer_publish_seconds);
  if (!o.keep) { fs::remove_all(block_dir); }
  const disk_result d2 = disk_write(o.dir, volume, files);
  std::fprintf(stderr, "  disk (after): %.3f GB/s %s\n", d2.gbps, d2.error.c_str());
  const double disk_gbps = std::max(d1.gbps, d2.gbps);

  // ---- policy drop: the forward's cost with the sink, beside no capture and a null in-process consumer
  const fs::path drop_dir = o.dir / "ferry-bench-st-drop";
  std::fprintf(stderr, "safetensors, policy drop: %d rounds of %d steps, interleaved\n", o.rounds, o.steps);
  fk::safetensors drop_sink{sink_config(o, sh, drop_dir, fk::queue_policy::drop)};
  auto none = rig.make("no_capture", nullptr);
  auto null = rig.make("null_consumer", std::make_unique<fd::channel<B>>(rig.channel_config(), rig.backend(),
                                                                         [](fd::entry_view&&) {}));
  auto drop = rig.make("safetensors_drop", std::make_unique<fd::channel<B>>(rig.channel_config(), rig.backend(), drop_sink));
  rig.interleave({none.get(), null.get(), drop.get()}, o.rounds, o.steps);
  fk::safetensors_stats ds;
  try {
    (void)null->ch->close();
    (void)drop->ch->close();
    ds = drop_sink.close();
  } catch (const std::exception& e) {
    if (error.empty()) { error = e.what(); }
    ds = drop_sink.stats();
  }
  const run_check cd = check_run(drop_dir, sh, o.check_threads);
  if (!o.keep) { fs::remove_all(drop_dir); }
  const std::uint64_t accounted = ds.forwards_written + ds.dropped_forwards;
  const std::uint64_t unaccounted = drop->replays > accounted ? drop->replays - accounted : accounted - drop->replays;
  std::fprintf(stderr, "  drop: %llu forwards captured, %llu written, %llu dropped (%llu entries); read back: %llu "
               "entries, %llu bad, %llu forwards torn%s%s\n", static_cast<unsigned long long>(drop->replays),
               static_cast<unsigned long long>(ds.forwards_written), static_cast<unsigned long long>(ds.dropped_forwards),
               static_cast<unsigned long long>(ds.dropped_entries), static_cast<unsigned long long>(cd.entries_checked),
               static_cast<unsigned long long>(cd.entries_bad), static_cast<unsigned long long>(cd.forwards_torn),
               cd.first_problem.empty() ? "" : ": ", cd.first_problem.c_str());

  const double base = spread_of(none->us).median;
  const double fwd_pct = pct_over(spread_of(drop->us).median, base);
  const double null_pct = pct_over(spread_of(null->us).median, base);
  out.num("disk_write_gbps", disk_gbps).num("sink_write_gbps", sink_gbps).num("forward_overhead_pct", fwd_pct)
    .num("null_consumer_overhead_pct", null_pct)
    .u64("entries_checked", cb.entries_checked + cd.entries_checked).u64("entries_bad", cb.entries_bad + cd.entries_bad)
    .num("sink_pct_of_disk", disk_gbps > 0 ? sink_gbps / disk_gbps * 100 : 0, 2)
    .boolean("target_sink_90pct_of_disk_met", sink_gbps >= 0.9 * disk_gbps && disk_gbps > 0)
    .num("forward_over_null_consumer_pp", fwd_pct - null_pct)
    .u64("stalls", bs.stalls).u64("dropped_forwards", ds.dropped_forwards)  // block's waits; drop's whole forwards
    .open("disk").str("method", d1.method).u64("bytes", d1.bytes).u64("files", files).num("before_gbps", d1.gbps)
    .num("after_gbps", d2.gbps);
  if (files > 1) { out.num("one_file_gbps", one.gbps); }
  if (!d1.error.empty() || !d2.error.empty() || !one.error.empty()) {
    out.str("error", d1.error + " " + d2.error + " " + one.error);
  }
  out.close().open("block").u64("forwards", n).num("seconds", seconds, 3).num("step_us_throttled", step_us, 1)
    .u64("bytes_written", bs.bytes_written).u64("forwards_written", bs.forwards_written).u64("stalls", bs.stalls)
    .u64("stall_timeouts", bs.stall_timeouts).u64("channel_stalls", bc.stalls).u64("dropped_forwards", bs.dropped_forwards)
    .u64("queue_high_watermark", bs.queue_high_watermark).u64("relocations", bs.relocations).u64("forwards_missing", missing)
    .u64("io_threads", o.io_threads).u64("write_bytes", o.write_bytes).u64("write_buffers", o.write_buffers)
    .u64("lend_min_bytes", o.lend_min).u64("open_shards", o.open_shards).u64("lent_entries", bs.lent_entries).u64("direct_io", o.direct_io ? 1 : 0)
    .num("writer_copy_seconds", bs.writer_copy_seconds, 3).num("writer_wait_seconds", bs.writer_wait_seconds, 3)
    .num("writer_idle_seconds", bs.writer_idle_seconds, 3).num("writer_publish_seconds", bs.writer_publish_seconds, 3);
  put_check(out, cb);
  out.close().open("drop");
  put_spread(out, "no_capture", *none);
  put_spread(out, "null_consumer", *null);
  put_spread(out, "sink", *drop);
  out.u64("rounds", static_cast<std::uint64_t>(o.rounds)).u64("steps_per_round", static_cast<std::uint64_t>(o.steps))
    .u64("forwards_captured", drop->replays).u64("forwards_written", ds.forwards_written)
    .u64("dropped_forwards", ds.dropped_forwards).u64("dropped_entries", ds.dropped_entries)
    .u64("dropped_bytes", ds.dropped_bytes).u64("forwards_unaccounted", unaccounted);
  put_check(out, cd);
  out.close();
  if (!error.empty()) { out.str("error", error); }
  const std::uint64_t injected = o.inject_fault ? 1 : 0;  // the byte flipped: one bad tensor, one problem
  ok = ok && error.empty() && d1.error.empty() && cb.entries_bad == injected && cd.entries_bad == 0 && cb.problems == injected &&
       cd.problems == 0 && missing == 0 && cb.forwards_torn == 0 && cd.forwards_torn == 0 && unaccounted == 0 &&
       cd.forwards == ds.forwards_written && bs.dropped_forwards == 0 && cb.entries_checked > 0;
}

}  // namespace ferry::bench::sinks
