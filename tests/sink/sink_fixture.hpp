// SPDX-License-Identifier: Apache-2.0
// The fixture of the SafetensorsSink tests: a host-backend channel whose forwards capture three hooks of
// three dtypes (every byte derived from its forward and hook, so a stale, torn or misplaced byte fails), a
// run directory per test, and the check of a run against the forwards that must be in it (names, dtypes,
// shapes, bytes, tags per shard, each forward's CRC-32), read back by run_reader.hpp.
#pragma once

#include "sink/run_reader.hpp"
#include "src/sink/crc32.hpp"  // the sink's own CRC-32 (src/sink, compiled into ferry::core)

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/sink.hpp>
#include <ferry/testing/sink_access.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace ferry::test {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace fk = ferry::sink;
namespace fs = std::filesystem;
using B = fb::host_backend;
using namespace std::chrono_literals;

/// The message of the E that f() throws (a test failure when it throws none).
template <class E, class F>
std::string error_of(F&& f)
{
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

/// One hook of the test forwards: its id, name, dtype, row shape, and the rows it captures per forward.
struct test_hook {
  std::uint32_t id;
  std::string name;
  fd::dtype type;
  std::vector<std::uint64_t> row_shape;
  std::uint64_t rows;
  std::uint64_t row_bytes() const
  {
    std::uint64_t n = fd::dtype_bytes(type);
    for (const auto d : row_shape) { n *= d; }
    return n;
  }
};

class SafetensorsSink : public ::testing::Test {
 protected:
  static constexpr std::uint64_t max_forwards = 64;

  void SetUp() override
  {
    b.set_device(fb::device_id{0});
    dir = fs::temp_directory_path() /
          ("ferry_sink_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    hooks = {{0, "embed", fd::dtype::bf16, {8}, 3}, {1, "token_ids", fd::dtype::i64, {}, 3},
             {2, "layers.0.mlp", fd::dtype::f32, {2, 4}, 3}};
    upload_sources();
  }
  void TearDown() override
  {
    if (mounted) { (void)std::system(("umount '" + dir.string() + "' 2>/dev/null").c_str()); }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  [[nodiscard]] fd::hook_schema schema() const
  {
    fd::hook_schema s;
    for (const auto& h : hooks) { s.add(fd::hook_id{h.id}, h.name, h.type, h.row_shape); }
    return s;
  }
  [[nodiscard]] fk::safetensors_config sink_config() const
  {
    fk::safetensors_config c;
    c.directory = dir;
    c.schema = schema();
    c.tuning.open_shards = 1;  // the tests' layouts (shards of consecutive forwards) wherever the directory is
    return c;
  }
  static fd::config channel_config()
  {
    fd::config c;
    c.ring_bytes = 1 << 16;
    c.publish_every = 4;
    c.timeout = 10s;
    c.tuning.size_slots = 16;
    return c;
  }

  /// Byte i of hook h's entry in forward f.
  static std::uint8_t byte(std::uint64_t f, std::uint32_t h, std::uint64_t i)
  {
    return static_cast<std::uint8_t>(f * 37 + h * 101 + i * 7 + 3);
  }
  [[nodiscard]] std::uint64_t forward_bytes() const
  {
    std::uint64_t n = 0;
    for (const auto& h : hooks) { n += h.rows * h.row_bytes(); }
    return n;
  }
  [[nodiscard]] std::vector<std::uint8_t> expected(std::uint64_t f, const test_hook& h) const
  {
    std::vector<std::uint8_t> e(h.rows * h.row_bytes());
    for (std::uint64_t i = 0; i < e.size(); ++i) { e[i] = byte(f, h.id, i); }
    return e;
  }
  /// Device memory holding every (forward, hook) entry's bytes: forward f's hook k at src_at(f, k).
  void upload_sources()
  {
    const std::uint64_t n = max_forwards * forward_bytes();
    fb::pinned_buffer<B> host{n, b};
    auto* p = static_cast<std::uint8_t*>(host.data());
    for (std::uint64_t f = 0; f < max_forwards; ++f) {
      for (std::size_t k = 0; k < hooks.size(); ++k) {
        const auto e = expected(f, hooks[k]);
        std::copy(e.begin(), e.end(), p + (src_at(f, k) - 0));
      }
    }
    src.emplace(n, b);
    fb::stream<B> s{b};
    b.memcpy_async(src->data(), host.data(), n, fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
  }
  [[nodiscard]] std::uint64_t src_at(std::uint64_t f, std::size_t k) const
  {
    std::uint64_t off = f * forward_bytes();
    for (std::size_t j = 0; j < k; ++j) { off += hooks[j].rows * hooks[j].row_bytes(); }
    return off;
  }
  [[nodiscard]] const void* src_ptr(std::uint64_t f, std::size_t k) const
  {
    return static_cast<const std::byte*>(src->data()) + src_at(f, k);
  }

  /// Forward f (source f) on `ch`: every hook once, tagged `tag` (none: the channel's forward index).
  void forward(fd::channel<B>& ch, fb::stream<B>& s, std::uint64_t f, std::optional<std::uint64_t> tag = {},
               std::vector<fd::request_rows> requests = {})
  {
    fd::forward_meta m;
    m.tag = tag;
    m.requests = std::move(requests);
    ch.begin_forward(s, m);
    for (std::size_t k = 0; k < hooks.size(); ++k) {
      ch.capture(fd::hook_id{hooks[k].id}, src_ptr(f, k), hooks[k].rows * hooks[k].row_bytes(), s);
    }
    (void)ch.end_forward(s);
  }

  /// Waits until `pred` holds (5 s at most).
  static void wait_for(const std::function<bool()>& pred, const char* what)
  {
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (!pred()) {
      ASSERT_LT(std::chrono::steady_clock::now(), end) << "timed out waiting for " << what;
      std::this_thread::sleep_for(1ms);
    }
  }
  /// Waits until the channel delivered `n` entries and the sink's writer emptied its queue.
  static void wait_written(fd::channel<B>& ch, fk::safetensors& sink, std::uint64_t n)
  {
    wait_for([&] { return ch.stats().entries_drained >= n && sink.stats().queue_entries == 0; }, "the writer");
  }

  /// One forward the run must hold: its source and its tag.
  struct want {
    std::uint64_t source;
    std::uint64_t tag;
  };
  /// Checks the run in `dir` holds exactly `forwards` (in order, every hook, exact bytes, shapes and dtypes),
  /// each shard's tags, and each forward's CRC-32 in its shard's metadata. Returns the run.
  sinkread::run expect_run(const std::vector<want>& forwards)
  {
    sinkread::run r;
    try {
      r = sinkread::read_run(dir);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the run does not read back: " << e.what();
      return r;
    }
    const std::vector<std::uint64_t>& tags = r.forward_tags;
    std::vector<std::uint64_t> want_tags;
    std::size_t i = 0;
    for (const auto& w : forwards) {
      want_tags.push_back(w.tag);
      for (const auto& h : hooks) {
        SCOPED_TRACE(::testing::Message() << "forward source " << w.source << " tag " << w.tag << " hook " << h.name);
        if (i >= r.tensors.size()) {
          ADD_FAILURE() << "missing tensor";
          return r;
        }
        const auto& t = r.tensors[i++];
        EXPECT_EQ(t.name, std::to_string(w.tag) + "/" + h.name);
        EXPECT_EQ(t.dtype, std::string{fd::dtype_name(h.type)});
        std::vector<std::uint64_t> shape{h.rows};
        shape.insert(shape.end(), h.row_shape.begin(), h.row_shape.end());
        EXPECT_EQ(t.shape, shape);
        EXPECT_EQ(t.bytes, expected(w.source, h));
      }
    }
    EXPECT_EQ(i, r.tensors.size()) << "tensors beyond the expected forwards";
    EXPECT_EQ(tags, want_tags);
    for (const auto& f : r.files) { sinkread::expect_forward_crcs(dir / f); }
    return r;
  }
  /// Whether the run directory holds a temporary file (it must not once the sink is closed).
  [[nodiscard]] bool has_temporaries() const
  {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().ends_with(".tmp")) { return true; }
    }
    return false;
  }

  fb::host_backend b;
  fs::path dir;
  std::vector<test_hook> hooks;
  std::optional<fb::device_buffer<B>> src;
  bool mounted{false};
};

}  // namespace ferry::test
