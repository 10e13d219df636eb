// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream (ferry_bench_sinks, "shm"), read by a reader process (shm_reader.cpp) that attaches by
// name and reads every entry where the channel's D2H put it (no copy on either side):
//   throughput  entries of shm_entry bytes (64 MiB), each filled on the device with its own pattern and captured
//               eagerly, back to back: reader_gbps (the reader's arrival rate), beside the plain pinned D2H
//               memcpy of the same size measured in the run (memcpy_d2h_gbps: the ceiling)
//   forward     the graphed vllm-full forward, interleaved rounds: the forward alone, with an in-process consumer
//               that drops each entry, and with the stream and its reader process: forward_overhead_pct (stream)
//               and in_process_overhead_pct, both vs no capture
// The staging lives in /dev/shm: its size is capped by the free space there (a container's /dev/shm can be
// 64 MiB), and the entry size with it; the JSON says what was used.
#include "sinks.hpp"

#include <algorithm>
#include <cstdio>
#include <unistd.h>

namespace ferry::bench::sinks {

namespace {

double memcpy_d2h_gbps(B b, fb::stream<B>& s, std::uint64_t bytes, int reps)
{
  fb::device_buffer<B> src{bytes, b};
  fb::pinned_buffer<B> dst{bytes, b};
  fb::event<B> e0{b, fb::event_flags::timing}, e1{b, fb::event_flags::timing};
  b.memcpy_async(dst.data(), src.data(), bytes, fb::memcpy_kind::device_to_host, s.handle());  // warm
  e0.record(s);
  for (int i = 0; i < reps; ++i) { b.memcpy_async(dst.data(), src.data(), bytes, fb::memcpy_kind::device_to_host, s.handle()); }
  e1.record(s);
  e1.synchronize();
  return static_cast<double>(bytes) * reps / (e1.elapsed_ms_since(e0) / 1e3) / 1e9;
}

void put_reader(json_out& out, const reader_result& r, std::uint64_t expected)
{
  out.num("reader_gbps", r.gbps).num("reader_seconds", r.seconds, 6).u64("entries_read", r.entries)
    .u64("entries_expected", expected).u64("bytes_read", r.bytes).u64("entries_sampled", r.sampled)
    .u64("entries_fully_checked", r.full).u64("entries_bad", r.bad);
  if (!r.first_bad.empty()) { out.str("first_bad", r.first_bad); }
  if (!r.error.empty()) { out.str("reader_error", r.error); }
}

void put_stream(json_out& out, const fk::shm_stream_stats& st)
{
  out.u64("stalls", st.stalls).u64("stall_timeouts", st.stall_timeouts).u64("dropped_forwards", st.dropped_forwards)
    .u64("unreleased_at_close", st.unreleased_at_close).u64("entries_published", st.entries_published);
}

}  // namespace

void run_shm(const options& o, forward_rig& rig, json_out& out, bool& ok)
{
  B b = rig.backend();
  auto& s = rig.stream();
  const std::uint64_t room = free_bytes("/dev/shm");
  const std::uint64_t staging = std::min(o.shm_staging, room / 4 * 3 / MiB * MiB);
  const std::uint64_t entry = std::min(o.shm_entry, staging / 4 / MiB * MiB);
  const std::string name = "ferry-bench-" + std::to_string(::getpid());
  std::fprintf(stderr, "shm: /dev/shm %.0f MiB free: staging %.0f MiB, entries of %.0f MiB\n", static_cast<double>(room) / MiB,
               static_cast<double>(staging) / MiB, static_cast<double>(entry) / MiB);
  out.u64("dev_shm_free_bytes", room).str("check", reader_check_text(o.full_every, o.checkers));
  if (entry == 0) {
    out.str("error", "/dev/shm has " + std::to_string(room) + " bytes free: too little for a staging of 4 entries of 1 MiB");
    ok = false;
    return;
  }
  const double memcpy_gbps = memcpy_d2h_gbps(b, s, entry, host_mode ? 4 : 32);

  // ---- throughput: 64 MiB entries, one per eager forward
  reader_result r1;
  fk::shm_stream_stats st1;
  double producer_gbps = 0;
  std::string error;
  {
    fk::shm_stream_config sc;
    sc.name = name;
    sc.staging_bytes = staging;
    sc.timeout = std::chrono::seconds(30);
    fk::shm_stream stream{sc};
    const std::uint64_t N = o.shm_entries;
    reader_process reader{{name, 1, 0, entry, o.full_every, std::min<std::uint64_t>(8, N / 4), o.checkers, o.inject_fault}};
    if (!reader.attached(std::chrono::seconds(30))) { throw std::runtime_error("shm: the reader did not attach in 30 s"); }
    fd::config cfg;
    cfg.ring_bytes = 4 * entry;
    cfg.publish_every = 1;
    cfg.timeout = std::chrono::seconds(60);
    fd::channel<B> ch{cfg, b, stream};
    fb::device_buffer<B> src{entry, b}, aux{256, b};
    b.memset_async(aux.data(), 0, 256, s.handle());
    const int sms = b.attributes(fb::device_id{0}).sm_count;
    const fb::launch_config fill_shape{{host_mode ? 1U : static_cast<std::uint32_t>(sms)}, {256}, 0};
    auto* counter = aux.template as<std::uint64_t>();
    auto* act = static_cast<std::byte*>(src.data());
    const auto t0 = clk::now();
    for (std::uint64_t k = 0; k < N; ++k) {  // entry k: pattern_word(k, i), k the forward's tag and the counter
      fd::forward_meta m;
      m.tag = k;
      ch.begin_forward(s, std::move(m));
      b.launch(layer_kernel(typename B::tag{}), fill_shape, s.handle(), layer_args{counter, 1, 0, 1, act, entry, 0, nullptr, nullptr});
      ch.capture(fd::hook_id{0}, act, entry, s);
      (void)ch.end_forward(s);
      b.launch(next_forward_kernel(typename B::tag{}), fb::launch_config{{1}, {1}, 0}, s.handle(), counter);
    }
    s.synchronize();
    try {
      (void)ch.close();
      st1 = stream.close();
    } catch (const std::exception& e) {
      error = e.what();
      st1 = stream.stats();
    }
    producer_gbps = static_cast<double>(N * entry) / std::chrono::duration<double>(clk::now() - t0).count() / 1e9;
    r1 = reader.result(std::chrono::seconds(60));
  }
  std::fprintf(stderr, "  throughput: reader %.2f GB/s (%llu entries of %.0f MiB; producer side %.2f GB/s; pinned D2H memcpy "
               "%.2f GB/s); %llu sampled, %llu fully checked, %llu bad %s%s\n", r1.gbps,
               static_cast<unsigned long long>(r1.entries), static_cast<double>(entry) / MiB, producer_gbps, memcpy_gbps,
               static_cast<unsigned long long>(r1.sampled), static_cast<unsigned long long>(r1.full),
               static_cast<unsigned long long>(r1.bad), r1.first_bad.c_str(), r1.error.c_str());

  // ---- the forward with the reader attached, beside no capture and an in-process null consumer
  const std::uint64_t staging2 = std::min(staging, std::max<std::uint64_t>(fd::align_up(8 * rig.shape().step_bytes, MiB), 64 * MiB));
  std::fprintf(stderr, "shm, forward: staging %.0f MiB, %d rounds of %d steps, interleaved\n",
               static_cast<double>(staging2) / MiB, o.rounds, o.steps);
  reader_result r2;
  fk::shm_stream_stats st2;
  std::uint64_t expected2 = 0;
  spread none_s, null_s, shm_s;
  {
    fk::shm_stream_config sc;
    sc.name = name + "-fwd";
    sc.staging_bytes = staging2;
    sc.timeout = std::chrono::seconds(30);
    fk::shm_stream stream{sc};
    reader_process reader{{sc.name, rig.shape().hooks, rig.shape().tokens, 0, o.full_every, 0, o.checkers, false}};
    if (!reader.attached(std::chrono::seconds(30))) { throw std::runtime_error("shm: the reader did not attach in 30 s"); }
    auto none = rig.make("no_capture", nullptr);
    auto null = rig.make("in_process_null", std::make_unique<fd::channel<B>>(rig.channel_config(), b, [](fd::entry_view&&) {}));
    auto shm = rig.make("shm_reader_process", std::make_unique<fd::channel<B>>(rig.channel_config(), b, stream));
    rig.interleave({none.get(), null.get(), shm.get()}, o.rounds, o.steps);
    expected2 = shm->replays * rig.shape().hooks;
    try {
      (void)null->ch->close();
      (void)shm->ch->close();
      st2 = stream.close();
    } catch (const std::exception& e) {
      if (error.empty()) { error = e.what(); }
      st2 = stream.stats();
    }
    r2 = reader.result(std::chrono::seconds(60));
    none_s = spread_of(none->us);
    null_s = spread_of(null->us);
    shm_s = spread_of(shm->us);
  }
  const double fwd_pct = none_s.median > 0 ? (shm_s.median / none_s.median - 1) * 100 : 0;
  const double in_pct = none_s.median > 0 ? (null_s.median / none_s.median - 1) * 100 : 0;
  std::fprintf(stderr, "  forward: with the reader process %+.3f%%, in-process null consumer %+.3f%% (gap %+.3f pp); reader: "
               "%llu of %llu entries, %llu fully checked, %llu bad %s%s\n", fwd_pct, in_pct, fwd_pct - in_pct,
               static_cast<unsigned long long>(r2.entries), static_cast<unsigned long long>(expected2),
               static_cast<unsigned long long>(r2.full), static_cast<unsigned long long>(r2.bad), r2.first_bad.c_str(),
               r2.error.c_str());

  out.num("reader_gbps", r1.gbps).num("forward_overhead_pct", fwd_pct).num("in_process_overhead_pct", in_pct)
    .u64("entries_checked", r1.sampled + r2.sampled).u64("entries_bad", r1.bad + r2.bad)
    .num("overhead_gap_pp", fwd_pct - in_pct).u64("stalls", st1.stalls + st2.stalls).boolean("target_reader_50gbps_met", r1.gbps >= 50)
    .boolean("target_gap_0_5pp_met", fwd_pct - in_pct <= 0.5)
    .open("throughput").u64("entry_bytes", entry).u64("staging_bytes", staging).num("memcpy_d2h_gbps", memcpy_gbps)
    .num("producer_gbps", producer_gbps);
  put_reader(out, r1, o.shm_entries);
  put_stream(out, st1);
  out.close().open("forward").u64("staging_bytes", staging2).u64("rounds", static_cast<std::uint64_t>(o.rounds))
    .u64("steps_per_round", static_cast<std::uint64_t>(o.steps))
    .num("no_capture_us", none_s.median, 2).num("no_capture_min_us", none_s.min, 2).num("no_capture_max_us", none_s.max, 2)
    .num("in_process_us", null_s.median, 2).num("in_process_min_us", null_s.min, 2).num("in_process_max_us", null_s.max, 2)
    .num("shm_us", shm_s.median, 2).num("shm_min_us", shm_s.min, 2).num("shm_max_us", shm_s.max, 2);
  put_reader(out, r2, expected2);
  put_stream(out, st2);
  out.close();
  if (!error.empty()) { out.str("error", error); }
  ok = ok && error.empty() && r1.error.empty() && r2.error.empty() && r1.bad == (o.inject_fault ? 1U : 0U) && r2.bad == 0 &&
       r1.entries == o.shm_entries && r2.entries == expected2 && r1.sampled > 0 && r2.full > 0;
}

}  // namespace ferry::bench::sinks
