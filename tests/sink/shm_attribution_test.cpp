// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's attribution (sink/shm_reader.hpp, src/sink/shm_records.hpp; docs/design/shm_stream.md,
// S2a): what begin_forward gave a forward (tag, requests, user bytes) reaches a reader process per entry unchanged,
// through a record region far smaller than the backlog (records reused, a forward waiting for room); rows_of splits
// a row entry exactly; a record larger than the region is the counted attribution_overflow outcome; a size_overflow
// entry names its reservation; a reader never copies a record that is still being written.
#include "sink/shm_attr_line.hpp"
#include "sink/shm_child.hpp"
#include "src/sink/shm_records.hpp"  // record_bytes_of (src/sink, compiled into ferry::core)

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/sink.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <cstring>
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

class ShmStreamAttribution : public ::testing::Test {
 protected:
  static constexpr std::uint64_t row_bytes = 32, src_rows = 64, max_sel = 16;

  void SetUp() override
  {
    b.set_device(fb::device_id{0});
    name = "test-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::shm_unlink(shm::object_name(name).c_str());
    std::vector<std::uint8_t> rows(src_rows * row_bytes);
    for (std::size_t i = 0; i < rows.size(); ++i) { rows[i] = static_cast<std::uint8_t>(i * 13 + i / row_bytes * 7 + 1); }
    host_src = rows;
    src.emplace(rows.size(), b);
    b.memcpy_async(src->data(), rows.data(), rows.size(), fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
  }
  void TearDown() override { ::shm_unlink(shm::object_name(name).c_str()); }

  [[nodiscard]] fk::shm_stream_config stream_config(std::uint64_t record_bytes) const
  {
    fk::shm_stream_config c;
    c.name = name;
    c.staging_bytes = 256 << 10;
    c.descriptors = 64;
    c.timeout = 5s;
    c.record_bytes = record_bytes;
    return c;
  }
  static fd::config channel_config()
  {
    fd::config c;
    c.ring_bytes = 1 << 16;
    c.publish_every = 4;
    c.timeout = 10s;
    c.tuning.size_slots = 64;
    return c;
  }
  /// The FNV-1a of source rows idx[first, first + n) (what rows_of of a request holding them reads).
  [[nodiscard]] std::uint64_t rows_digest(const std::vector<std::int32_t>& idx, std::uint64_t first, std::uint64_t n) const
  {
    std::vector<std::byte> b;
    for (std::uint64_t j = first; j < first + n; ++j) {
      const auto* r = reinterpret_cast<const std::byte*>(host_src.data()) + idx[j] * row_bytes;
      b.insert(b.end(), r, r + row_bytes);
    }
    return fnv1a(b);
  }
  /// The child's lines up to `stop`: the "attr" lines' fields, and the "what" lines by entry index.
  static std::vector<std::map<std::string, std::string>> attr_until(shm_child& c, const std::string& stop,
                                                                    std::map<std::uint64_t, std::string>* what = nullptr)
  {
    std::vector<std::map<std::string, std::string>> out;
    for (;;) {
      const auto l = c.line();
      if (!l) {
        ADD_FAILURE() << "child: no '" << stop << "' line";
        return out;
      }
      if (l->rfind(stop, 0) == 0) { return out; }
      if (l->rfind("error", 0) == 0) { ADD_FAILURE() << "child: " << *l; }
      if (l->rfind("attr ", 0) == 0) { out.push_back(attr_fields(*l)); }
      if (l->rfind("what ", 0) == 0 && what != nullptr) {
        const auto sp = l->find(' ', 5);
        (*what)[std::stoull(l->substr(5, sp - 5))] = l->substr(sp + 1);
      }
    }
  }

  B b;
  fb::stream<B> s{b};
  std::string name;
  std::vector<std::uint8_t> host_src;
  std::optional<fb::device_buffer<B>> src;
};

/// Forward f of the first test: its metadata (none for f % 6 == 4, a tag only for f % 6 == 5) and row selection.
struct planned {
  fd::forward_meta meta;
  std::vector<std::int32_t> idx;
};
planned plan_forward(std::uint64_t f)
{
  planned p;
  const std::uint64_t kind = f % 6;
  if (kind != 4) { p.meta.tag = 5000 + f; }
  std::uint64_t rows = 3;
  if (kind < 4) {
    rows = 0;
    for (std::uint64_t k = 0; k < 1 + f % 5; ++k) {
      const std::uint64_t n = 1 + (f + k) % 3;
      p.meta.requests.push_back({1000 * f + 7 * k + 1, rows, n});
      rows += n;
    }
    if (kind != 2) {
      for (std::uint64_t i = 0; i < (f % 13 + 1) * 8 - f % 3; ++i) { p.meta.user.push_back(static_cast<std::byte>(f * 31 + i)); }
    }
  }
  for (std::uint64_t j = 0; j < rows; ++j) { p.idx.push_back(static_cast<std::int32_t>((f * 7 + j * 5) % 64)); }
  return p;
}

// 120 forwards through a record region of one page and 64 descriptors, read by a reader process that starts 300 ms
// late, then reads slowly: 32 forwards' records (~6 KB) would be needed at once, so the page is reused many times
// over and forwards wait for record room. Every entry arrives with its
// forward's tag, requests and user bytes as given (none, a tag only, requests without user bytes included), a row
// entry's rows_of(request) holds exactly that request's rows, and a whole entry refuses rows_of. Fails with the
// attribution dropped (meta=0), with a record reused before its entries were released (a record of another forward:
// logic_error in the reader), or with rows_of splitting wrong.
TEST_F(ShmStreamAttribution, EveryEntrysAttributionReachesTheReaderProcessUnchanged)
{
  constexpr std::uint64_t F = 120;
  std::vector<planned> plan;
  std::vector<std::int32_t> all_idx(F * max_sel, 0);
  for (std::uint64_t f = 0; f < F; ++f) {
    plan.push_back(plan_forward(f));
    std::copy(plan[f].idx.begin(), plan[f].idx.end(), all_idx.begin() + static_cast<std::ptrdiff_t>(f * max_sel));
  }
  fb::device_buffer<B> didx{all_idx.size() * sizeof(std::int32_t), b};
  b.memcpy_async(didx.data(), all_idx.data(), all_idx.size() * sizeof(std::int32_t), fb::memcpy_kind::host_to_device,
                 s.handle());
  s.synchronize();
  fk::shm_stream stream{stream_config(4096)};
  shm_child reader{{"attrib", name, std::to_string(2 * F), "100", "300"}};  // the backlog first: ~6 KB of records
  EXPECT_EQ(reader.expect_line("attached"), "attached 0");
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  for (std::uint64_t f = 0; f < F; ++f) {
    ch.begin_forward(s, plan[f].meta);
    const auto* idx = static_cast<const std::int32_t*>(didx.data()) + f * max_sel;
    ch.capture_rows(fd::hook_id{0}, src->data(), src_rows, row_bytes, fd::row_selection::rows(idx, plan[f].idx.size()), s);
    ch.capture(fd::hook_id{1}, src->data(), 96, s);
    (void)ch.end_forward(s);
  }
  const auto got = attr_until(reader, "done");
  EXPECT_EQ(reader.wait(), 0);
  (void)ch.close();
  const auto st = stream.close();
  ASSERT_EQ(got.size(), 2 * F);
  for (std::uint64_t i = 0; i < got.size(); ++i) {
    const std::uint64_t f = i / 2;
    const auto& m = plan[f].meta;
    auto g = got[i];
    SCOPED_TRACE(::testing::Message() << "entry " << i << " (forward " << f << ")");
    EXPECT_EQ(g["forward"], std::to_string(f));
    EXPECT_EQ(g["tag"], std::to_string(m.tag.value_or(f)));
    EXPECT_EQ(g["status"], "0");
    if (m.empty()) {
      EXPECT_EQ(g["attribution"], "none");
      EXPECT_EQ(g["meta"], "0");
      continue;
    }
    ASSERT_EQ(g["attribution"], "present");
    ASSERT_EQ(g["meta"], "1");
    EXPECT_EQ(g["meta_tag"], std::to_string(*m.tag));
    EXPECT_EQ(g["selected"], "-");
    std::string reqs, digests;
    for (std::size_t k = 0; k < m.requests.size(); ++k) {
      const auto& r = m.requests[k];
      reqs += (k ? "," : "") + std::to_string(r.request) + ":" + std::to_string(r.first_row) + ":" + std::to_string(r.rows);
      digests += (k ? "," : "") + std::to_string(r.request) + ":" + std::to_string(rows_digest(plan[f].idx, r.first_row, r.rows));
    }
    EXPECT_EQ(g["requests"], reqs.empty() ? "-" : reqs);
    EXPECT_EQ(g["user"], hex(m.user));
    if (i % 2 == 0) {  // the row entry
      EXPECT_EQ(g["row_bytes"], std::to_string(row_bytes));
      EXPECT_EQ(g["rows"], std::to_string(plan[f].idx.size()));
      EXPECT_EQ(g["rows_of"], digests.empty() ? "-" : digests) << "rows_of split the rows wrong";
      EXPECT_EQ(g["unknown_refused"], "1");
    } else {
      EXPECT_EQ(g["row_bytes"], "0");
      EXPECT_EQ(g["rows"], "0");
      EXPECT_EQ(g["whole_refused"], "1");
    }
  }
  EXPECT_GE(st.attribution_records, F - F / 6) << "one per forward with metadata (more: a record rewritten)";
  EXPECT_EQ(st.attribution_overflows, 0U);
  EXPECT_EQ(st.entries_released, 2 * F);
  EXPECT_TRUE(st.first_error.empty()) << st.first_error;
}

// The bound: a record of exactly the region's bytes (168 requests, no user bytes: 64 + 168 x 24 = 4096) is written;
// one of 200 requests (4864 bytes) never fits, so its forward's entries are published without it, marked overflow:
// the reader's attribution accessors (requests(), rows_of()) throw attribution_overflow_error naming both sizes,
// the entry's bytes are intact, the stream counts the forward once; the next forward's record is there again.
TEST_F(ShmStreamAttribution, ARecordLargerThanTheRegionIsACountedOverflowNeverAWrongAttribution)
{
  fb::device_buffer<B> didx{3 * sizeof(std::int32_t), b};
  const std::int32_t idx[3] = {5, 9, 2};
  b.memcpy_async(didx.data(), idx, sizeof idx, fb::memcpy_kind::host_to_device, s.handle());
  s.synchronize();
  fk::shm_stream stream{stream_config(4096)};
  shm_child reader{{"attrib", name, "5"}};
  EXPECT_EQ(reader.expect_line("attached"), "attached 0");
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  fd::forward_meta fits, large, after;
  for (std::uint64_t k = 0; k < 168; ++k) { fits.requests.push_back({k, 0, 0}); }
  for (std::uint64_t k = 0; k < 200; ++k) { large.requests.push_back({k, k % 3, 1}); }
  large.tag = 77;
  after.requests = {{9, 0, 3}};
  after.user = {std::byte{0xab}};
  ASSERT_EQ(shm::record_bytes_of(fits), 4096U);
  ASSERT_EQ(shm::record_bytes_of(large), 4864U);
  ch.begin_forward(s, fits);
  ch.capture(fd::hook_id{1}, src->data(), 96, s);
  (void)ch.end_forward(s);
  for (const auto* m : {&large, &after}) {
    ch.begin_forward(s, *m);
    ch.capture_rows(fd::hook_id{0}, src->data(), src_rows, row_bytes,
                    fd::row_selection::rows(static_cast<const std::int32_t*>(didx.data()), 3), s);
    ch.capture(fd::hook_id{1}, src->data(), 96, s);
    (void)ch.end_forward(s);
  }
  std::map<std::uint64_t, std::string> what;
  auto got = attr_until(reader, "done", &what);
  (void)ch.close();
  const auto st = stream.close();
  ASSERT_EQ(got.size(), 5U);
  EXPECT_EQ(got[0]["attribution"], "present");
  EXPECT_EQ(std::count(got[0]["requests"].begin(), got[0]["requests"].end(), ','), 167);
  for (const std::size_t i : {1U, 2U}) {
    SCOPED_TRACE(::testing::Message() << "entry " << i);
    EXPECT_EQ(got[i]["attribution"], "overflow");
    EXPECT_EQ(got[i]["overflow"], "4864:4096");
    EXPECT_EQ(got[i]["tag"], "77") << "the descriptor's tag is the forward's still";
    EXPECT_EQ(got[i]["status"], "0");
    EXPECT_NE(what[i].find("expected its forward's attribution in the stream's record region, got a record of 4864 "
                           "bytes, larger than the region's 4096 bytes"), std::string::npos) << what[i];
    EXPECT_NE(what[i].find("stream '" + name + "'"), std::string::npos) << what[i];
  }
  EXPECT_EQ(got[1]["rows_of_overflow"], "1");
  EXPECT_EQ(got[1]["size"], std::to_string(3 * row_bytes));
  EXPECT_EQ(got[3]["attribution"], "present");
  EXPECT_EQ(got[3]["requests"], "9:0:3");
  EXPECT_EQ(got[3]["user"], "ab");
  EXPECT_EQ(got[3]["rows_of"], "9:" + std::to_string(rows_digest({5, 9, 2}, 0, 3)));
  EXPECT_EQ(st.attribution_overflows, 1U) << "counted once per forward";
  EXPECT_EQ(st.attribution_records, 2U);
  EXPECT_EQ(st.entries_published, 5U);
}

// A dynamic entry whose GPU-resolved size (1000) exceeds its reservation (256) reaches the reader as size_overflow
// with its reservation: reserved_bytes() and the error of bytes() name 256, not 0; a dynamic entry within it keeps
// its reservation too.
TEST_F(ShmStreamAttribution, ASizeOverflowEntryNamesItsReservedBytesAtTheReader)
{
  fb::device_buffer<B> sizes{2 * sizeof(std::uint64_t), b};
  const std::uint64_t n[2] = {1000, 100};
  b.memcpy_async(sizes.data(), n, sizeof n, fb::memcpy_kind::host_to_device, s.handle());
  s.synchronize();
  fk::shm_stream stream{stream_config(4096)};
  shm_child reader{{"attrib", name, "2"}};
  EXPECT_EQ(reader.expect_line("attached"), "attached 0");
  fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
  ch.begin_forward(s, fd::forward_meta{});
  ch.capture_dynamic(fd::hook_id{2}, src->data(), 256, static_cast<const std::uint64_t*>(sizes.data()), s);
  ch.capture_dynamic(fd::hook_id{2}, src->data(), 256, static_cast<const std::uint64_t*>(sizes.data()) + 1, s);
  (void)ch.end_forward(s);
  std::map<std::uint64_t, std::string> what;
  auto got = attr_until(reader, "done", &what);
  (void)ch.close();
  (void)stream.close();
  ASSERT_EQ(got.size(), 2U);
  EXPECT_EQ(got[0]["status"], "1");
  EXPECT_EQ(got[0]["size"], "1000");
  EXPECT_EQ(got[0]["reserved"], "256");
  EXPECT_NE(what[0].find("GPU-resolved size 1000 bytes exceeds the reserved 256 bytes"), std::string::npos) << what[0];
  EXPECT_EQ(got[1]["status"], "0");
  EXPECT_EQ(got[1]["size"], "100");
  EXPECT_EQ(got[1]["reserved"], "256");
}

// S2a: a forward's record is written before the head store-release that publishes its first descriptor. A reader
// in this process polls without pause while forwards of 100000 requests each (2.4 MB records, milliseconds to
// write) are published: a record written after the release is copied half-written ("expected the CRC-32 ...") in
// every run.
TEST_F(ShmStreamAttribution, AReaderNeverSeesAHalfWrittenRecord)
{
  constexpr std::uint64_t F = 12, R = 100000;
  fk::shm_stream stream{stream_config(8 << 20)};
  fk::shm_reader r{name, 5s};
  std::atomic<bool> stop{false}, failed{false};
  std::string failure;  // the reader thread's; read after the join
  std::atomic<std::uint64_t> seen{0};
  std::thread t{[&] {
    try {
      while (seen < F && !stop) {
        for (auto& e : r.poll(64, 1ms)) {
          const auto q = e.requests();
          if (q.size() != R || q[R - 1].request != e.forward_index() * R + R - 1 || q[R / 2].first_row != R / 2) {
            failure = "entry " + std::to_string(e.index()) + ": " + std::to_string(q.size()) + " requests, not as given";
            failed = true;
          }
          ++seen;
        }
      }
    } catch (const std::exception& x) {
      failure = x.what();
      failed = true;
    }
  }};
  {
    fd::channel<B> ch{channel_config(), b, stream.callback(), stream.staging(b)};
    for (std::uint64_t f = 0; f < F && !failed; ++f) {
      fd::forward_meta m;
      for (std::uint64_t k = 0; k < R; ++k) { m.requests.push_back({f * R + k, k, 1}); }
      ch.begin_forward(s, m);
      ch.capture(fd::hook_id{1}, src->data(), 64, s);
      (void)ch.end_forward(s);
      s.synchronize();
    }
    (void)ch.close();
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (seen < F && !failed && std::chrono::steady_clock::now() < end) { std::this_thread::sleep_for(1ms); }
    stop = true;
    t.join();
  }
  EXPECT_EQ(failure, "");
  EXPECT_EQ(seen.load(), F);
  r.close();
  (void)stream.close();
}

}  // namespace
}  // namespace ferry::test
