// SPDX-License-Identifier: Apache-2.0
// The reader process of ferry_bench_sinks' shared-memory part: this binary run as
//   ferry_bench_sinks --reader <name> <hooks> <tokens> <entry_bytes> <full_every> <warmup> <checkers> <fault 0|1>
// attaches to stream <name> (sink::shm_reader), prints "attached <start index>", reads every entry zero-copy
// where the D2H put it until the stream ends, and prints one line
//   result entries=N bytes=N sampled=N full=N bad=N gbps=X seconds=X first_bad=<text>
// Every entry: its status, its size (hooks == 1: entry_bytes; else forward_shape(tokens)'s hook size) and a sample
// of its words against pattern_word(tag * hooks + hook, i): the first and last 4 KiB and one word every 64 KiB.
// Every <full_every>-th entry: every word, split among <checkers> threads while this thread reads on (the entry is
// released when its last slice is checked: entries may be released in any order). gbps: the bytes of the entries
// after the first <warmup> + 1, over the time from that entry's arrival to the last one's.
#include "sinks.hpp"

#include <ferry/testing/pattern.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

namespace ferry::bench::sinks {

namespace {

void say(const std::string& s)
{
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

/// Words [from, to) of an entry against its pattern.
bool words_ok(const std::byte* p, std::uint64_t key, std::uint64_t from, std::uint64_t to)
{
  for (std::uint64_t i = from; i < to; ++i) {
    std::uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    if (w != ferry::testing::pattern_word(key, i)) { return false; }
  }
  return true;
}

bool sample_ok(const std::byte* p, std::uint64_t n, std::uint64_t key)
{
  const std::uint64_t words = n / 8, edge = std::min<std::uint64_t>(512, words);  // 4 KiB
  if (!words_ok(p, key, 0, edge) || !words_ok(p, key, words - edge, words)) { return false; }
  for (std::uint64_t i = edge; i + edge < words; i += 8192) {  // one word every 64 KiB
    if (!words_ok(p, key, i, i + 1)) { return false; }
  }
  return n % 8 == 0 || ferry::testing::first_pattern_mismatch(p, n, key) == n;
}

/// An entry being fully checked: released when the last slice's job lets it go.
struct full_job {
  fk::shm_entry e;
  std::uint64_t key{0};
  std::atomic<int> left{0};
  std::atomic<bool> bad{false};
};

}  // namespace

std::string reader_check_text(std::uint64_t full_every, int checkers)
{
  return "reader process, every entry: status, size, and its first and last 4 KiB and one 8-byte word every 64 KiB "
         "against the pattern of (tag, hook); every " + std::to_string(full_every) + "th entry: every byte (" +
         std::to_string(checkers) + " checker threads, beside the reading)";
}

int reader_main(const std::vector<std::string>& a)
{
  if (a.size() != 8) {
    std::fprintf(stderr, "usage: ferry_bench_sinks --reader <name> <hooks> <tokens> <entry_bytes> <full_every> <warmup> <checkers> <fault>\n");
    return 2;
  }
  reader_args ra;
  ra.name = a[0];
  ra.hooks = std::stoull(a[1]);
  ra.tokens = std::stoull(a[2]);
  ra.entry_bytes = std::stoull(a[3]);
  ra.full_every = std::max<std::uint64_t>(1, std::stoull(a[4]));
  ra.warmup = std::stoull(a[5]);
  ra.checkers = std::stoi(a[6]);
  ra.fault = a[7] == "1";
  std::vector<std::uint64_t> sizes;
  if (ra.hooks > 1) { sizes = forward_shape{ra.tokens}.bytes; }
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::shared_ptr<full_job>, std::uint64_t>> q;  // (entry, slice)
  bool stop = false;
  std::atomic<std::uint64_t> bad{0}, full{0};
  std::string first_bad;
  const auto note_bad = [&](const std::string& what) {
    bad.fetch_add(1);
    std::lock_guard lock{mu};
    if (first_bad.empty()) { first_bad = what; }
  };
  const int T = std::max(ra.checkers, 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < T; ++t) {
    pool.emplace_back([&] {
      std::unique_lock lock{mu};
      for (;;) {
        cv.wait(lock, [&] { return stop || !q.empty(); });
        if (q.empty()) { return; }
        auto [job, slice] = std::move(q.front());
        q.pop_front();
        lock.unlock();
        const std::uint64_t words = job->e.size() / 8, per = (words + T - 1) / T;
        const std::uint64_t from = std::min(words, slice * per), to = std::min(words, from + per);
        if (!words_ok(job->e.bytes().data(), job->key, from, to)) { job->bad.store(true); }
        if (job->left.fetch_sub(1) == 1) {
          full.fetch_add(1);
          if (job->bad.load()) { note_bad("entry " + std::to_string(job->e.index()) + ": a byte differs (full check)"); }
        }
        job.reset();  // the last slice releases the entry
        lock.lock();
      }
    });
  }
  const auto finish_checks = [&] {  // before the reader closes: its close lets the producer reuse held entries
    {
      std::lock_guard lock{mu};
      stop = true;
    }
    cv.notify_all();
    for (auto& t : pool) {
      if (t.joinable()) { t.join(); }
    }
  };
  std::uint64_t entries = 0, bytes = 0, sampled = 0, measured = 0;
  clk::time_point t_first{}, t_last{};
  int rc = 0;
  try {
    fk::shm_reader r{ra.name, std::chrono::seconds(30)};
    say("attached " + std::to_string(r.stats().start_index));
    while (!r.ended()) {
      auto got = r.poll(256, std::chrono::milliseconds(20));
      const auto now = clk::now();
      for (auto& e : got) {
        ++entries;
        bytes += e.size();
        if (entries == ra.warmup + 1) { t_first = now; }
        if (entries > ra.warmup + 1) {
          measured += e.size();
          t_last = now;
        }
        const std::uint64_t key = e.tag() * ra.hooks + e.hook().value + (ra.fault && entries == 3 ? 1 : 0);
        const std::uint64_t want = ra.hooks == 1 ? ra.entry_bytes : (e.hook().value < sizes.size() ? sizes[e.hook().value] : 0);
        ++sampled;
        if (!e.ok() || e.size() != want || !sample_ok(e.bytes().data(), e.size(), key)) {
          note_bad("entry " + std::to_string(e.index()) + " (tag " + std::to_string(e.tag()) + ", hook " +
                   std::to_string(e.hook().value) + ", " + std::to_string(e.size()) + " bytes): status, size or a sampled word");
          continue;
        }
        if (entries % ra.full_every == 0) {
          auto job = std::make_shared<full_job>();
          job->e = std::move(e);
          job->key = key;
          job->left.store(T);
          {
            std::lock_guard lock{mu};
            for (int s = 0; s < T; ++s) { q.emplace_back(job, static_cast<std::uint64_t>(s)); }
          }
          cv.notify_all();
        }
      }
    }
    finish_checks();
  } catch (const std::exception& ex) {
    say(std::string{"error "} + ex.what());
    rc = 3;
  }
  finish_checks();
  if (rc != 0) { return rc; }
  const double sec = std::chrono::duration<double>(t_last - t_first).count();
  char line[512];
  std::snprintf(line, sizeof line, "result entries=%llu bytes=%llu sampled=%llu full=%llu bad=%llu gbps=%.4f seconds=%.6f first_bad=",
                static_cast<unsigned long long>(entries), static_cast<unsigned long long>(bytes),
                static_cast<unsigned long long>(sampled), static_cast<unsigned long long>(full.load()),
                static_cast<unsigned long long>(bad.load()), sec > 0 ? static_cast<double>(measured) / sec / 1e9 : 0.0, sec);
  say(line + first_bad);
  return 0;
}

}  // namespace ferry::bench::sinks
