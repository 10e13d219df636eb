// SPDX-License-Identifier: Apache-2.0
// The backend contract, one typed suite run against every backend: host (CI), faulty<host> (CI),
// cuda (H200, FERRY_REQUIRE_GPU=1). Each test fails if the property it names is broken.
#pragma once

#include "support/gpu.hpp"

#include <ferry/backend.hpp>
#include <ferry/testing/probe.hpp>
#include <ferry/testing/pattern.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <regex>
#include <thread>
#include <type_traits>
#include <vector>

#include <sys/mman.h>

namespace ferry::test {

namespace fb = ferry::backend;

template <class B>
class BackendContract : public ::testing::Test {
 protected:
  void SetUp() override { FERRY_REQUIRE_DEVICE(B{}.device_count()); }
  B b{};
};

TYPED_TEST_SUITE_P(BackendContract);

/// Random, never-zero fill.
inline void fill_random(std::uint64_t* p, std::size_t words, std::uint64_t seed)
{
  std::mt19937_64 rng{seed};
  for (std::size_t i = 0; i < words; ++i) { p[i] = rng() | 1ULL; }
}

TYPED_TEST_P(BackendContract, AttributesAreReadable)
{
  const auto a = this->b.attributes(this->b.current_device());
  EXPECT_FALSE(a.name.empty());
  EXPECT_GT(a.sm_count, 0);
}

TYPED_TEST_P(BackendContract, StreamOrderAcrossCopiesOfEveryMemoryKind)
{
  using B = TypeParam;
  constexpr std::size_t words = 1 << 16;
  constexpr std::size_t bytes = words * 8;
  fb::stream<B> s{this->b};
  fb::pinned_buffer<B> src{bytes, this->b};
  fb::device_buffer<B> dev{bytes, this->b};
  fb::managed_buffer<B> man{bytes, this->b};
  fb::mapped_buffer<B> dst{bytes, this->b};
  for (int round = 0; round < 8; ++round) {
    fill_random(src.template as<std::uint64_t>(), words, 1000 + round);
    // pinned -> device -> managed -> mapped pinned: each copy must see the previous one's result.
    this->b.memcpy_async(dev.data(), src.data(), bytes, fb::memcpy_kind::host_to_device, s.handle());
    this->b.memcpy_async(man.data(), dev.data(), bytes, fb::memcpy_kind::device_to_device, s.handle());
    this->b.memcpy_async(dst.data(), man.data(), bytes, fb::memcpy_kind::automatic, s.handle());
    s.synchronize();
    ASSERT_EQ(0, std::memcmp(src.data(), dst.data(), bytes)) << "round " << round;
  }
}

// memcpy_batch_h2d_async: every range lands (odd sizes, a large one), bytes between the ranges stay untouched,
// the call is ordered after earlier work on the stream and before later work, and n == 0 enqueues nothing.
TYPED_TEST_P(BackendContract, BatchCopyLandsEveryRangeInStreamOrder)
{
  using B = TypeParam;
  const std::vector<std::size_t> sizes{1, 15, 16, 4096, 70000, 3};
  constexpr std::size_t stride = 72 * 1024;  // each range at its own offset; the rest of the stride is poison
  const std::size_t total = sizes.size() * stride;
  fb::stream<B> s{this->b};
  fb::pinned_buffer<B> src{total, this->b};
  fb::device_buffer<B> dev{total, this->b};
  fb::pinned_buffer<B> back{total, this->b};
  for (int round = 0; round < 3; ++round) {
    fill_random(src.template as<std::uint64_t>(), total / 8, 77 + round);
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      dsts.push_back(static_cast<std::byte*>(dev.data()) + i * stride);
      srcs.push_back(static_cast<const std::byte*>(src.data()) + i * stride);
    }
    this->b.memset_async(dev.data(), 0xA5, total, s.handle());  // earlier work the batch must follow
    this->b.memcpy_batch_h2d_async(dsts.data(), srcs.data(), sizes.data(), 0, this->b.current_device(), s.handle());
    this->b.memcpy_batch_h2d_async(dsts.data(), srcs.data(), sizes.data(), sizes.size(), this->b.current_device(),
                                   s.handle());
    this->b.memcpy_async(back.data(), dev.data(), total, fb::memcpy_kind::device_to_host, s.handle());  // later work
    s.synchronize();
    const auto* got = static_cast<const unsigned char*>(back.data());
    const auto* want = static_cast<const unsigned char*>(src.data());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(got + i * stride, want + i * stride, sizes[i])) << "range " << i << " round " << round;
      for (std::size_t k = sizes[i]; k < stride; ++k) {
        ASSERT_EQ(got[i * stride + k], 0xA5) << "byte " << k << " past range " << i << " was written";
      }
    }
  }
}

TYPED_TEST_P(BackendContract, EventCompletesOnlyWhenReached)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  fb::managed_buffer<B> flag{64, this->b};
  flag.advise(fb::mem_advice::preferred_location_host, this->b.current_device());
  flag.advise(fb::mem_advice::accessed_by_device, this->b.current_device());
  auto* f = flag.template as<std::uint64_t>();
  fb::host_store_release(f, 0);
  fb::device_buffer<B> out{64, this->b};
  fb::event<B> done{this->b};
  // The consume kernel blocks the stream until the CPU releases the flag.
  this->b.launch(ferry::testing::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {32}, 0}, s.handle(), f,
                 std::uint64_t{1}, f, out.template as<std::uint64_t>(), std::uint64_t{1});
  done.record(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(done.query()) << "event completed before the stream reached it";
  EXPECT_FALSE(this->b.stream_query(s.handle()));
  fb::host_store_release(f, 1);
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_TRUE(this->b.stream_query(s.handle()));
}

TYPED_TEST_P(BackendContract, TimingEventsMeasureElapsedTime)
{
  using B = TypeParam;
  fb::stream<B> s{this->b};
  fb::event<B> a{this->b, fb::event_flags::timing};
  fb::event<B> z{this->b, fb::event_flags::timing};
  fb::device_buffer<B> d{1 << 20, this->b};
  a.record(s);
  this->b.memset_async(d.data(), 1, d.size(), s.handle());
  z.record(s);
  z.synchronize();
  EXPECT_GE(z.elapsed_ms_since(a), 0.0F);
}

TYPED_TEST_P(BackendContract, CrossStreamWaitOrdersTheWaiter)
{
  using B = TypeParam;
  constexpr std::size_t words = 4096;
  fb::stream<B> producer{this->b};
  fb::stream<B> consumer{this->b};
  fb::mapped_buffer<B> flag{64, this->b};
  fb::mapped_buffer<B> src{words * 8, this->b};
  fb::device_buffer<B> mid{words * 8, this->b};
  fb::pinned_buffer<B> out{words * 8, this->b};
  auto* f = flag.template as<std::uint64_t>();
  fb::host_store_release(f, 0);
  std::memset(out.data(), 0, words * 8);
  fill_random(src.template as<std::uint64_t>(), words, 7);
  fb::event<B> produced{this->b};
  // producer: wait for the CPU's flag, then copy src -> mid (inside the kernel), then record.
  this->b.launch(ferry::testing::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {256}, 0},
                 producer.handle(), static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()),
                 std::uint64_t{1}, static_cast<const std::uint64_t*>(src.template device_as<std::uint64_t>()),
                 mid.template as<std::uint64_t>(), std::uint64_t{words});
  produced.record(producer);
  // consumer: wait for the event, then copy mid -> out. Without the wait it would copy garbage.
  produced.wait(consumer);
  this->b.memcpy_async(out.data(), mid.data(), words * 8, fb::memcpy_kind::device_to_host, consumer.handle());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(this->b.stream_query(consumer.handle())) << "waiting stream ran ahead of the event";
  fb::host_store_release(f, 1);
  consumer.synchronize();
  EXPECT_EQ(0, std::memcmp(src.data(), out.data(), words * 8));
}

TYPED_TEST_P(BackendContract, DeviceReleaseHostAcquireHandOff)
{
  using B = TypeParam;
  // The device writes a payload with plain stores, joins the block, and one thread releases `flag`
  // at system scope. The CPU spins on an acquire load and then must see every payload word.
  constexpr std::uint64_t words = 1 << 14;
  fb::stream<B> s{this->b};
  fb::mapped_buffer<B> payload{words * 8, this->b};
  fb::managed_buffer<B> flag{64, this->b};
  flag.advise(fb::mem_advice::preferred_location_host, this->b.current_device());
  flag.advise(fb::mem_advice::accessed_by_device, this->b.current_device());
  auto* f = flag.template as<std::uint64_t>();
  fb::host_store_release(f, 0);
  const auto* host_payload = payload.template as<const std::uint64_t>();
  std::uint64_t bad = 0;
  for (std::uint64_t seq = 1; seq <= 64; ++seq) {
    this->b.launch(ferry::testing::probe::publish_kernel(typename B::tag{}), fb::launch_config{{1}, {512}, 0}, s.handle(),
                   payload.template device_as<std::uint64_t>(), words, f, seq);
    while (fb::host_load_acquire(f) < seq) {
    }
    for (std::uint64_t i = 0; i < words; ++i) { bad += host_payload[i] != ferry::testing::pattern_word(seq, i); }
    s.synchronize();  // the next launch overwrites the payload
  }
  EXPECT_EQ(bad, 0U);
}

TYPED_TEST_P(BackendContract, HostReleaseDeviceAcquireHandOff)
{
  using B = TypeParam;
  constexpr std::uint64_t words = 1 << 12;
  fb::stream<B> s{this->b};
  fb::mapped_buffer<B> src{words * 8, this->b};
  fb::mapped_buffer<B> flag{64, this->b};
  fb::device_buffer<B> dst{words * 8, this->b};
  fb::pinned_buffer<B> back{words * 8, this->b};
  auto* f = flag.template as<std::uint64_t>();
  fb::host_store_release(f, 0);
  for (std::uint64_t seq = 1; seq <= 16; ++seq) {
    this->b.launch(ferry::testing::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {256}, 0}, s.handle(),
                   static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()), seq,
                   static_cast<const std::uint64_t*>(src.template device_as<std::uint64_t>()),
                   dst.template as<std::uint64_t>(), words);
    auto* h = src.template as<std::uint64_t>();
    for (std::uint64_t i = 0; i < words; ++i) { h[i] = ferry::testing::pattern_word(seq, i); }
    fb::host_store_release(f, seq);  // publishes the words above to the spinning kernel
    this->b.memcpy_async(back.data(), dst.data(), words * 8, fb::memcpy_kind::device_to_host, s.handle());
    s.synchronize();
    const auto* r = back.template as<const std::uint64_t>();
    std::uint64_t bad = 0;
    for (std::uint64_t i = 0; i < words; ++i) { bad += r[i] != ferry::testing::pattern_word(seq, i); }
    ASSERT_EQ(bad, 0U) << "seq " << seq;
  }
}

TYPED_TEST_P(BackendContract, GraphReplayRepeatsCapturedWork)
{
  using B = TypeParam;
  constexpr std::uint64_t words = 1024;
  fb::stream<B> s{this->b};
  fb::device_buffer<B> payload{words * 8, this->b};
  fb::managed_buffer<B> flag{64, this->b};
  fb::pinned_buffer<B> out{words * 8, this->b};
  fb::event<B> done{this->b};
  auto* f = flag.template as<std::uint64_t>();
  fb::host_store_release(f, 0);
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    this->b.launch(ferry::testing::probe::publish_kernel(typename B::tag{}), fb::launch_config{{1}, {128}, 0}, cs.handle(),
                   payload.template as<std::uint64_t>(), words, f, std::uint64_t{7});
    this->b.memcpy_async(out.data(), payload.data(), words * 8, fb::memcpy_kind::device_to_host, cs.handle());
    done.record_external(cs);
  });
  EXPECT_EQ(fb::host_load_acquire(f), 0U) << "capture must not execute the work";
  for (int replay = 0; replay < 3; ++replay) {
    std::memset(out.data(), 0, words * 8);
    fb::host_store_release(f, 0);
    g.launch(s.view());
    done.synchronize();  // an external record is observable from the CPU at replay
    EXPECT_EQ(fb::host_load_acquire(f), 7U);
    EXPECT_EQ(out.template as<std::uint64_t>()[words - 1], ferry::testing::pattern_word(7, words - 1));
  }
  s.synchronize();
}

// A capture may fork: a second stream that waits on an event recorded on the capturing stream joins the
// capture, and must be joined back (the origin waits on an event recorded after its last operation) before
// the capture ends; the replay runs the branch after its fork point and before the join. An unjoined fork
// makes capture_end fail with a typed error.
TYPED_TEST_P(BackendContract, CaptureForksAndJoinsThroughEvents)
{
  using B = TypeParam;
  constexpr std::uint64_t words = 1024;
  fb::stream<B> s{this->b}, side{this->b};
  fb::device_buffer<B> payload{words * 8, this->b}, copy{words * 8, this->b};
  fb::managed_buffer<B> flag{64, this->b};
  fb::pinned_buffer<B> out{words * 8, this->b};
  fb::event<B> fork{this->b, fb::event_flags::disable_timing}, join{this->b, fb::event_flags::disable_timing};
  fb::event<B> done{this->b};
  auto* f = flag.template as<std::uint64_t>();
  fb::host_store_release(f, 0);
  // Defined contents (compute-sanitizer initcheck does not follow what a graph branch's copy initialized);
  // the checks below still see only the kernel's pattern, which reaches `out` through the branch alone.
  this->b.memset_async(payload.data(), 0, words * 8, s.handle());
  this->b.memset_async(copy.data(), 0, words * 8, s.handle());
  s.synchronize();
  auto g = fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
    this->b.launch(ferry::testing::probe::publish_kernel(typename B::tag{}), fb::launch_config{{1}, {128}, 0}, cs.handle(),
                   payload.template as<std::uint64_t>(), words, f, std::uint64_t{9});
    fork.record(cs);
    fork.wait(side.view());
    EXPECT_TRUE(this->b.stream_is_capturing(side.handle())) << "the waiting stream joins the capture";
    this->b.memcpy_async(copy.data(), payload.data(), words * 8, fb::memcpy_kind::device_to_device, side.handle());
    join.record(side.view());
    join.wait(cs);
    this->b.memcpy_async(out.data(), copy.data(), words * 8, fb::memcpy_kind::device_to_host, cs.handle());
    done.record_external(cs);
  });
  EXPECT_FALSE(this->b.stream_is_capturing(side.handle())) << "capture_end releases the joined stream";
  EXPECT_EQ(fb::host_load_acquire(f), 0U) << "capture must not execute the work";
  for (int replay = 0; replay < 3; ++replay) {
    std::memset(out.data(), 0, words * 8);
    g.launch(s.view());
    done.synchronize();
    EXPECT_EQ(out.template as<std::uint64_t>()[0], ferry::testing::pattern_word(9, 0));
    EXPECT_EQ(out.template as<std::uint64_t>()[words - 1], ferry::testing::pattern_word(9, words - 1));
  }
  s.synchronize();
  auto unjoined = [&] {
    (void)fb::graph_exec<B>::capture(s.view(), [&](fb::stream_view<B> cs) {
      fork.record(cs);
      fork.wait(side.view());
      this->b.memset_async(copy.data(), 0, 8, side.handle());  // never joined back
    });
  };
  EXPECT_THROW(unjoined(), ferry::backend_error);
  EXPECT_FALSE(this->b.stream_is_capturing(side.handle()));
  EXPECT_FALSE(this->b.stream_is_capturing(s.handle()));
  s.synchronize();
  side.synchronize();
}

TYPED_TEST_P(BackendContract, ErrorsAreTypedAndNameTheCall)
{
  using B = TypeParam;
  EXPECT_THROW((void)fb::stream_view<B>(this->b, typename B::stream_type{}), ferry::logic_error);
  EXPECT_THROW(this->b.set_device(fb::device_id{this->b.device_count() + 5}), typename B::error_type);
  try {
    this->b.set_device(fb::device_id{-3});
    FAIL() << "invalid device accepted";
  } catch (const ferry::backend_error& e) {
    EXPECT_FALSE(e.call().empty());
    EXPECT_NE(std::string(e.what()).find(e.call()), std::string::npos) << e.what();
    EXPECT_TRUE(std::regex_search(std::string{e.where()}, std::regex{R"(\.(hpp|cpp|inl|cu):[0-9]+$)"}))
      << "no file:line: " << e.what();
    EXPECT_NE(e.code(), 0);
  }
  fb::stream<B> s{this->b};
  EXPECT_THROW(this->b.launch(ferry::testing::probe::publish_kernel(typename B::tag{}), fb::launch_config{{0}, {32}, 0},
                              s.handle(), nullptr, std::uint64_t{0}, nullptr, std::uint64_t{0}),
               typename B::error_type);
  s.synchronize();  // the backend stays usable after a rejected call
  EXPECT_THROW((void)fb::device_buffer<B>(std::size_t{1} << 62, this->b), ferry::out_of_memory);
  EXPECT_THROW((void)fb::device_buffer<B>(0, this->b), ferry::logic_error);
}

TYPED_TEST_P(BackendContract, FaultInjectionFailsTheChosenCallWithTheBackendsError)
{
  using B = TypeParam;
  fb::fault_plan plan;
  using F = fb::faulty<B>;
  const auto scenario = [&](F f) {
    fb::stream<F> s{f};
    fb::device_buffer<F> d{4096, f};
    fb::pinned_buffer<F> h{4096, f};
    fb::event<F> e{f};
    f.memcpy_async(d.data(), h.data(), 4096, fb::memcpy_kind::host_to_device, s.handle());
    void* dst = d.data();
    const void* srcp = h.data();
    const std::size_t len = 64;
    f.memcpy_batch_h2d_async(&dst, &srcp, &len, 1, f.current_device(), s.handle());
    f.launch(ferry::testing::probe::publish_kernel(typename B::tag{}), fb::launch_config{{1}, {32}, 0}, s.handle(),
             d.template as<std::uint64_t>(), std::uint64_t{8}, d.template as<std::uint64_t>() + 100, std::uint64_t{1});
    e.record(s);
    e.synchronize();
  };
  scenario(F{&plan, this->b});  // count the calls
  const std::uint64_t n = plan.calls();
  const auto names = plan.log();
  ASSERT_GE(n, 8U);
  for (std::uint64_t i = 0; i < n; ++i) {
    for (bool sticky : {false, true}) {
      plan.reset_count();
      plan.fail_at(i, sticky);
      try {
        scenario(F{&plan, this->b});
        ADD_FAILURE() << "call " << i << " (" << names[i] << ") was armed but nothing failed";
      } catch (const typename B::error_type& e) {
        EXPECT_NE(std::string(e.what()).find(names[i].substr(names[i].find(':') + 1)), std::string::npos)
          << "error does not name the failed call " << names[i] << ": " << e.what();
      }
      EXPECT_EQ(plan.injected(), 1U) << "the first injected fault must stop the scenario";
    }
  }
  plan.disarm();
}

/// The caller's pageable memory (not allocated by the backend) follows CUDA's rules on every backend: a copy
/// from it reads the source before the call returns (a write right after the call does not reach the copy),
/// and a copy into it is complete when the call returns. The stream is kept busy first (a 64 MiB memset), so
/// on an emulation that copied later the write after the call would win and the vector would still be 0.
TYPED_TEST_P(BackendContract, PageableCopiesReadAndWriteAtTheCall)
{
  using B = TypeParam;
  constexpr std::size_t bytes = 4096;
  constexpr std::size_t busy_bytes = std::size_t{64} << 20;
  fb::stream<B> s{this->b};
  fb::device_buffer<B> busy{busy_bytes, this->b};
  fb::device_buffer<B> dev{bytes, this->b};
  for (int round = 0; round < 3; ++round) {
    std::vector<std::uint8_t> host(bytes, static_cast<std::uint8_t>(7 + round));
    this->b.memset_async(busy.data(), round, busy_bytes, s.handle());
    this->b.memcpy_async(dev.data(), host.data(), bytes, fb::memcpy_kind::host_to_device, s.handle());
    std::fill(host.begin(), host.end(), std::uint8_t{0xEE});  // after the call: not in the copy
    std::vector<std::uint8_t> back(bytes, 0);
    this->b.memset_async(busy.data(), round + 1, busy_bytes, s.handle());
    this->b.memcpy_async(back.data(), dev.data(), bytes, fb::memcpy_kind::device_to_host, s.handle());
    // no synchronize: a copy into pageable memory is complete when the call returns
    EXPECT_EQ(std::count(back.begin(), back.end(), static_cast<std::uint8_t>(7 + round)),
              static_cast<std::ptrdiff_t>(bytes))
      << "round " << round;
    s.synchronize();
  }
}

/// A host kernel that holds its stream until `open` is set (the host backend's stream gated by the test).
inline void wait_open(const fb::host_launch_ctx&, std::atomic<bool>* open)
{
  while (!open->load(std::memory_order_acquire)) { std::this_thread::yield(); }
}

/// Caller-owned host memory registered with host_register (a shared mapping, as sink::shm_stream's staging)
/// takes DMA both ways in stream order and behaves as pinned memory: on the host backend a copy into it is
/// asynchronous (behind a busy stream it has not landed when the call returns; it has after a synchronize),
/// as for allocate_pinned. Registering an overlapping range again is the backend's error; unregistering twice
/// and null are no-ops.
TYPED_TEST_P(BackendContract, RegisteredHostMemoryTakesCopiesLikePinned)
{
  using B = TypeParam;
  constexpr std::size_t bytes = std::size_t{1} << 20;
  constexpr std::size_t busy_bytes = std::size_t{64} << 20;
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* host = static_cast<std::uint8_t*>(map);
  std::memset(host, 0, bytes);
  this->b.host_register(map, bytes);
  EXPECT_THROW(this->b.host_register(host + 4096, 4096), typename B::error_type);
  fb::stream<B> s{this->b};
  fb::device_buffer<B> busy{busy_bytes, this->b};
  fb::device_buffer<B> dev{bytes, this->b};
  std::vector<std::uint8_t> want(bytes);
  for (std::size_t i = 0; i < bytes; ++i) { want[i] = static_cast<std::uint8_t>(i * 7 + 3); }
  this->b.memcpy_async(dev.data(), want.data(), bytes, fb::memcpy_kind::host_to_device, s.handle());
  this->b.memset_async(busy.data(), 1, busy_bytes, s.handle());
  // Host backend: the stream held until the check (no race with its worker); a watchdog opens it after 2 s, so
  // a copy that waits for the stream (memory taken as pageable) returns late and fails the check, not hangs.
  std::atomic<bool> open{false};
  std::thread watchdog;
  if constexpr (std::is_same_v<B, fb::host_backend>) {
    this->b.launch(fb::host_kernel<std::atomic<bool>*>{&wait_open, "wait_open"}, fb::launch_config{{1}, {1}, 0, false},
                   s.handle(), &open);
    watchdog = std::thread([&open] {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (!open.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      open.store(true, std::memory_order_release);
    });
  }
  this->b.memcpy_async(host, dev.data(), bytes, fb::memcpy_kind::device_to_host, s.handle());
  if constexpr (std::is_same_v<B, fb::host_backend>) {
    EXPECT_NE(host[bytes - 1], want[bytes - 1]) << "a copy into registered memory returned after it landed";
    open.store(true, std::memory_order_release);
    watchdog.join();
  }
  s.synchronize();
  EXPECT_EQ(std::memcmp(host, want.data(), bytes), 0);
  std::memset(host, 0x5A, bytes);  // and back out of it
  this->b.memcpy_async(dev.data(), host, bytes, fb::memcpy_kind::host_to_device, s.handle());
  std::vector<std::uint8_t> back(bytes, 0);
  this->b.memcpy_async(back.data(), dev.data(), bytes, fb::memcpy_kind::device_to_host, s.handle());
  s.synchronize();
  EXPECT_EQ(std::count(back.begin(), back.end(), std::uint8_t{0x5A}), static_cast<std::ptrdiff_t>(bytes));
  this->b.host_unregister(map);
  this->b.host_unregister(map);  // a no-op, as is null
  this->b.host_unregister(nullptr);
  this->b.host_register(map, bytes);  // free again
  this->b.host_unregister(map);
  ::munmap(map, bytes);
}

REGISTER_TYPED_TEST_SUITE_P(BackendContract, AttributesAreReadable, StreamOrderAcrossCopiesOfEveryMemoryKind,
                            BatchCopyLandsEveryRangeInStreamOrder, PageableCopiesReadAndWriteAtTheCall,
                            RegisteredHostMemoryTakesCopiesLikePinned,
                            EventCompletesOnlyWhenReached, TimingEventsMeasureElapsedTime,
                            CrossStreamWaitOrdersTheWaiter, DeviceReleaseHostAcquireHandOff,
                            HostReleaseDeviceAcquireHandOff, GraphReplayRepeatsCapturedWork,
                            CaptureForksAndJoinsThroughEvents,
                            ErrorsAreTypedAndNameTheCall, FaultInjectionFailsTheChosenCallWithTheBackendsError);

}  // namespace ferry::test
