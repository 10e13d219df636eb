// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream (sink/shm_stream.hpp, shm_reader.hpp; docs/design/shm_stream.md): a host-backend
// channel whose staging is the stream's segment, read by ferry_shm_child in another process, which checks every
// byte against the pattern the forwards captured (shm_pattern.hpp). Both policies, a reader killed mid-stream and
// its successor, a reader that stops reading, two readers, another layout version, a dead producer.
#include "sink/shm_child.hpp"
#include "sink/shm_pattern.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/sink.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>

namespace ferry::test {
namespace {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace fk = ferry::sink;
namespace shm = ferry::sink::detail::shm;
using B = fb::host_backend;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

class ShmStream : public ::testing::Test {
 protected:
  static constexpr std::uint64_t max_forwards = 400;

  void SetUp() override
  {
    b.set_device(fb::device_id{0});
    name = "test-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::shm_unlink(shm::object_name(name).c_str());
    for (std::uint32_t k = 0; k < shm_hooks; ++k) {  // hook k of forward f (tag 1000 + f) at src[k] + f * bytes
      const std::uint64_t n = shm_hook_bytes(k);
      std::vector<std::uint8_t> all(n * max_forwards);
      for (std::uint64_t f = 0; f < max_forwards; ++f) {
        const auto e = shm_entry_bytes(1000 + f, k);
        std::copy(e.begin(), e.end(), all.begin() + static_cast<std::ptrdiff_t>(f * n));
      }
      src.emplace_back(all.size(), b);
      b.memcpy_async(src.back().data(), all.data(), all.size(), fb::memcpy_kind::host_to_device, s.handle());
    }
    s.synchronize();
  }
  void TearDown() override { ::shm_unlink(shm::object_name(name).c_str()); }

  [[nodiscard]] fk::shm_stream_config stream_config(fk::queue_policy p = fk::queue_policy::block) const
  {
    fk::shm_stream_config c;
    c.name = name;
    c.policy = p;
    c.staging_bytes = 64 << 10;
    c.descriptors = 64;
    c.timeout = 5s;
    return c;
  }
  static fd::config channel_config()
  {
    fd::config c;
    c.ring_bytes = 1 << 16;
    c.publish_every = 4;
    c.timeout = 10s;
    return c;
  }
  /// Forward f: the three hooks, tagged 1000 + f.
  void forward(fd::channel<B>& ch, std::uint64_t f)
  {
    fd::forward_meta m;
    m.tag = 1000 + f;
    ch.begin_forward(s, m);
    for (std::uint32_t k = 0; k < shm_hooks; ++k) {
      ch.capture(fd::hook_id{k}, static_cast<const std::byte*>(src[k].data()) + f * shm_hook_bytes(k), shm_hook_bytes(k), s);
    }
    (void)ch.end_forward(s);
  }
  /// `r` is stream indices [first, first + r.size()) of forwards from `first_forward` on, each whole and exact.
  static void expect_forwards(const std::vector<shm_record>& r, std::uint64_t first, std::optional<std::uint64_t> first_forward)
  {
    for (std::size_t i = 0; i < r.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "record " << i << " (stream index " << r[i].index << ")");
      EXPECT_EQ(r[i].index, first + i);
      EXPECT_EQ(r[i].hook, i % shm_hooks) << "a forward's entries in hook order, whole";
      EXPECT_EQ(r[i].tag, 1000 + r[i].forward);
      EXPECT_EQ(r[i].seq, r[i].forward * shm_hooks + r[i].hook) << "the channel's entry order";
      EXPECT_EQ(r[i].size, shm_hook_bytes(static_cast<std::uint32_t>(r[i].hook)));
      EXPECT_EQ(r[i].status, 0U);
      EXPECT_EQ(r[i].bytes_ok, 1U) << "a byte read in the reader process differs from the captured one";
      if (i % shm_hooks != 0) { EXPECT_EQ(r[i].forward, r[i - 1].forward); }
      if (i >= shm_hooks && i % shm_hooks == 0) { EXPECT_GT(r[i].forward, r[i - 1].forward); }
    }
    if (!r.empty() && first_forward) { EXPECT_EQ(r.front().forward, *first_forward); }
    EXPECT_EQ(r.size() % shm_hooks, 0U) << "whole forwards";
  }
  /// Waits up to 5 s for `pred`.
  static bool eventually(const std::function<bool()>& pred)
  {
    const auto end = clk::now() + 5s;
    while (!pred()) {
      if (clk::now() >= end) { return false; }
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  B b;
  fb::stream<B> s{b};
  std::string name;
  std::vector<fb::device_buffer<B>> src;
};

// The staging (64 KiB, about 13 forwards) is reused about 30 times over while the reader process holds its last
// 20 entries (about 34 KiB) and checks each again before releasing it: a region reused before its release fails.
TEST_F(ShmStream, EveryEntryReachesTheReaderProcessByteExact)
{
  constexpr std::uint64_t F = 400;
  fk::shm_stream stream{stream_config()};
  shm_child reader{{"read", name, std::to_string(F * shm_hooks), "-1", "0", "30"}};  // holds 30, checks them twice
  EXPECT_EQ(reader.expect_line("attached"), "attached 0");
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  for (std::uint64_t f = 0; f < F; ++f) { forward(ch, f); }
  const auto recs = reader.records_until("done");
  EXPECT_EQ(reader.wait(), 0);
  (void)ch.close();
  const auto st = stream.close();
  ASSERT_EQ(recs.size(), F * shm_hooks);
  expect_forwards(recs, 0, 0);
  EXPECT_EQ(st.entries_published, F * shm_hooks);
  EXPECT_EQ(st.entries_released, F * shm_hooks);
  EXPECT_EQ(st.bytes_published, F * (shm_hook_bytes(0) + shm_hook_bytes(1) + shm_hook_bytes(2)));
  EXPECT_EQ(st.readers_attached, 1U);
  EXPECT_EQ(st.readers_left, 1U);
  EXPECT_EQ(st.unreleased_at_close + st.dropped_entries + st.refused_entries, 0U);
  EXPECT_TRUE(st.first_error.empty()) << st.first_error;
}

// S6 directly: this process reads and holds everything the 16 KiB staging can take while a producer thread has
// more queued in the ring, then releases one entry at a time and checks every entry it still holds after each
// release: the drain reuses exactly the region given back (and only it), never a held one.
TEST_F(ShmStream, AStagingRegionComesBackOnlyAfterItsRelease)
{
  constexpr std::uint64_t F = 40;
  auto sc = stream_config();
  sc.staging_bytes = 16 << 10;
  fk::shm_stream stream{sc};
  auto cc = channel_config();
  cc.ring_bytes = 32 << 10;
  fd::channel<B> ch{cc, b, stream.callback(), stream.staging(b)};
  fk::shm_reader r{name, 5s};
  std::thread producer{[&] {
    try {
      for (std::uint64_t f = 0; f < F; ++f) { forward(ch, f); }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the producer: " << e.what();
      (void)ch.abort_forward(s);
    }
  }};
  std::deque<fk::shm_entry> held;
  std::uint64_t checked = 0, next = 0, max_held = 0;
  const auto intact = [&](const fk::shm_entry& e) {
    const auto want = shm_entry_bytes(e.tag(), e.hook().value);
    const auto have = e.bytes();
    return have.size() == want.size() && std::memcmp(have.data(), want.data(), want.size()) == 0;
  };
  bool broken = false;  // no ASSERT while the producer thread runs: it is joined first
  while (next < F * shm_hooks && !broken) {
    for (auto& e : r.poll(64, held.empty() ? 2s : 5ms)) {
      EXPECT_EQ(e.index(), next++);
      held.push_back(std::move(e));
    }
    max_held = std::max<std::uint64_t>(max_held, held.size());
    if (held.empty()) { continue; }
    held.pop_front();  // released: its region may be reused now, and no other
    std::this_thread::sleep_for(2ms);  // the drain copies into what came back
    for (const auto& e : held) {
      if (!intact(e)) {
        ADD_FAILURE() << "entry " << e.index() << " was overwritten while this reader held it";
        broken = true;
        break;
      }
      ++checked;
    }
  }
  held.clear();
  r.close();  // (after a failure the producer runs into the channel's timeout without a reader: caught below)
  producer.join();
  (void)ch.close();
  (void)stream.close();
  EXPECT_GE(max_held, 6U) << "the staging held several entries at once";
  EXPECT_GT(checked, 100U);
}

// block without a reader: the drain waits `timeout` once, then keeps the entries; the reader that attaches later
// gets every one of them, from stream index 0; close() raises the kept stall_error.
TEST_F(ShmStream, BlockKeepsEveryEntryForALateReaderAndReportsTheStall)
{
  auto sc = stream_config();
  sc.descriptors = 8;
  sc.timeout = 300ms;
  fk::shm_stream stream{sc};
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  const auto t0 = clk::now();
  for (std::uint64_t f = 0; f < 6; ++f) { forward(ch, f); }
  ASSERT_TRUE(eventually([&] { return ch.stats().entries_drained == 18; }));
  const auto waited = clk::now() - t0;
  EXPECT_GE(waited, 250ms) << "the drain waited for the reader";
  EXPECT_LT(waited, 3s) << "once, up to the timeout";
  auto st = stream.stats();
  EXPECT_EQ(st.entries_published, 8U);
  EXPECT_EQ(st.pending_entries, 10U);
  EXPECT_EQ(st.stall_timeouts, 1U);
  EXPECT_NE(st.first_error.find("expected a free descriptor within timeout 300 ms"), std::string::npos) << st.first_error;
  shm_child reader{{"read", name, "18"}};
  EXPECT_EQ(reader.expect_line("attached"), "attached 0");
  const auto recs = reader.records_until("done");
  ASSERT_EQ(recs.size(), 18U);
  expect_forwards(recs, 0, 0);
  (void)ch.close();
  EXPECT_THROW((void)stream.close(), fk::stall_error);
  st = stream.stats();
  EXPECT_EQ(st.entries_released, 18U);
  EXPECT_EQ(st.pending_entries, 0U);
}

// block with a reader that never releases: the staging fills behind the held entries, and the producer's capture
// fails with the channel's timeout_error after config::timeout, never a hang; killed, the reader's successor
// resumes at the first entry it had not released and everything captured arrives.
TEST_F(ShmStream, BlockBackpressureReachesTheProducerAsItsTimeoutNeverAHang)
{
  auto sc = stream_config();
  sc.staging_bytes = 16 << 10;
  sc.timeout = 100ms;
  fk::shm_stream stream{sc};
  shm_child stuck{{"read", name, "1000", "0"}};  // reads, releases nothing
  stuck.expect_line("attached");
  auto cc = channel_config();
  cc.timeout = 500ms;
  cc.ring_bytes = 16 << 10;
  fd::channel<B> ch{cc, b, stream.callback(), stream.staging(b)};
  std::uint64_t f = 0;
  bool timed_out = false;
  for (; f < 40 && !timed_out; ++f) {
    const auto t0 = clk::now();
    try {
      forward(ch, f);
    } catch (const ferry::timeout_error&) {
      timed_out = true;
      const auto took = clk::now() - t0;
      EXPECT_GE(took, 450ms);
      EXPECT_LT(took, 3s);
      EXPECT_TRUE(ch.abort_forward(s));
    }
  }
  ASSERT_TRUE(timed_out) << "the producer was never held back";
  stuck.kill();
  ASSERT_TRUE(eventually([&] { return stream.stats().readers_died == 1; }));
  const std::uint64_t n = ch.stats().entries_reserved;
  shm_child reader{{"read", name, std::to_string(n)}};
  EXPECT_EQ(reader.expect_line("attached"), "attached 0");
  const auto recs = reader.records_until("done");
  ASSERT_EQ(recs.size(), n);
  expect_forwards(std::vector<shm_record>(recs.begin(), recs.begin() + static_cast<std::ptrdiff_t>(n / 3 * 3)), 0, 0);
  (void)ch.close();
  const auto st = stream.close();  // the stream itself never ran out of descriptors: no stall of its own
  EXPECT_EQ(st.stall_timeouts, 0U);
  EXPECT_EQ(st.readers_died, 1U);
}

// drop with a slow reader (2 ms per entry): the producer is never held back, every forward the reader gets is
// whole, and published plus dropped forwards are all of them.
TEST_F(ShmStream, DropPublishesOrDropsWholeForwardsAndNeverWaitsForASlowReader)
{
  constexpr std::uint64_t F = 150;
  auto sc = stream_config(fk::queue_policy::drop);
  sc.max_lag_entries = 6;
  fk::shm_stream stream{sc};
  shm_child reader{{"read", name, "1000000", "-1", "2000"}};
  reader.expect_line("attached");
  ASSERT_TRUE(eventually([&] { return stream.stats().readers_attached == 1; }));
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  const auto t0 = clk::now();
  for (std::uint64_t f = 0; f < F; ++f) {
    forward(ch, f);
    std::this_thread::sleep_for(200us);
  }
  EXPECT_LT(clk::now() - t0, 3s) << "the producer waited for the reader";
  (void)ch.close();
  (void)stream.close();
  const auto recs = reader.records_until("ended");
  const auto st = stream.stats();
  expect_forwards(recs, 0, std::nullopt);
  EXPECT_GT(st.dropped_forwards, 0U);
  EXPECT_EQ(st.entries_published, recs.size());
  EXPECT_EQ(st.entries_published / shm_hooks + st.dropped_forwards, F);
  EXPECT_EQ(st.dropped_entries, st.dropped_forwards * shm_hooks);
  EXPECT_EQ(st.truncated_forwards + st.readers_evicted, 0U);
}

// A reader SIGKILLed while holding entries: the stream sees its pid gone, and (block) the next reader starts at the
// first entry it had not released: nothing is lost.
TEST_F(ShmStream, KilledReaderIsDetectedAndTheNextResumesAtItsLastRelease)
{
  fk::shm_stream stream{stream_config()};
  shm_child first{{"read", name, "30", "10"}};  // releases entries 0..9, holds 10..29
  first.expect_line("attached");
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  for (std::uint64_t f = 0; f < 20; ++f) { forward(ch, f); }
  const auto held = first.records_until("holding");
  EXPECT_EQ(held.size(), 30U);
  first.kill();
  ASSERT_TRUE(eventually([&] { return stream.stats().readers_died == 1; }));
  EXPECT_EQ(stream.stats().entries_released, 10U);
  shm_child next{{"read", name, "80"}};
  EXPECT_EQ(next.expect_line("attached"), "attached 10");
  for (std::uint64_t f = 20; f < 30; ++f) { forward(ch, f); }
  auto recs = next.records_until("done");
  ASSERT_EQ(recs.size(), 80U);
  EXPECT_EQ(recs.front().index, 10U);
  recs.erase(recs.begin(), recs.begin() + 2);  // 10, 11: the rest of forward 3 (its start went to the first)
  expect_forwards(recs, 12, 4);
  (void)ch.close();
  const auto st = stream.close();
  EXPECT_EQ(st.readers_attached, 2U);
  EXPECT_EQ(st.entries_released, 90U);
}

// drop: the killed reader's entries are released (discarded, counted) and the next reader starts at the next
// forward published after it attached.
TEST_F(ShmStream, KilledReaderUnderDropIsDiscardedAndTheNextStartsAtAWholeForward)
{
  auto sc = stream_config(fk::queue_policy::drop);
  sc.max_lag_entries = 1000;
  sc.descriptors = 1024;
  sc.staging_bytes = 1 << 20;
  fk::shm_stream stream{sc};
  shm_child first{{"read", name, "30", "10"}};
  first.expect_line("attached");
  ASSERT_TRUE(eventually([&] { return stream.stats().readers_attached == 1; }));
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  for (std::uint64_t f = 0; f < 20; ++f) { forward(ch, f); }
  (void)first.records_until("holding");
  // The reader holds 30 entries as soon as 30 are published; the other 30 reach the stream on the channel's poll
  // thread. All 60 are in the stream before the kill, so its death discards exactly 50 (not some dropped for want
  // of a reader).
  ASSERT_TRUE(eventually([&] { return stream.stats().entries_published == 60; }));
  first.kill();
  ASSERT_TRUE(eventually([&] { return stream.stats().readers_died == 1; }));
  EXPECT_EQ(stream.stats().discarded_entries, 50U);
  EXPECT_EQ(stream.stats().reader_lag_entries, 0U);
  shm_child next{{"read", name, "15"}};
  EXPECT_EQ(next.expect_line("attached"), "attached 60");
  ASSERT_TRUE(eventually([&] { return stream.stats().readers_attached == 2; }));
  for (std::uint64_t f = 20; f < 25; ++f) { forward(ch, f); }
  const auto recs = next.records_until("done");
  ASSERT_EQ(recs.size(), 15U);
  expect_forwards(recs, 60, 20);
  (void)ch.close();
  (void)stream.close();
}

// drop with a reader that reads one entry and stops: it is evicted after `timeout` without a release while the
// stream needs room, learns it at its next call (reader_detached_error), and no capture waits longer than the
// stream's timeout plus the channel's drain.
TEST_F(ShmStream, StalledReaderUnderDropIsEvictedAndNoCaptureWaitsPastTheTimeout)
{
  auto sc = stream_config(fk::queue_policy::drop);
  sc.timeout = 300ms;
  sc.max_lag_entries = 6;
  fk::shm_stream stream{sc};
  shm_child stalled{{"stall", name, "1500"}};
  ASSERT_TRUE(eventually([&] { return stream.stats().readers_attached == 1; }));
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  auto slowest = clk::duration::zero();
  for (std::uint64_t f = 0; f < 200; ++f) {
    const auto t0 = clk::now();
    forward(ch, f);
    slowest = std::max(slowest, clk::now() - t0);
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_LT(slowest, 1500ms) << "a capture waited far past the stream's timeout";
  stalled.expect_line("stalled");
  EXPECT_NE(stalled.expect_line("detached").find("evicted"), std::string::npos);
  (void)ch.close();
  const auto st = stream.close();
  EXPECT_EQ(st.readers_evicted, 1U);
  EXPECT_GT(st.dropped_forwards, 0U);
  EXPECT_GE(st.discarded_entries, 1U);
}

// Two readers: the second is refused with the first's pid (in another process, and in this one); after the first
// dies a new reader attaches.
TEST_F(ShmStream, SecondReaderIsRefusedAndAReaderAttachesAfterTheFirstDied)
{
  fk::shm_stream stream{stream_config()};
  shm_child first{{"hold", name}};
  first.expect_line("attached");
  try {
    fk::shm_reader second{name, 1s};
    FAIL() << "a second reader attached";
  } catch (const fk::stream_busy_error& e) {
    EXPECT_EQ(e.owner_pid(), first.pid());
    EXPECT_NE(std::string{e.what()}.find("expected no reader attached, got reader pid " + std::to_string(first.pid())),
              std::string::npos) << e.what();
  }
  first.kill();
  fk::shm_reader mine{name, 2s};  // waits for the stream to free the dead reader's slot
  EXPECT_EQ(stream.stats().readers_died, 1U);
  EXPECT_THROW(fk::shm_reader(name, 200ms), fk::stream_busy_error);
  mine.close();
  fk::shm_reader again{name, 2s};  // a clean detach frees the slot too
  (void)stream.close();
}

// Version 1 (the layout before the schema region), 2 (before the record region and the 128-byte descriptors) and a
// later one: refused before anything else is read. The segment says version 3, which a reader of version 2 (it
// accepts its own only) refuses the same way.
TEST_F(ShmStream, ReaderOfAnotherLayoutVersionIsRefusedNamingBoth)
{
  EXPECT_EQ(shm::layout_version, 3U);
  fk::shm_stream stream{stream_config()};
  {
    const int fd = ::shm_open(shm::object_name(name).c_str(), O_RDONLY, 0);
    ASSERT_GE(fd, 0);
    void* p = ::mmap(nullptr, shm::header_bytes, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    EXPECT_EQ(shm::load(static_cast<std::byte*>(p), shm::w_version), 3U);
    EXPECT_EQ(shm::load(static_cast<std::byte*>(p), shm::w_descriptor_bytes), 128U);
    ::munmap(p, shm::header_bytes);
  }
  for (const std::uint64_t version : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{99}}) {
    {
      const int fd = ::shm_open(shm::object_name(name).c_str(), O_RDWR, 0);
      ASSERT_GE(fd, 0);
      void* p = ::mmap(nullptr, shm::header_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      ASSERT_NE(p, MAP_FAILED);
      shm::store(static_cast<std::byte*>(p), shm::w_version, version);  // a producer of that layout version
      ::munmap(p, shm::header_bytes);
    }
    try {
      fk::shm_reader r{name, 1s};
      FAIL() << "a reader attached to layout version " << version;
    } catch (const fk::layout_version_error& e) {
      EXPECT_EQ(e.expected(), shm::layout_version);
      EXPECT_EQ(e.got(), version);
      EXPECT_NE(std::string{e.what()}.find("expected layout version 3 (this reader's), got version " + std::to_string(version)),
                std::string::npos) << e.what();
    }
  }
  (void)stream.close();
}

// A name held by a live producer is refused; a dead producer's segment is replaced; a reader of a producer that
// died gets what it published, then producer_gone_error.
TEST_F(ShmStream, ProducerNamesAndAProducerThatDies)
{
  {
    fk::shm_stream stream{stream_config()};
    try {
      fk::shm_stream again{stream_config()};
      FAIL() << "two producers on one name";
    } catch (const fk::stream_busy_error& e) {
      EXPECT_EQ(e.owner_pid(), ::getpid());
    }
  }
  shm_child producer{{"produce", name, "4"}};
  producer.expect_line("published");
  fk::shm_reader r{name, 5s};
  std::vector<fk::shm_entry> got;
  while (got.size() < 12) {
    for (auto& e : r.poll(64, 1s)) { got.push_back(std::move(e)); }
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto want = shm_entry_bytes(1000 + i / 3, static_cast<std::uint32_t>(i % 3));
    const auto have = got[i].bytes();
    ASSERT_EQ(have.size(), want.size());
    EXPECT_EQ(std::memcmp(have.data(), want.data(), want.size()), 0) << "entry " << i;
  }
  producer.kill();
  EXPECT_THROW((void)r.poll(1, 2s), fk::producer_gone_error);
  got.clear();
  r.close();
  fk::shm_stream replaced{stream_config()};  // the dead producer's segment is stale: replaced
  (void)replaced.close();
}

TEST_F(ShmStream, MisuseIsRefused)
{
  fk::shm_stream stream{stream_config()};
  {
    fd::channel<B> own{channel_config(), b, stream.callback()};  // its own staging: not in the segment
    forward(own, 0);
    (void)own.close();
  }
  EXPECT_EQ(stream.stats().refused_entries, 3U);
  auto m = stream.staging(b);
  EXPECT_THROW((void)stream.staging(b), ferry::logic_error);
  auto cc = channel_config();
  cc.staging_bytes = 4096;
  EXPECT_THROW((fd::channel<B>{cc, b, stream.callback(), m}), ferry::logic_error);
  m = {};
  {
    fd::channel<B> next{channel_config(), b, stream.callback(), stream.staging(b)};  // free again
    (void)next.close();
  }
  EXPECT_THROW((void)stream.close(), ferry::logic_error);  // the refused entries' error
  auto bad = stream_config();
  bad.name = "a/b";
  EXPECT_THROW(fk::shm_stream{bad}, ferry::logic_error);
  bad = stream_config();
  bad.descriptors = 100;
  EXPECT_THROW(fk::shm_stream{bad}, ferry::logic_error);
}

}  // namespace
}  // namespace ferry::test
