// SPDX-License-Identifier: Apache-2.0
// Pure units of the sinks, no channel: dtypes, the hook schema (validation, shapes, refusals), the JSON
// writer, CRC-32, and one shard file (publish, rollback, a forward moved to the next shard, the header
// reservation too small and far too large), each shard read back by tests/sink/run_reader.hpp.
#include "sink/run_reader.hpp"
#include "src/sink/crc32.hpp"  // the sinks' private parts (src/sink, compiled into ferry::core)
#include "src/sink/json.hpp"
#include "src/sink/run_index.hpp"
#include "src/sink/shard_file.hpp"
#include "src/sink/shard_writer.hpp"  // open_shards_of
#include "src/sink/shm_schema.hpp"
#include "src/sink/write_pipeline.hpp"

#include <ferry/d2h/hook_schema.hpp>
#include <ferry/sink/sequential_file.hpp>
#include <ferry/version.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <csignal>
#include <linux/magic.h>  // TMPFS_MAGIC
#include <sys/resource.h>
#include <sys/vfs.h>      // statfs
#include <unistd.h>

namespace {

namespace fd = ferry::d2h;
namespace fsd = ferry::sink::detail;
namespace fs = std::filesystem;
using ferry::test::sinkread::read_shard;

template <class E, class F>
std::string message_of(F&& f)
{
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

TEST(SinkUnits, DtypesAreSafetensorsNames)
{
  EXPECT_EQ(fd::dtype_name(fd::dtype::bf16), "BF16");
  EXPECT_EQ(fd::dtype_bytes(fd::dtype::bf16), 2U);
  EXPECT_EQ(fd::dtype_bytes(fd::dtype::i64), 8U);
  EXPECT_EQ(fd::dtype_bytes(fd::dtype::boolean), 1U);
  for (const auto& i : fd::detail::dtype_table) {
    fd::dtype t{};
    ASSERT_TRUE(fd::parse_dtype(i.name, t)) << i.name;
    EXPECT_EQ(t, i.type);
  }
  fd::dtype t{};
  EXPECT_FALSE(fd::parse_dtype("bf16", t));  // exact spelling
  EXPECT_NE(fd::dtype_names().find("F8_E4M3"), std::string::npos);
}

TEST(SinkUnits, SchemaShapesAndRefusals)
{
  fd::hook_schema s;
  s.add(fd::hook_id{3}, "layers.0.q", fd::dtype::bf16, {4, 8}).add(fd::hook_id{1}, "token_ids", "I64");
  ASSERT_EQ(s.size(), 2U);
  EXPECT_EQ(s.hooks()[0].id.value, 1U) << "by increasing id";
  EXPECT_EQ(s.find(fd::hook_id{3})->row_bytes, 64U);
  EXPECT_EQ(s.find(fd::hook_id{1})->row_bytes, 8U);
  EXPECT_EQ(s.find(fd::hook_id{2}), nullptr);
  EXPECT_EQ(s.shape_of(fd::hook_id{3}, 3 * 64), (std::vector<std::uint64_t>{3, 4, 8}));
  EXPECT_EQ(s.shape_of(fd::hook_id{1}, 16), (std::vector<std::uint64_t>{2}));
  EXPECT_EQ(s.shape_of(fd::hook_id{3}, 64, 64), (std::vector<std::uint64_t>{1, 4, 8}));

  // an entry that does not fit: names the hook, the size and the row bytes
  try {
    (void)s.shape_of(fd::hook_id{3}, 100);
    ADD_FAILURE() << "expected entry_shape_error";
  } catch (const fd::entry_shape_error& e) {
    EXPECT_EQ(e.hook().value, 3U);
    EXPECT_EQ(e.size(), 100U);
    EXPECT_EQ(e.row_bytes(), 64U);
    EXPECT_NE(std::string(e.what()).find("expected a multiple of its row bytes 64 ([4, 8] x BF16), got 100 bytes"),
              std::string::npos) << e.what();
  }
  EXPECT_NE(message_of<fd::entry_shape_error>([&] { (void)s.shape_of(fd::hook_id{9}, 8); }).find("hook 9 (8 bytes)"),
            std::string::npos);
  EXPECT_NE(message_of<fd::entry_shape_error>([&] { (void)s.shape_of(fd::hook_id{3}, 128, 32); })
              .find("got capture_rows rows of 32 bytes"), std::string::npos);

  // invalid schemas: each a schema_error saying what, which hook, expected vs got
  const auto refuse = [](auto&& f, const char* want) {
    const std::string m = message_of<fd::schema_error>(f);
    EXPECT_NE(m.find(want), std::string::npos) << m;
    EXPECT_NE(m.find("hook_schema.hpp:"), std::string::npos) << "file:line: " << m;
  };
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{7}, "", fd::dtype::f32); }, "hook 7: expected a non-empty name");
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{7}, "token_ids", fd::dtype::f32); },
         "expected unique hook names, got \"token_ids\" for hook 1 and hook 7");
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{1}, "x", fd::dtype::f32); }, "got hook 1 twice");
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{7}, "x", "float32"); }, "expected a dtype among F64, F32");
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{7}, "x", fd::dtype::f32, {4, 0}); },
         "expected row dimensions >= 1, got 0 at dimension 1 of [4, 0]");
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{7}, "x", fd::dtype::f32, {1ULL << 32, 1ULL << 31}); },
         "expected a row of at most 2^64 - 1 bytes");
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{7}, "a#1", fd::dtype::f32); }, "without control characters or '#'");
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{7}, "a\nb", fd::dtype::f32); }, "\"a\\x0ab\"");
  refuse([&] { fd::hook_schema{s}.add(fd::hook_id{7}, "a\xff", fd::dtype::f32); }, "expected a UTF-8 name (it is written into JSON), got byte 0xff at 1");
  EXPECT_NO_THROW(fd::hook_schema{s}.add(fd::hook_id{7}, "couche.\xc3\xa9t\xc3\xa9", fd::dtype::f32));
  EXPECT_EQ(s.size(), 2U);
}

// A reduced hook (capture_reduced): named by its reducer and the rows it reduces, it holds the reducer's records
// (U8 [record_bytes]); the shm schema region and the run index carry the reducer, and the region decodes to the
// same hook. A reducer the rows cannot take is a schema_error.
TEST(SinkUnits, AReducedHookIsRecordsAndTravelsWithItsReducer)
{
  fd::hook_schema s;
  s.add(fd::hook_id{0}, "logits.top", "topk(64)", {151936}).add(fd::hook_id{2}, "resid", fd::dtype::bf16, {8});
  s.add(fd::hook_id{1}, "resid.fp8", "fp8_e4m3", {2, 5});
  const fd::hook_spec& top = *s.find(fd::hook_id{0});
  EXPECT_EQ(top.type, fd::dtype::u8);
  EXPECT_EQ(top.row_shape, std::vector<std::uint64_t>{512});
  EXPECT_EQ(top.row_bytes, 512U);
  EXPECT_EQ(top.reduce, "topk(64)");
  EXPECT_EQ(top.reduce_width, 151936U);
  EXPECT_EQ(s.find(fd::hook_id{1})->row_bytes, 4U + 12U);  // scale + 10 codes padded to 12
  EXPECT_EQ(s.shape_of(fd::hook_id{0}, 3 * 512, 512), (std::vector<std::uint64_t>{3, 512}));
  const auto region = fsd::shm::encode_schema(s, "t");
  const fd::hook_schema back = fsd::shm::decode_schema(region, "t");
  ASSERT_EQ(back.size(), 3U);
  for (const auto& h : s.hooks()) {
    const fd::hook_spec& b = *back.find(h.id);
    EXPECT_EQ(b.name, h.name);
    EXPECT_EQ(b.type, h.type);
    EXPECT_EQ(b.row_shape, h.row_shape);
    EXPECT_EQ(b.reduce, h.reduce);
    EXPECT_EQ(b.reduce_width, h.reduce_width);
  }
  const auto dir = std::filesystem::temp_directory_path() / ("ferry_reduced_index_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  fsd::run_index idx{dir, s, false};
  idx.write(true, "");
  std::ifstream in{dir / "index.json"};
  const std::string json{std::istreambuf_iterator<char>{in}, {}};
  EXPECT_NE(json.find("\"name\":\"logits.top\",\"dtype\":\"U8\",\"row_shape\":[512],\"reduce\":\"topk(64)\","
                      "\"width\":151936"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"name\":\"resid\",\"dtype\":\"BF16\",\"row_shape\":[8],\"reduce\""), std::string::npos);
  std::filesystem::remove_all(dir);
  const auto refuse = [](auto&& f, const char* want) {
    const std::string m = message_of<fd::schema_error>(f);
    EXPECT_NE(m.find(want), std::string::npos) << m;
  };
  refuse([&] { fd::hook_schema{}.add(fd::hook_id{0}, "x", "topk(9)", {8}); },
         "expected topk(9) of rows of 1 to 2^31 - 1 elements (topk: k <= min(width, 1024)), got rows of [8]");
  refuse([&] { fd::hook_schema{}.add(fd::hook_id{0}, "x", "topk(0)", {8}); }, "got rows of [8]");
  refuse([&] { fd::hook_schema{}.add(fd::hook_id{0}, "x", "mean", {1ULL << 31}); }, "got rows of [2147483648]");
  refuse([&] { fd::hook_schema{}.add(fd::hook_id{0}, "x", "median", {8}); }, "or a reducer (topk(K), fp8_e4m3");
}

// A tensor-parallel hook (hook_schema::shard): the slice is checked (a rank past the world, a dimension outside the
// row, a slice past the whole extent, a reduced or unknown hook: schema_error) and written into the run index.
TEST(SinkUnits, AShardedHookCarriesItsSliceIntoTheRunIndex)
{
  fd::hook_schema s;
  s.add(fd::hook_id{0}, "mlp.act", fd::dtype::bf16, {4, 768}).add(fd::hook_id{1}, "resid", fd::dtype::bf16, {1024});
  s.add(fd::hook_id{2}, "top", "topk(2)", {8});
  s.shard(fd::hook_id{0}, {4, 1, 1, 768, 3072});
  EXPECT_EQ(s.find(fd::hook_id{0})->shard, (fd::shard_layout{4, 1, 1, 768, 3072}));
  EXPECT_EQ(s.find(fd::hook_id{1})->shard.world, 0U);
  const auto dir = std::filesystem::temp_directory_path() / ("ferry_sharded_index_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  fsd::run_index{dir, s, false}.write(true, "");
  std::ifstream in{dir / "index.json"};
  const std::string json{std::istreambuf_iterator<char>{in}, {}};
  EXPECT_NE(json.find("\"row_shape\":[4,768],\"shard\":{\"world\":4,\"rank\":1,\"dim\":1,\"offset\":768,"
                      "\"full\":3072}"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"row_shape\":[1024],\"shard\""), std::string::npos) << json;
  std::filesystem::remove_all(dir);
  const fd::hook_schema back = fsd::shm::decode_schema(fsd::shm::encode_schema(s, "t"), "t");  // the shm region
  EXPECT_EQ(back.find(fd::hook_id{0})->shard, (fd::shard_layout{4, 1, 1, 768, 3072}));
  EXPECT_EQ(back.find(fd::hook_id{1})->shard.world, 0U);
  EXPECT_EQ(back.find(fd::hook_id{2})->reduce, "topk(2)");
  fd::shard_layout l;
  EXPECT_TRUE(fsd::shm::parse_shard("2,1,0,8,16", l));
  EXPECT_EQ(l, (fd::shard_layout{2, 1, 0, 8, 16}));
  for (const char* bad : {"", "2,1,0,8", "2,1,0,8,16,", "2,1,0,x,16", "0,0,0,0,1", "4294967296,0,0,0,1", ",1,0,8,16"}) {
    EXPECT_FALSE(fsd::shm::parse_shard(bad, l)) << bad;
  }
  const auto refuse = [&](fd::hook_id h, fd::shard_layout l, const char* want) {
    const std::string m = message_of<fd::schema_error>([&] { fd::hook_schema{s}.shard(h, l); });
    EXPECT_NE(m.find(want), std::string::npos) << m;
  };
  refuse(fd::hook_id{0}, {4, 4, 1, 0, 3072}, "got rank 4 of 4, dim 1, offset 0, full 3072");
  refuse(fd::hook_id{0}, {0, 0, 1, 0, 3072}, "got rank 0 of 0");
  refuse(fd::hook_id{0}, {4, 0, 2, 0, 3072}, "expected rank < world, dim < 2 and offset + row_shape[dim] <= full");
  refuse(fd::hook_id{0}, {4, 3, 1, 2400, 3072}, "(row_shape [4, 768]), got rank 3 of 4, dim 1, offset 2400");
  refuse(fd::hook_id{2}, {2, 0, 0, 0, 64}, ", not a reduced hook");
  refuse(fd::hook_id{9}, {2, 0, 0, 0, 64}, "expected a hook of the schema, got hook 9");
}

TEST(SinkUnits, JsonStringsAreEscaped)
{
  EXPECT_EQ(fsd::json::string("a\"b\\c\n\x01/é"), "\"a\\\"b\\\\c\\u000a\\u0001/é\"");
  std::string a;
  fsd::json::append_array(a, {1, 22, 333});
  EXPECT_EQ(a, "[1,22,333]");
}

TEST(SinkUnits, Crc32IsZlibs)
{
  EXPECT_EQ(fsd::crc32("123456789", 9), 0xCBF43926U);
  EXPECT_EQ(fsd::crc32("", 0), 0U);
  std::string s(1000, '\0');
  for (std::size_t i = 0; i < s.size(); ++i) { s[i] = static_cast<char>(i * 7); }
  EXPECT_EQ(fsd::crc32(s.data() + 333, s.size() - 333, fsd::crc32(s.data(), 333)), fsd::crc32(s.data(), s.size()));
}

/// The folding CRC (PCLMULQDQ, where the CPU has it) and the tables agree on every length around its 64-byte
/// minimum and 16-byte steps, at every alignment, continuing from a nonzero CRC.
TEST(SinkUnits, Crc32FoldingAgreesWithTheTables)
{
  std::vector<unsigned char> b(4096 + 64);
  std::uint32_t x = 12345;
  for (auto& c : b) { c = static_cast<unsigned char>((x = x * 1103515245U + 12345U) >> 16); }
  int bad = 0;
  for (std::size_t off = 0; off < 17; ++off) {
    for (std::size_t n : {0, 1, 15, 16, 63, 64, 65, 79, 80, 127, 128, 129, 255, 1000, 4096}) {
      for (std::uint32_t seed : {0U, 0xDEADBEEFU}) {
        bad += fsd::crc32(b.data() + off, n, seed) != fsd::crc32(b.data() + off, n, seed, /*portable=*/true);
      }
    }
  }
  EXPECT_EQ(bad, 0) << (fsd::crc32_clmul_available() ? "folding" : "tables only") << " path";
}

/// crc32_combine joins pieces computed apart (a lent entry's CRC, on an I/O thread) into the CRC of the whole:
/// every split of a buffer, empty pieces included, and pieces past 2^32 bytes by their length's high bits.
TEST(SinkUnits, Crc32CombineJoinsPiecesComputedApart)
{
  std::vector<unsigned char> b(3000);
  std::uint32_t x = 777;
  for (auto& c : b) { c = static_cast<unsigned char>((x = x * 1103515245U + 12345U) >> 16); }
  int bad = 0;
  for (std::size_t cut : {0, 1, 7, 64, 1000, 2999, 3000}) {
    const std::uint32_t a = fsd::crc32(b.data(), cut), c = fsd::crc32(b.data() + cut, b.size() - cut);
    bad += fsd::crc32_combine(a, c, b.size() - cut) != fsd::crc32(b.data(), b.size());
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(fsd::crc32_combine(0x12345678U, 0, 0), 0x12345678U) << "an empty piece leaves the CRC";
  // lengths past 2^32 (no buffer that large): the join is associative, combine(combine(a, b, n), c, m) ==
  // combine(a, combine(b, c, m), n + m), which holds only when x^(8 len) is right for every bit of the lengths
  const std::uint32_t a = 0xCAFEF00DU, bb = 0x0BADBEEFU, c = 0x600DF00DU;
  const std::uint64_t n = (std::uint64_t{1} << 33) + 5, m = (std::uint64_t{1} << 32) + 3;
  EXPECT_EQ(fsd::crc32_combine(fsd::crc32_combine(a, bb, n), c, m),
            fsd::crc32_combine(a, fsd::crc32_combine(bb, c, m), n + m));
}

TEST(SinkUnits, RunFilesAreRecognized)
{
  for (const char* n : {"index.json", ".index.json.tmp", "shard-00000.safetensors", ".shard-00012.safetensors.tmp",
                        ".shard-123456.safetensors.moved.tmp"}) {
    EXPECT_TRUE(fsd::is_run_file(n)) << n;
  }
  for (const char* n : {"notes.txt", "shard-1.safetensors", "shard-00000.safetensors.bak", "model.safetensors", "index.json.bak"}) {
    EXPECT_FALSE(fsd::is_run_file(n)) << n;
  }
}

/// The process's file size limit lowered to `bytes` for the scope (SIGXFSZ ignored): a write past it fails with
/// EFBIG, as a write to a full disk fails; both are restored at the scope's end. ok(): every step took.
class file_size_limit {
 public:
  explicit file_size_limit(rlim_t bytes)
  {
    struct sigaction ign{};
    ign.sa_handler = SIG_IGN;
    ok_ = ::getrlimit(RLIMIT_FSIZE, &old_) == 0 && ::sigaction(SIGXFSZ, &ign, &prev_) == 0;
    struct rlimit lim = old_;
    lim.rlim_cur = bytes;
    ok_ = ok_ && ::setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  file_size_limit(const file_size_limit&) = delete;
  file_size_limit& operator=(const file_size_limit&) = delete;
  ~file_size_limit()
  {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::sigaction(SIGXFSZ, &prev_, nullptr);
  }
  [[nodiscard]] bool ok() const noexcept { return ok_; }

 private:
  struct rlimit old_{};
  struct sigaction prev_{};
  bool ok_{false};
};

class ShardFile : public ::testing::Test {
 protected:
  void SetUp() override
  {
    dir = fs::temp_directory_path() / ("ferry_shard_file_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  static std::vector<std::byte> bytes(std::size_t n, int seed)
  {
    std::vector<std::byte> b(n);
    for (std::size_t i = 0; i < n; ++i) { b[i] = static_cast<std::byte>(i * 13 + static_cast<std::size_t>(seed)); }
    return b;
  }
  static std::vector<std::uint8_t> u8(const std::vector<std::byte>& b)
  {
    return {reinterpret_cast<const std::uint8_t*>(b.data()), reinterpret_cast<const std::uint8_t*>(b.data()) + b.size()};
  }
  /// The io_error that writing 16 MiB (64 pieces of 256 KiB) into a durable sequential_file at `p` (through `w`
  /// when given), then closing it, throws: its errno and message (0 and "": none).
  static std::pair<int, std::string> write_16_mib(const fs::path& p, const ferry::sink::file_writer* w = nullptr)
  {
    try {
      auto f = w != nullptr ? ferry::sink::sequential_file{p, true, *w} : ferry::sink::sequential_file{p, true};
      for (int i = 0; i < 64; ++i) { f.write(bytes(std::size_t{1} << 18, i)); }
      f.close();
    } catch (const ferry::sink::io_error& x) {
      return {x.code(), x.what()};
    }
    return {0, ""};
  }
  /// The pipeline tests' script on two shards through `pipe` (`direct`: O_DIRECT asked for; `lend_min` not 0: both
  /// files must lend): a forward, one rolled back, one of two tensors (the second, 3 bytes, below any lend_min), an
  /// open one moved to the next shard, which takes one more; each append's owner from `owner()` (null: copied). The
  /// data sizes, CRC-32s and every byte read back from the published shards are checked.
  void pipeline_script(fsd::write_pipeline& pipe, bool direct, const std::function<std::shared_ptr<void>()>& owner,
                       std::size_t lend_min)
  {
    const auto a = bytes(10000, 1), b = bytes(20000, 2), c = bytes(5000, 3), d = bytes(3, 4), e = bytes(9000, 5);
    {
      fsd::shard_file s{dir, 0, 100, &pipe, direct}, next{dir, 1, 5000, &pipe, direct};
      if (lend_min != 0) { ASSERT_TRUE(s.lends() && next.lends()); }
      s.append("0/a", fd::dtype::u8, {10000}, a, owner(), lend_min);
      s.commit(0);
      s.append("1/b", fd::dtype::u8, {20000}, b, owner(), lend_min);  // written to the file, rolled back to 10000
      s.rollback();
      s.append("2/c", fd::dtype::u8, {5000}, c, owner(), lend_min);
      s.append("2/d", fd::dtype::u8, {3}, d, owner(), lend_min);
      s.commit(2);
      s.resolve_crcs();  // lent entries' CRCs come from the I/O threads
      EXPECT_EQ(s.forwards().at(1).crc, fsd::crc32(d.data(), d.size(), fsd::crc32(c.data(), c.size())));
      s.append("3/e", fd::dtype::u8, {9000}, e, owner(), lend_min);
      s.move_pending(next);
      std::uint64_t rel = 0;
      EXPECT_EQ(s.publish("{}", true, rel), 15003U);
      next.append("3/c", fd::dtype::u8, {5000}, c, owner(), lend_min);
      next.commit(3);
      next.resolve_crcs();
      EXPECT_EQ(next.forwards().at(0).crc, fsd::crc32(c.data(), c.size(), fsd::crc32(e.data(), e.size())));
      EXPECT_EQ(next.publish("{}", true, rel), 14000U);
    }
    const auto s0 = read_shard(dir / "shard-00000.safetensors");
    ASSERT_EQ(s0.tensors.size(), 3U);
    EXPECT_EQ(s0.tensors[0].bytes, u8(a));
    EXPECT_EQ(s0.tensors[1].bytes, u8(c));
    EXPECT_EQ(s0.tensors[2].bytes, u8(d));
    const auto s1 = read_shard(dir / "shard-00001.safetensors");
    ASSERT_EQ(s1.tensors.size(), 2U);
    EXPECT_EQ(s1.tensors[0].bytes, u8(e));
    EXPECT_EQ(s1.tensors[1].bytes, u8(c));
  }
  fs::path dir;
};

TEST_F(ShardFile, PublishRollbackAndMoveToTheNextShard)
{
  const auto a = bytes(40, 1), b = bytes(24, 2), c = bytes(16, 3), d = bytes(8, 4);
  {
    fsd::shard_file s{dir, 0, 4096}, next{dir, 1, 4096};
    s.append("0/a", fd::dtype::f32, {10}, a);
    s.commit(0);
    s.append("1/b", fd::dtype::u8, {24}, b);
    s.rollback();  // forward 1 dropped
    s.append("2/c", fd::dtype::f32, {2, 2}, c);
    s.append("2/d", fd::dtype::i64, {1}, d);
    s.move_pending(next);  // forward 2 goes to the next shard whole
    EXPECT_TRUE(fs::exists(dir / ".shard-00000.safetensors.tmp"));
    std::uint64_t rel = 0;
    EXPECT_EQ(s.publish("{\"format\":\"pt\"}", true, rel), 40U);
    EXPECT_EQ(rel, 0U);
    next.commit(2);
    next.resolve_crcs();
    EXPECT_EQ(next.forwards().at(0).crc, fsd::crc32(d.data(), d.size(), fsd::crc32(c.data(), c.size())));
    EXPECT_EQ(next.publish("{}", false, rel), 24U);
  }
  EXPECT_FALSE(fs::exists(dir / ".shard-00000.safetensors.tmp")) << "renamed";
  const auto s0 = read_shard(dir / "shard-00000.safetensors");
  ASSERT_EQ(s0.tensors.size(), 1U);
  EXPECT_EQ(s0.tensors[0].name, "0/a");
  EXPECT_EQ(s0.tensors[0].bytes, u8(a));
  EXPECT_EQ(s0.metadata.at("format"), "pt");
  const auto s1 = read_shard(dir / "shard-00001.safetensors");
  ASSERT_EQ(s1.tensors.size(), 2U);
  EXPECT_EQ(s1.tensors[0].name, "2/c");
  EXPECT_EQ(s1.tensors[0].shape, (std::vector<std::uint64_t>{2, 2}));
  EXPECT_EQ(s1.tensors[0].bytes, u8(c));
  EXPECT_EQ(s1.tensors[1].dtype, "I64");
  EXPECT_EQ(s1.tensors[1].bytes, u8(d));
}

TEST_F(ShardFile, AHeaderGuessTooSmallOrFarTooLargeMovesTheDataOnce)
{
  const auto a = bytes(64, 5);
  {
    fsd::shard_file s{dir, 0, 64};  // far too small for 200 tensors' records
    for (int i = 0; i < 200; ++i) { s.append("0/t" + std::to_string(i), fd::dtype::u8, {64}, a); }
    s.commit(0);
    std::uint64_t rel = 0;
    (void)s.publish("{}", false, rel);
    EXPECT_EQ(rel, 1U);
  }
  {
    fsd::shard_file s{dir, 1, 8U << 20};  // 8 MiB of padding for 64 bytes
    s.append("0/x", fd::dtype::u8, {64}, a);
    s.commit(0);
    std::uint64_t rel = 0;
    (void)s.publish("{}", false, rel);
    EXPECT_EQ(rel, 1U);
  }
  const auto s0 = read_shard(dir / "shard-00000.safetensors");
  ASSERT_EQ(s0.tensors.size(), 200U);
  EXPECT_EQ(s0.tensors[199].bytes, u8(a));
  const auto s1 = read_shard(dir / "shard-00001.safetensors");
  EXPECT_LT(fs::file_size(dir / "shard-00001.safetensors"), 1U << 17) << "compacted";
  EXPECT_EQ(s1.tensors.at(0).bytes, u8(a));
}

TEST_F(ShardFile, AnUnpublishedShardLeavesNothing)
{
  {
    fsd::shard_file s{dir, 0, 4096};
    s.append("0/a", fd::dtype::u8, {3}, bytes(3, 0));
    s.commit(0);
  }
  EXPECT_TRUE(fs::is_empty(dir));
}

/// Through the write pipeline (an I/O thread, O_DIRECT asked for): tensors crossing its buffers' boundaries, a
/// rollback to inside a buffer already written (the partial block read back), a move of the open forward to the
/// next shard (flush, copy, reposition), every byte read back from the published shards.
TEST_F(ShardFile, ThePipelineWritesWhatTheSynchronousPathWrites)
{
  fsd::write_pipeline pipe{8192, 2};  // two 8 KiB buffers: every step below crosses them
  pipeline_script(pipe, true, [] { return std::shared_ptr<void>{}; }, 0);
}

/// Entries lent to the pipeline (shard_file::append with an owner, at least lend_min bytes, on a buffered file) are
/// written from the caller's memory: the shard holds what copies would have written, through a rollback over lent
/// bytes, a forward moved to the next shard and pieces of every alignment among copied ones, with the same CRC-32.
/// Each lent entry's owner is released by an I/O thread (never the caller's: no copy was made), after its write;
/// an entry below lend_min, or on a file with O_DIRECT, is copied and its owner released inside append().
TEST_F(ShardFile, LentAppendsWriteWhatCopiesWrite)
{
  fsd::write_pipeline pipe{8192, 2};
  std::mutex mu;
  std::vector<std::thread::id> released;  // the thread that released each owner
  auto owner = [&] {
    return std::shared_ptr<void>(static_cast<void*>(&mu), [&](void*) {  // points at something: an owner
      const std::lock_guard lk{mu};
      released.push_back(std::this_thread::get_id());
    });
  };
  pipeline_script(pipe, false, owner, 4096);
  const auto me = std::this_thread::get_id();
  ASSERT_EQ(released.size(), 6U);
  EXPECT_EQ(std::count(released.begin(), released.end(), me), 1) << "only d (3 bytes) was copied";
  const auto a = bytes(10000, 1);  // outlives the shard below (a lent write would read it until then)
  {  // O_DIRECT where the filesystem takes it: nothing is lent
    released.clear();
    fsd::shard_file s{dir, 2, 100, &pipe, true};
    s.append("4/a", fd::dtype::u8, {10000}, a, owner(), 4096);
    if (!s.lends()) { EXPECT_EQ(released, std::vector<std::thread::id>{me}); }
  }
}

/// A write that fails on the I/O thread (here: the file's size limit, EFBIG) is thrown on the writer's thread by
/// its next call, as an io_error naming the file; the shard is not published. Lent pieces (write_lent) queued
/// behind the failed write are dropped and their owners released: none is kept past the pipeline.
TEST_F(ShardFile, AWriteErrorOnTheIoThreadReachesTheWriter)
{
  for (const bool lend : {false, true}) {  // copied into buffers (O_DIRECT where it opens), or lent (buffered)
    SCOPED_TRACE(lend ? "lent" : "copied");
    int code = 0;
    int made = 0;
    std::atomic<int> released{0};
    {
      const file_size_limit limit{1U << 16};
      ASSERT_TRUE(limit.ok());
      fsd::write_pipeline pipe{8192, 2};
      try {
        fsd::shard_file s{dir, 0, 100, &pipe, !lend};
        for (int i = 0; i < 64; ++i) {
          const std::shared_ptr<std::vector<std::byte>> data{new std::vector<std::byte>(bytes(4096, i)),
                                                             [&](std::vector<std::byte>* p) {
                                                               delete p;
                                                               ++released;
                                                             }};
          ++made;
          s.append("0/t" + std::to_string(i), fd::dtype::u8, {4096}, *data, data, lend ? 1 : 0);
        }
        s.commit(0);
        std::uint64_t rel = 0;
        (void)s.publish("{}", true, rel);
      } catch (const ferry::sink::io_error& x) {
        code = x.code();
        EXPECT_NE(std::string{x.what()}.find(".shard-00000.safetensors.tmp"), std::string::npos) << x.what();
      }
    }
    EXPECT_EQ(code, EFBIG);
    EXPECT_EQ(released.load(), made) << "every lent piece given back: written, failed or dropped after the error";
    EXPECT_TRUE(fs::is_empty(dir)) << "the temporary removed, nothing published";
  }
}

/// sink::sequential_file (ferry.arrow's shards): pieces of every alignment, one longer than the pipeline's 16 MiB
/// buffer, through O_DIRECT (durable) and buffered writes: the file is every byte in order, size() their sum, and
/// times() counts the copies (more than 16 MiB of them: above zero); a write after close() is a logic_error, a second
/// close() nothing.
TEST_F(ShardFile, ASequentialFileHoldsEveryByteInOrder)
{
  for (const bool durable : {true, false}) {
    SCOPED_TRACE(durable ? "durable" : "buffered");
    const fs::path p = dir / (durable ? "d.bin" : "b.bin");
    std::vector<std::uint8_t> want;
    ferry::sink::sequential_file f{p, durable};
    int seed = 0;
    for (const std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{5000},
                                (std::size_t{16} << 20) + 3, std::size_t{7}, std::size_t{100000}}) {
      const auto b = bytes(n, seed++);
      f.write(b);
      const auto u = u8(b);
      want.insert(want.end(), u.begin(), u.end());
    }
    EXPECT_EQ(f.size(), want.size());
    EXPECT_GT(f.times().copy_seconds, 0.0);
    EXPECT_GE(f.times().wait_seconds, 0.0);
    f.close();
    EXPECT_TRUE(f.closed());
    EXPECT_NO_THROW(f.close());
    EXPECT_THROW(f.write(bytes(1, 9)), ferry::logic_error);
    std::ifstream in{p, std::ios::binary};
    const std::vector<std::uint8_t> got{std::istreambuf_iterator<char>(in), {}};
    EXPECT_EQ(got.size(), want.size());
    EXPECT_TRUE(got == want) << "the file's bytes differ from the ones written";
  }
}

/// A write of a sequential_file that fails on the I/O thread (the size limit: EFBIG) is an io_error naming the file
/// at the next write() or at close().
TEST_F(ShardFile, ASequentialFileWriteErrorReachesTheWriter)
{
  std::pair<int, std::string> e;
  {
    const file_size_limit limit{1U << 20};
    ASSERT_TRUE(limit.ok());
    e = write_16_mib(dir / "big.bin");  // 16 MiB past a 1 MiB limit
  }
  EXPECT_EQ(e.first, EFBIG);
  EXPECT_NE(e.second.find("big.bin"), std::string::npos) << e.second;
}

/// Files of one file_writer (ferry.arrow's shards): while one file is closed on another thread (its last partial
/// block, its sync), the next is written through the same buffers and I/O threads; each file holds its own bytes in
/// order (a buffer of one file's write never carries another's bytes, a close drains its own writes only), and
/// times() is the writer's, the same through each file.
/// Also through a tuned writer (3 I/O threads, 5 buffers of 3 pages: writes that cut every piece at odd places).
TEST_F(ShardFile, FilesOfOneWriterHoldTheirOwnBytesWhileOneClosesAndTheNextIsWritten)
{
  const ferry::sink::write_tuning five{2, 6, std::size_t{16} << 20};  // 5 open files at once
  for (const auto& [durable, tuning] : {std::pair{true, five}, std::pair{false, five},
                                        std::pair{true, ferry::sink::write_tuning{3, 5, 3 * 4096}}}) {
    SCOPED_TRACE(std::string{durable ? "durable" : "buffered"} + ", write_bytes " + std::to_string(tuning.write_bytes));
    const ferry::sink::file_writer w{tuning};
    std::vector<std::vector<std::uint8_t>> want(4);
    std::vector<std::thread> closers;
    std::vector<std::unique_ptr<ferry::sink::sequential_file>> files;
    int seed = 100;
    for (std::size_t k = 0; k < want.size(); ++k) {
      files.push_back(std::make_unique<ferry::sink::sequential_file>(dir / ("s" + std::to_string(k)), durable, w));
      for (const std::size_t n : {(std::size_t{16} << 20) + 4097, std::size_t{3}, std::size_t{40000} * (k + 1)}) {
        const auto b = bytes(n, seed++);
        files.back()->write(b);
        const auto u = u8(b);
        want[k].insert(want[k].end(), u.begin(), u.end());
      }
      closers.emplace_back([f = files.back().get()] { f->close(); });  // while the next file is written
    }
    for (auto& t : closers) { t.join(); }
    EXPECT_GT(w.times().copy_seconds, 0.0);
    for (std::size_t k = 0; k < want.size(); ++k) {
      EXPECT_TRUE(files[k]->closed());
      EXPECT_EQ(files[k]->times().copy_seconds, w.times().copy_seconds) << "a file's times are its writer's";
      std::ifstream in{dir / ("s" + std::to_string(k)), std::ios::binary};
      const std::vector<std::uint8_t> got{std::istreambuf_iterator<char>(in), {}};
      EXPECT_EQ(got.size(), want[k].size()) << "file " << k;
      EXPECT_TRUE(got == want[k]) << "file " << k << ": its bytes differ from the ones written";
    }
  }
}

/// A file_writer's open files each may hold a buffer they fill: with 5 open, a sixth would wait forever for a buffer
/// that only a close frees, so it is a logic_error naming the file, and nothing is created; a closed (or destroyed)
/// file frees its place.
TEST_F(ShardFile, AWriterRefusesASixthOpenFile)
{
  const ferry::sink::file_writer w{{.io_threads = 2, .write_buffers = 6}};
  std::vector<std::unique_ptr<ferry::sink::sequential_file>> open;
  for (int k = 0; k < 5; ++k) {
    open.push_back(std::make_unique<ferry::sink::sequential_file>(dir / ("o" + std::to_string(k)), false, w));
    open.back()->write(bytes(5000, k));  // each holds a buffer it fills
  }
  try {
    ferry::sink::sequential_file sixth{dir / "sixth", false, w};
    FAIL() << "a sixth open file was made";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("sixth"), std::string::npos) << e.what();
    EXPECT_NE(std::string{e.what()}.find("at most 5 open files"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "sixth"));
  open[0]->close();
  ferry::sink::sequential_file after_close{dir / "after-close", false, w};
  open[1].reset();
  ferry::sink::sequential_file after_destroy{dir / "after-destroy", false, w};
  after_destroy.write(bytes(100, 9));
  after_destroy.close();
  EXPECT_EQ(fs::file_size(dir / "after-destroy"), 100U);
}

/// A file_writer's tuning out of range is a logic_error saying which value (write_pipeline::check_shape, the
/// safetensors sink's rule); a writer of 3 buffers takes 2 open files, not a third.
TEST_F(ShardFile, AWriterChecksItsTuning)
{
  for (const ferry::sink::write_tuning bad :
       {ferry::sink::write_tuning{.io_threads = 0}, ferry::sink::write_tuning{.io_threads = 6, .write_buffers = 6},
        ferry::sink::write_tuning{.write_bytes = 1024}, ferry::sink::write_tuning{.write_buffers = 257}}) {
    try {
      const ferry::sink::file_writer w{bad};
      FAIL() << "tuning " << bad.io_threads << ", " << bad.write_buffers << ", " << bad.write_bytes << " taken";
    } catch (const ferry::logic_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("file_writer: expected tuning io_threads in [1, 64], write_buffers in (io_threads, 256]"),
                std::string::npos) << what;
      EXPECT_NE(what.find("got " + std::to_string(bad.io_threads) + ", " + std::to_string(bad.write_buffers)),
                std::string::npos) << what;
    }
  }
  EXPECT_EQ(ferry::sink::file_writer{}.max_open(), 3U) << "the default: an Arrow shard written while two finish";
  const ferry::sink::file_writer w{{.io_threads = 1, .write_buffers = 3, .write_bytes = 4096}};
  EXPECT_EQ(w.max_open(), 2U);
  ferry::sink::sequential_file a{dir / "a", false, w}, b{dir / "b", false, w};
  try {
    ferry::sink::sequential_file c{dir / "c", false, w};
    FAIL() << "a third open file of a writer of 3 buffers was made";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("at most 2 open files"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "c"));
  a.write(bytes(10000, 1));
  a.close();
  EXPECT_EQ(fs::file_size(dir / "a"), 10000U);
}

/// The first write error of one file of a file_writer ends the writer: the next file's write throws it (EFBIG), as
/// a run of shards ends at a full disk. Whether the failed write was a full buffer's on an I/O thread (16 MiB
/// buffers) or the file's tail written at its close (the default's 64 MiB: the 16 MiB file never fills one).
TEST_F(ShardFile, AWriteErrorOfOneFileEndsItsWriter)
{
  for (const std::size_t buffer : {std::size_t{16} << 20, ferry::sink::write_tuning{}.write_bytes}) {
    SCOPED_TRACE("buffers of " + std::to_string(buffer >> 20) + " MiB");
    std::pair<int, std::string> first;
    std::pair<int, std::string> next;
    {
      const file_size_limit limit{1U << 20};
      ASSERT_TRUE(limit.ok());
      const ferry::sink::file_writer w{{.write_bytes = buffer}};
      first = write_16_mib(dir / "big.bin", &w);
      next = write_16_mib(dir / "next.bin", &w);
    }
    EXPECT_EQ(first.first, EFBIG);
    EXPECT_EQ(next.first, EFBIG) << "a writer whose file failed went on writing the next file";
    EXPECT_NE(next.second.find("big.bin"), std::string::npos) << "the writer's first error: " << next.second;
  }
}

/// tmpfs takes O_DIRECT (Linux 6.6 and later) but copies into its page cache either way: a shard there is written
/// buffered, so that its large entries are lent from their staging (shard_file::lends) rather than copied into a
/// write buffer first (perf journal session 34). Skipped where /dev/shm is not tmpfs.
TEST(SinkUnits, ShardsOnTmpfsAreWrittenBufferedAndLendAndOneWriteAtATime)
{
  struct statfs st {};
  const fs::path shm = "/dev/shm";
  if (::statfs(shm.c_str(), &st) != 0 || st.f_type != TMPFS_MAGIC) { GTEST_SKIP() << "/dev/shm is not tmpfs"; }
  const fs::path d = shm / ("ferry_tmpfs_" + std::to_string(::getpid()));
  fs::create_directories(d);
  {
    { auto f = fsd::file::create(d / "probe"); }
    EXPECT_FALSE(fsd::file::open_direct(d / "probe").is_open()) << "O_DIRECT kept on tmpfs";
    fsd::write_pipeline pipe{4096, 2, 1};
    const fsd::shard_file s{d, 0, 100, &pipe, true};
    EXPECT_TRUE(s.lends()) << "a shard on tmpfs with direct writes asked for does not lend";
  }
  EXPECT_EQ(fsd::open_shards_of({}, d), 2U) << "tmpfs's default: two shard files written at once";
  EXPECT_EQ(fsd::open_shards_of({.open_shards = 3}, d), 3U);
  if (!fsd::file::dir_on_tmpfs(fs::current_path())) { EXPECT_EQ(fsd::open_shards_of({}, fs::current_path()), 1U); }
  // Writes there are memory copies under the file's inode lock: the pipeline keeps one in flight a tmpfs file (four
  // I/O threads, 12 writes of 2 MiB to each of two files queued at once, interleaved), two files' at once at most,
  // and every byte lands where it was written.
  {
    const auto f = fsd::file::create(d / "serial0");
    const auto g = fsd::file::create(d / "serial1");
    ASSERT_TRUE(f.serial_writes() && g.serial_writes());
    constexpr std::size_t n = 12, mib2 = std::size_t{2} << 20;
    fsd::write_pipeline pipe{mib2, 2 * n, 4};
    fsd::write_pipeline::writes wf, wg;
    std::vector<std::uint8_t> want_f, want_g;
    std::vector<std::byte*> bufs;
    for (std::size_t k = 0; k < 2 * n; ++k) {
      bufs.push_back(pipe.take());
      std::memset(bufs.back(), static_cast<int>(k + 1), mib2);
      auto& want = k % 2 == 0 ? want_f : want_g;
      want.insert(want.end(), mib2, static_cast<std::uint8_t>(k + 1));
    }
    for (std::size_t k = 0; k < 2 * n; ++k) {
      if (k % 2 == 0) {
        pipe.write(bufs[k], mib2, f, f, k / 2 * mib2, wf);
      } else {
        pipe.write(bufs[k], mib2, g, g, k / 2 * mib2, wg);
      }
    }
    pipe.drain(wf);
    pipe.drain(wg);
    EXPECT_EQ(wf.peak_running, 1U) << "writes of one tmpfs file ran at once";
    EXPECT_EQ(wg.peak_running, 1U) << "writes of one tmpfs file ran at once";
    EXPECT_GE(pipe.peak_serial_running(), 1U);
    EXPECT_LE(pipe.peak_serial_running(), 2U) << "more tmpfs writes at once than files";
    for (const auto& [name, want] : {std::pair{"serial0", &want_f}, std::pair{"serial1", &want_g}}) {
      std::ifstream in{d / name, std::ios::binary};
      const std::vector<std::uint8_t> got{std::istreambuf_iterator<char>(in), {}};
      EXPECT_TRUE(got == *want) << name << ": the file's bytes differ from the ones written";
    }
  }
  fs::remove_all(d);
}

/// A failure that ends the run (shard_writer::abandon, the writer's path on an io_error) still publishes the shards
/// sealed before it whose writes succeeded: with the finisher held, two shards wait sealed (one taken, one queued)
/// when the run is abandoned; once released both are published and listed, and only the open forward is lost.
TEST(SinkUnits, AnAbandonedRunStillPublishesTheShardsSealedBefore)
{
  const fs::path d = fs::temp_directory_path() / ("ferry_abandon_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  {
    fd::hook_schema schema;
    schema.add(fd::hook_id{0}, "x", fd::dtype::u8);
    std::atomic<bool> hold{true};
    fsd::live_counters c;
    fsd::shard_writer w{fsd::writer_options{d, schema, 2 * 4096, false, true, {.open_shards = 1}, &hold}, c};
    const std::vector<std::byte> bytes(4096, std::byte{7});
    for (std::uint64_t f = 0; f < 5; ++f) { w.entry(f, f, fd::hook_id{0}, 1, bytes); }  // shards 0, 1: two each
    std::atomic<bool> abandoned{false};
    std::thread t{[&] {
      w.abandon();  // waits for the held finisher: the sealed shard is not dropped
      abandoned = true;
    }};
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(abandoned.load()) << "abandon() returned with sealed shards not finished";
    hold = false;
    t.join();
    EXPECT_EQ(c.shards_written.load(), 2U) << "a shard sealed before the failure was dropped";
    EXPECT_EQ(c.forwards_written.load(), 4U);
    EXPECT_EQ(c.lost_forwards.load(), 1U);  // forward 4, open in the next shard
    const auto r = ferry::test::sinkread::read_run(d);
    EXPECT_EQ(r.forward_tags, (std::vector<std::uint64_t>{0, 1, 2, 3}));
  }
  fs::remove_all(d);
}

TEST(SinkUnits, VersionIsTheProjectVersion) { EXPECT_EQ(ferry::version, FERRY_PROJECT_VERSION); }

}  // namespace
