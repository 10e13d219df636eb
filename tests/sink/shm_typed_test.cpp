// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's hook schema (sink/shm_stream.hpp, shm_reader.hpp, src/sink/shm_schema.hpp;
// docs/design/shm_stream.md, S0): typed entries in a reader process for every dtype, the schema adopted from the
// channel after the reader attached, a config schema, the adoption rules, a reader that never sees a half-written
// schema, and corrupted schema regions refused with a typed error.
#include "sink/shm_child.hpp"
#include "sink/shm_pattern.hpp"
#include "src/sink/crc32.hpp"  // the segment's CRC-32 (src/sink, compiled into ferry::core)

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/sink.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>

namespace ferry::test {
namespace {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace fk = ferry::sink;
namespace shm = ferry::sink::detail::shm;
using B = fb::host_backend;
using namespace std::chrono_literals;

class ShmStreamTyped : public ::testing::Test {
 protected:
  static constexpr std::uint32_t undeclared = 40;  ///< a hook outside every schema here

  void SetUp() override
  {
    b.set_device(fb::device_id{0});
    name = "test-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::shm_unlink(shm::object_name(name).c_str());
  }
  void TearDown() override { ::shm_unlink(shm::object_name(name).c_str()); }

  [[nodiscard]] fk::shm_stream_config stream_config() const
  {
    fk::shm_stream_config c;
    c.name = name;
    c.staging_bytes = 256 << 10;
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
  /// One hook per dtype (hook k: the k-th of d2h::dtype), rows of {2, 3} or {5} elements, and an U8 hook of one
  /// element per row.
  static fd::hook_schema every_dtype()
  {
    fd::hook_schema s;
    for (std::uint32_t k = 0; k < 15; ++k) {
      const auto t = static_cast<fd::dtype>(k);
      s.add(fd::hook_id{k}, "hook." + std::string{fd::dtype_name(t)}, t,
            k % 2 == 0 ? std::vector<std::uint64_t>{2, 3} : std::vector<std::uint64_t>{5});
    }
    return s.add(fd::hook_id{15}, "token_ids", fd::dtype::u8);
  }
  /// Captures one entry of hook `hook`: `bytes` bytes of the pattern of (tag, hook).
  void capture(fd::channel<B>& ch, std::uint64_t tag, std::uint32_t hook, std::uint64_t bytes)
  {
    auto& v = host.emplace_back(bytes);  // kept: the copy is asynchronous
    for (std::size_t i = 0; i < v.size(); ++i) { v[i] = shm_pattern(tag, hook, i); }
    src.emplace_back(bytes, b);
    b.memcpy_async(src.back().data(), v.data(), bytes, fb::memcpy_kind::host_to_device, s.handle());
    ch.capture(fd::hook_id{hook}, src.back().data(), bytes, s);
  }
  /// Waits up to 5 s for `pred`.
  static bool eventually(const std::function<bool()>& pred)
  {
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (!pred()) {
      if (std::chrono::steady_clock::now() >= end) { return false; }
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  B b;
  fb::stream<B> s{b};
  std::string name;
  std::deque<std::vector<std::uint8_t>> host;
  std::deque<fb::device_buffer<B>> src;
};

// The reader process attaches before the channel exists (the schema is empty then); the stream adopts the
// channel's schema; every entry of every dtype arrives typed: its name, dtype and shape [rows, *row_shape], and
// its elements, read as the dtype's C++ type, byte-exact. An undeclared hook stays bytes. Without S0 (the schema
// looked up at attach only, or after the first descriptor) the entries arrive untyped and this fails.
TEST_F(ShmStreamTyped, EveryDtypeReachesTheReaderProcessTypedWithTheChannelsSchema)
{
  constexpr std::uint64_t F = 12;
  fk::shm_stream stream{stream_config()};
  shm_child reader{{"typed", name, std::to_string(F * 17)}};
  EXPECT_EQ(reader.expect_line("attached"), "attached 0 schema 0");
  const fd::hook_schema schema = every_dtype();
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b), schema};
  stream.adopt_schema(*ch.schema());
  EXPECT_EQ(stream.cfg().schema.size(), 16U);
  for (std::uint64_t f = 0; f < F; ++f) {
    fd::forward_meta m;
    m.tag = 1000 + f;
    ch.begin_forward(s, m);
    for (std::uint32_t k = 0; k < 16; ++k) { capture(ch, 1000 + f, k, (1 + (f + k) % 4) * schema.find(fd::hook_id{k})->row_bytes); }
    capture(ch, 1000 + f, undeclared, 100 + f);
    (void)ch.end_forward(s);
  }
  std::uint64_t typed = 0, raw = 0;
  for (std::uint64_t i = 0; i < F * 17; ++i) {
    const auto l = reader.line();
    ASSERT_TRUE(l.has_value()) << "the reader went quiet after " << i << " entries";
    std::istringstream in{*l};
    std::string kind, hook_name, dtype, shape;
    std::uint64_t index = 0, hook = 0, tag = 0, ok = 0;
    in >> kind >> index >> hook >> tag;
    const std::uint64_t f = tag - 1000;
    EXPECT_EQ(index, i);
    if (hook == undeclared) {
      std::uint64_t size = 0;
      in >> size >> ok;
      EXPECT_EQ(kind, "raw") << *l;
      EXPECT_EQ(size, 100 + f) << *l;
      EXPECT_EQ(ok, 1U) << *l;
      ++raw;
      continue;
    }
    in >> hook_name >> dtype >> shape >> ok;
    const fd::hook_spec& h = *schema.find(fd::hook_id{static_cast<std::uint32_t>(hook)});
    std::string want_shape = std::to_string(1 + (f + hook) % 4);
    for (const auto d : h.row_shape) { want_shape += "x" + std::to_string(d); }
    EXPECT_EQ(kind, "typed") << *l;
    EXPECT_EQ(hook_name, h.name) << *l;
    EXPECT_EQ(dtype, fd::dtype_name(h.type)) << *l;
    EXPECT_EQ(shape, want_shape) << *l;
    EXPECT_EQ(ok, 1U) << "a typed element differs from the captured bytes: " << *l;
    ++typed;
  }
  EXPECT_EQ(reader.expect_line("done"), "done");
  EXPECT_EQ(typed, F * 16);
  EXPECT_EQ(raw, F);
  (void)ch.close();
  (void)stream.close();
}

// A config schema is in the segment before a reader can attach; a stream with a schema keeps it (adopt_schema:
// nothing); one without takes its channel's before the first entry only, and only what fits schema_bytes.
TEST_F(ShmStreamTyped, AConfigSchemaIsThereAtAttachAndAdoptionFollowsTheSinksRules)
{
  auto sc = stream_config();
  sc.schema.add(fd::hook_id{3}, "layers.3.out", fd::dtype::f32, {4});
  {
    fk::shm_stream stream{sc};
    fk::shm_reader r{name, 2s};
    ASSERT_EQ(r.schema()->size(), 1U);
    const fd::hook_spec* h = r.schema()->find(fd::hook_id{3});
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->name, "layers.3.out");
    EXPECT_EQ(h->type, fd::dtype::f32);
    EXPECT_EQ(h->row_shape, (std::vector<std::uint64_t>{4}));
    EXPECT_NO_THROW(stream.adopt_schema(every_dtype()));  // keeps its own
    EXPECT_EQ(stream.cfg().schema.size(), 1U);
    fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
    ch.begin_forward(s);
    capture(ch, 0, 3, 3 * 16);
    capture(ch, 0, 4, 10);
    (void)ch.end_forward(s);
    std::vector<fk::shm_entry> got;
    while (got.size() < 2) {
      for (auto& e : r.poll(2, 2s)) { got.push_back(std::move(e)); }
    }
    const fd::typed_view t = got[0].typed();
    EXPECT_EQ(t.shape(), (std::vector<std::uint64_t>{3, 4}));
    EXPECT_EQ(t.as<float>().size(), 12U);
    EXPECT_EQ(t.bytes().data(), got[0].bytes().data()) << "zero-copy";
    EXPECT_EQ(got[1].spec(), nullptr);
    EXPECT_THROW((void)got[1].typed(), fd::entry_shape_error);
    got.clear();
    r.close();
    (void)ch.close();
    (void)stream.close();
  }
  {
    fk::shm_stream stream{stream_config()};
    EXPECT_NO_THROW(stream.adopt_schema(fd::hook_schema{}));  // nothing to take: the entries stay bytes
    EXPECT_TRUE(stream.cfg().schema.empty());
    stream.adopt_schema(sc.schema);
    stream.adopt_schema(every_dtype());  // it has one now: kept
    EXPECT_EQ(stream.cfg().schema.size(), 1U);
    fk::shm_reader r{name, 2s};
    EXPECT_EQ(r.schema()->size(), 1U);
    r.close();
    (void)stream.close();
  }
  {
    fk::shm_stream stream{stream_config()};
    fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
    ch.begin_forward(s);
    capture(ch, 0, 3, 16);
    (void)ch.end_forward(s);
    ASSERT_TRUE(eventually([&] { return ch.stats().entries_drained == 1; }));
    try {
      stream.adopt_schema(sc.schema);
      FAIL() << "a schema adopted after an entry";
    } catch (const ferry::logic_error& e) {
      EXPECT_NE(std::string{e.what()}.find("expected to take its channel's schema before its first entry"),
                std::string::npos) << e.what();
    }
    (void)ch.close();
    fk::shm_reader r{name, 2s};  // releases the entry so close() need not wait
    (void)r.poll(1, 2s);
    r.close();
    (void)stream.close();
    EXPECT_THROW(stream.adopt_schema(sc.schema), ferry::logic_error) << "after close()";
  }
  {
    auto small = stream_config();
    small.schema_bytes = 4096;
    fk::shm_stream stream{small};
    fd::hook_schema big;
    for (std::uint32_t k = 0; k < 100; ++k) { big.add(fd::hook_id{k}, "model.layers." + std::to_string(k) + ".mlp.down_proj.output", fd::dtype::bf16, {4096}); }
    try {
      stream.adopt_schema(big);
      FAIL() << "a schema larger than schema_bytes";
    } catch (const ferry::logic_error& e) {
      EXPECT_NE(std::string{e.what()}.find("expected a schema of at most 4096 bytes in the segment"), std::string::npos)
        << e.what();
    }
    (void)stream.close();
  }
}

// S0's order: the region's bytes, then the schema word (store-release); a reader reads the region only after an
// acquire load of a nonzero word. A reader thread here asks for the schema in a loop while the producer adopts a
// ~300 KB schema (its copy into the segment takes tens of microseconds): with the word stored first the reader
// parses a half-written region (a CRC or bounds error, or a short schema) and this fails.
TEST_F(ShmStreamTyped, AReaderNeverSeesAHalfWrittenSchema)
{
  fd::hook_schema big;
  for (std::uint32_t k = 0; k < 5000; ++k) {
    big.add(fd::hook_id{k}, "model.layers." + std::to_string(k) + ".self_attn.o_proj.output", fd::dtype::bf16, {4096});
  }
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    auto sc = stream_config();
    sc.schema_bytes = 1 << 20;
    fk::shm_stream stream{sc};
    fk::shm_reader r{name, 2s};
    std::atomic<bool> start{false};
    std::string error;
    std::size_t seen = 0, looks = 0;
    std::thread reader{[&] {
      start = true;
      try {
        for (; seen == 0 && looks < 100'000'000; ++looks) { seen = r.schema()->size(); }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }};
    while (!start) { std::this_thread::yield(); }
    std::this_thread::sleep_for(200us);
    stream.adopt_schema(big);
    reader.join();
    EXPECT_EQ(error, "");
    EXPECT_EQ(seen, big.size());
    const auto got = r.schema();
    EXPECT_EQ(got->hooks().back().name, big.hooks().back().name);
    r.close();
    (void)stream.close();
  }
}

// Corrupted schema regions: each is a d2h::schema_error naming the stream and what was expected against what is
// there, from schema() and from poll(); never a read outside the region (the reader parses a copy of at most
// the region's capacity).
TEST_F(ShmStreamTyped, ACorruptedSchemaRegionIsATypedErrorNeverAFault)
{
  auto sc = stream_config();
  sc.schema.add(fd::hook_id{0}, "resid", fd::dtype::f32, {8}).add(fd::hook_id{1}, "ids", fd::dtype::i64)
    .add(fd::hook_id{2}, "attn", fd::dtype::bf16, {2, 4});
  fk::shm_stream stream{sc};
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  ch.begin_forward(s);
  capture(ch, 0, 1, 64);
  (void)ch.end_forward(s);
  ASSERT_TRUE(eventually([&] { return stream.stats().entries_published == 1; }));
  const int fd = ::shm_open(shm::object_name(name).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  void* p = ::mmap(nullptr, shm::header_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* h = static_cast<std::byte*>(p);
  const std::uint64_t offset = shm::load(h, shm::w_schema_offset), capacity = shm::load(h, shm::w_schema_capacity);
  const std::uint64_t word = shm::load(h, shm::w_schema);
  void* q = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  ::close(fd);
  ASSERT_NE(q, MAP_FAILED);
  auto* region = static_cast<std::byte*>(q);
  const std::vector<std::byte> good(region, region + word);
  // header 32; "resid" F32 {8}: 8 + 8 + 3 + 5 = 24; "ids" I64 {}: 8 + 3 + 3 -> 16; "attn" BF16 {2, 4}: 8 + 16 + 4 + 4 = 32
  ASSERT_EQ(word, 32U + 24 + 16 + 32) << "the region as shm_schema.hpp lays it out";
  const auto u64 = [&](std::size_t at, std::uint64_t v) { std::memcpy(region + at, &v, 8); };
  const auto u8 = [&](std::size_t at, std::uint8_t v) { std::memcpy(region + at, &v, 1); };
  const auto recrc = [&] {
    const std::uint32_t c = ferry::sink::detail::crc32(region + 32, word - 32);
    std::memcpy(region + 24, &c, 4);
  };
  struct corruption {
    const char* what;
    std::function<void()> apply;
    const char* message;
  };
  const std::vector<corruption> cases = {
    {"a byte of a name", [&] { u8(32 + 19, 'R'); }, "expected the body's CRC-32"},
    {"a word past the region", [&] { shm::store(h, shm::w_schema, capacity + 8); }, "expected a schema region of at most"},
    {"a word shorter than the header", [&] { shm::store(h, shm::w_schema, 16); }, "expected at least its 32 byte header"},
    {"the magic", [&] { u64(0, 42); }, "expected magic"},
    {"the body length", [&] { u64(16, 8); }, "expected a body of 72 bytes (the schema word's), got a header saying 8"},
    {"a dimension count past the body", [&] { u8(32 + 4, 255); recrc(); }, "record 0 of 3: expected its row shape (2040 bytes) within the body, got 64 bytes left at offset 8"},
    {"an empty name", [&] { u8(32 + 6, 0); recrc(); }, "record 0: expected a valid hook"},
    {"an unknown dtype", [&] { u8(32 + 16, 'X'); recrc(); }, "record 0 (hook 0): expected a dtype among"},
    {"more records than the body holds", [&] { u64(8, std::uint64_t{1} << 62); }, "record 3 of 4611686018427387904: expected its hook id"},
    {"fewer records than the body holds", [&] { u64(8, 2); }, "expected 2 records filling the body, got 32 bytes after them"},
    {"a duplicate hook id", [&] { u8(32 + 24, 0); recrc(); }, "expected each hook id once"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::memcpy(region, good.data(), good.size());
    shm::store(h, shm::w_schema, word);
    c.apply();
    fk::shm_reader r{name, 2s};
    for (int call = 0; call < 2; ++call) {
      try {
        if (call == 0) {
          (void)r.schema();
        } else {
          (void)r.poll(1, 100ms);
        }
        ADD_FAILURE() << (call == 0 ? "schema()" : "poll()") << " took a corrupted region";
      } catch (const fd::schema_error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("shm reader: stream '" + name + "'"), std::string::npos) << m;
        EXPECT_NE(m.find(c.message), std::string::npos) << m;
      }
    }
  }
  std::memcpy(region, good.data(), good.size());
  shm::store(h, shm::w_schema, word);
  {
    fk::shm_reader r{name, 2s};  // the region restored: read as written
    EXPECT_EQ(r.schema()->size(), 3U);
    auto e = r.poll(1, 2s);
    ASSERT_EQ(e.size(), 1U);
    EXPECT_EQ(e[0].typed().shape(), (std::vector<std::uint64_t>{8}));
  }
  ::munmap(q, capacity);
  ::munmap(p, shm::header_bytes);
  (void)ch.close();
  (void)stream.close();
}

}  // namespace
}  // namespace ferry::test
