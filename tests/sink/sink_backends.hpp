// SPDX-License-Identifier: Apache-2.0
// SinkBackends: both native sinks behind a channel of backend B (instantiated for the host backend in
// sink_backends_host_test.cpp and for CUDA in sink_cuda_test.cpp, label gpu): device sources whose every byte
// derives from (tag, hook, position) (shm_pattern.hpp), captured eagerly, and read back byte-exact: the
// safetensors shards through run_reader.hpp, the shared-memory stream through an in-process shm_reader (the
// reader needs no GPU; the host suites also read it from another process). On CUDA this is the pinned staging
// the sink reads and, for the stream, shared memory registered with the device (backend::host_register).
#pragma once

#include "sink/run_reader.hpp"
#include "sink/shm_pattern.hpp"
#include "support/gpu.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/sink.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace ferry::test {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace fk = ferry::sink;

template <class B>
class SinkBackends : public ::testing::Test {
 protected:
  static constexpr std::uint64_t forwards = 24;

  void SetUp() override
  {
    FERRY_REQUIRE_DEVICE(B{}.device_count());
    b.set_device(fb::device_id{0});
    name = "gtest-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  /// Device memory holding every forward's three entries, hook k of forward f at src(f, k).
  struct device_sources {
    fb::device_buffer<B> dev;
    device_sources(B be, fb::stream_view<B> s)
      : dev{forwards * shm_hooks * 4096, be}
    {
      fb::pinned_buffer<B> host{forwards * shm_hooks * 4096, be};
      for (std::uint64_t f = 0; f < forwards; ++f) {
        for (std::uint32_t k = 0; k < shm_hooks; ++k) {
          const auto v = shm_entry_bytes(100 + f, k);
          std::memcpy(static_cast<std::uint8_t*>(host.data()) + (f * shm_hooks + k) * 4096, v.data(), v.size());
        }
      }
      be.memcpy_async(dev.data(), host.data(), forwards * shm_hooks * 4096, fb::memcpy_kind::automatic, s.handle());
      be.stream_synchronize(s.handle());  // the pinned staging of the upload dies here
    }
    const void* src(std::uint64_t f, std::uint32_t k) const
    {
      return static_cast<const std::uint8_t*>(dev.data()) + (f * shm_hooks + k) * 4096;
    }
  };

  /// Captures every forward (tag 100 + f) on channel `ch`, eagerly.
  void capture_all(fd::channel<B>& ch, fb::stream<B>& s, const device_sources& src)
  {
    for (std::uint64_t f = 0; f < forwards; ++f) {
      fd::forward_meta m;
      m.tag = 100 + f;
      ch.begin_forward(s, m);
      for (std::uint32_t k = 0; k < shm_hooks; ++k) { ch.capture(fd::hook_id{k}, src.src(f, k), shm_hook_bytes(k), s); }
      ch.end_forward(s);
    }
  }

  /// Every forward through a safetensors sink (shards of 16 KiB: the run spans several, forwards move to the next
  /// shard) read back byte-exact. `lend_min`: safetensors_tuning::lend_min_bytes (the shards are buffered: entries
  /// of at least that many bytes are written from the staging, which the channel's 64 KiB ring then reuses).
  void safetensors_round_trip(std::size_t lend_min)
  {
    const auto dir = std::filesystem::temp_directory_path() / ("ferry_" + name);
    std::filesystem::remove_all(dir);
    fk::safetensors_config sc;
    sc.directory = dir;
    sc.shard_bytes = 16 << 10;  // about 3 forwards per shard: the run spans several
    for (std::uint32_t k = 0; k < shm_hooks; ++k) {
      sc.schema.add(fd::hook_id{k}, "hook" + std::to_string(k), fd::dtype::u8);
    }
    sc.tuning.lend_min_bytes = lend_min;
    fk::safetensors sink{sc};
    fb::stream<B> s{b};
    device_sources src{b, s};
    fd::config cfg;
    cfg.ring_bytes = 64 << 10;  // wraps several times
    cfg.publish_every = 2;
    {
      fd::channel<B> ch{cfg, b, sink};  // the one-call attach (d2h/sink.hpp)
      capture_all(ch, s, src);
      EXPECT_TRUE(ch.close().clean());
    }
    const fk::safetensors_stats st = sink.close();
    EXPECT_EQ(st.forwards_written, forwards);
    EXPECT_EQ(st.failed_entries + st.refused_entries + st.dropped_entries, 0u);
    // hooks of 4000, 1000 and 48 bytes (shm_pattern.hpp): those at least lend_min long went from the staging
    std::uint64_t lent = 0;
    for (std::uint32_t k = 0; k < shm_hooks; ++k) { lent += shm_hook_bytes(k) >= lend_min ? forwards : 0; }
    EXPECT_EQ(st.lent_entries, lent);
    const sinkread::run r = sinkread::read_run(dir);
    EXPECT_GT(r.files.size(), 1u);
    for (const auto& f : r.files) { sinkread::expect_forward_crcs(dir / f); }  // lent and copied pieces joined
    ASSERT_EQ(r.tensors.size(), forwards * shm_hooks);
    for (std::uint64_t f = 0; f < forwards; ++f) {
      for (std::uint32_t k = 0; k < shm_hooks; ++k) {
        const sinkread::tensor& t = r.tensors[f * shm_hooks + k];
        EXPECT_EQ(t.name, std::to_string(100 + f) + "/hook" + std::to_string(k));
        EXPECT_EQ(t.bytes, shm_entry_bytes(100 + f, k)) << t.name << ": bytes differ from the device source";
      }
    }
    std::filesystem::remove_all(dir);
  }

  B b{};
  std::string name;
};

TYPED_TEST_SUITE_P(SinkBackends);

TYPED_TEST_P(SinkBackends, SafetensorsShardsHoldEveryDeviceCaptureByteExact)
{
  this->safetensors_round_trip(std::size_t{256} << 10);  // the default: these entries (at most 4 KiB) are copied
}

/// The same run with entries of 1000 bytes and more written from the staging itself (shard_file::append's lent path):
/// the staging ring wraps under writes still in flight, and every byte reads back as captured.
TYPED_TEST_P(SinkBackends, SafetensorsEntriesLentFromTheStagingReadBackExact)
{
  this->safetensors_round_trip(1000);
}

TYPED_TEST_P(SinkBackends, ShmStreamHandsEveryDeviceCaptureToTheReaderByteExact)
{
  using B = TypeParam;
  fk::shm_stream_config sc;
  sc.name = this->name;
  sc.staging_bytes = 32 << 10;  // about 6 forwards: every region reused after the reader released it
  sc.timeout = std::chrono::seconds(20);
  fk::shm_stream stream{sc};
  fb::stream<B> s{this->b};
  typename TestFixture::device_sources src{this->b, s};
  fk::shm_reader reader{this->name};
  std::vector<std::string> bad;
  std::uint64_t n = 0;
  std::thread consumer{[&] {
    while (!reader.ended()) {
      for (fk::shm_entry& e : reader.poll(16, std::chrono::milliseconds(50))) {
        const std::uint64_t f = n / shm_hooks;
        const auto k = static_cast<std::uint32_t>(n % shm_hooks);
        const auto want = shm_entry_bytes(100 + f, k);
        const auto got = e.bytes();
        if (e.hook().value != k || e.tag() != 100 + f || got.size() != want.size() ||
            std::memcmp(got.data(), want.data(), want.size()) != 0) {
          bad.push_back("entry " + std::to_string(n));
        }
        ++n;
      }
    }
  }};
  fd::config cfg;
  cfg.ring_bytes = 64 << 10;
  cfg.publish_every = 2;
  {
    fd::channel<B> ch{cfg, this->b, stream};  // the one-call attach: the shared segment is the staging
    this->capture_all(ch, s, src);
    EXPECT_TRUE(ch.close().clean());
  }
  const fk::shm_stream_stats st = stream.close();  // block: waits for the reader to release everything
  consumer.join();
  EXPECT_EQ(n, this->forwards * shm_hooks);
  EXPECT_TRUE(bad.empty()) << bad.size() << " entries differ, first " << bad.front();
  EXPECT_EQ(st.entries_released, this->forwards * shm_hooks);
}

REGISTER_TYPED_TEST_SUITE_P(SinkBackends, SafetensorsShardsHoldEveryDeviceCaptureByteExact,
                            SafetensorsEntriesLentFromTheStagingReadBackExact,
                            ShmStreamHandsEveryDeviceCaptureToTheReaderByteExact);

}  // namespace ferry::test
