// SPDX-License-Identifier: Apache-2.0
// sink::sample_assembler behind a host-backend channel: row entries of two hooks over three steps assemble into
// per-request samples with the right rows in position order (a position run twice keeps the later run, the kept
// hooks in the request's order, a window strict), the missing ranges and reasons of a request that never finished,
// and policy drop's per-request report.
#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/sink.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

namespace ferry::test {
namespace {

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace fk = ferry::sink;
using B = fb::host_backend;
using namespace std::chrono_literals;

constexpr std::uint64_t row_bytes = 16, src_rows = 64;

class SampleAssembler : public ::testing::Test {
 protected:
  void SetUp() override
  {
    b.set_device(fb::device_id{0});
    for (int h = 0; h < 2; ++h) {
      host[h].resize(src_rows * row_bytes);
      for (std::size_t i = 0; i < host[h].size(); ++i) { host[h][i] = static_cast<std::byte>(i * 7 + h * 101 + 3); }
      src[h].emplace(host[h].size(), b);
      b.memcpy_async(src[h]->data(), host[h].data(), host[h].size(), fb::memcpy_kind::host_to_device, s.handle());
    }
    s.synchronize();
  }
  static fd::config channel_config()
  {
    fd::config c;
    c.ring_bytes = 1 << 16;
    c.timeout = 10s;
    return c;
  }
  /// One step: source rows `idx` of both hooks, attributed to `reqs` with first positions `firsts`.
  void step(fd::channel<B>& ch, std::uint64_t tag, const std::vector<std::int32_t>& idx,
            std::vector<fd::request_rows> reqs, const std::vector<std::int64_t>& firsts)
  {
    fb::device_buffer<B> d{idx.size() * sizeof(std::int32_t), b};
    b.memcpy_async(d.data(), idx.data(), idx.size() * sizeof(std::int32_t), fb::memcpy_kind::host_to_device, s.handle());
    fd::forward_meta m;
    m.tag = tag;
    m.requests = std::move(reqs);
    m.user.resize(firsts.size() * sizeof(std::int64_t));
    std::memcpy(m.user.data(), firsts.data(), m.user.size());
    ch.begin_forward(s, m);
    for (std::uint32_t h = 0; h < 2; ++h) {
      ch.capture_rows(fd::hook_id{h}, src[h]->data(), src_rows, row_bytes,
                      fd::row_selection::rows(static_cast<const std::int32_t*>(d.data()), idx.size()), s);
    }
    (void)ch.end_forward(s);
    s.synchronize();
  }
  /// The expected hidden bytes: source rows `idx` of each hook of `keep`, [rows, keep, row_bytes].
  std::vector<std::byte> rows_of(const std::vector<std::int32_t>& idx, const std::vector<std::uint32_t>& keep) const
  {
    std::vector<std::byte> out;
    for (const std::int32_t r : idx) {
      for (const std::uint32_t h : keep) {
        const auto* p = host[h].data() + static_cast<std::size_t>(r) * row_bytes;
        out.insert(out.end(), p, p + row_bytes);
      }
    }
    return out;
  }
  static std::vector<fk::assembled_sample> drain(fk::sample_assembler& a, std::size_t n)
  {
    std::vector<fk::assembled_sample> out;
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (out.size() < n && std::chrono::steady_clock::now() < end) {
      if (auto x = a.next(20ms)) { out.push_back(std::move(*x)); }
    }
    return out;
  }

  B b;
  fb::stream<B> s{b};
  std::vector<std::byte> host[2];
  std::optional<fb::device_buffer<B>> src[2];
};

TEST_F(SampleAssembler, RowsInPositionOrderTheLaterRunWinsTheKeptHooksInOrder)
{
  fk::sample_assembler a{{.hooks = 2}};
  fd::channel<B> ch{channel_config(), b, a, fd::hook_schema{}};
  a.add({.handle = 1, .id = "A", .lo = 0, .hi = 1000, .keep = {1, 0}, .prompt = {100, 101, 102, 103}});
  a.add({.handle = 2, .id = "B", .lo = 2, .hi = 5, .keep = {0}, .prompt = {200, 201, 202, 203}, .strict = true});
  step(ch, 0, {10, 11, 12, 13, 20, 21}, {{1, 0, 4}, {2, 4, 2}}, {0, 2});  // A 0..3, B 2..3
  step(ch, 1, {30, 31}, {{1, 0, 1}, {2, 1, 1}}, {4, 4});                  // A 4, B 4
  step(ch, 2, {40, 41}, {{1, 0, 2}}, {4});                                // A 4 again (recomputed), 5
  a.finish(1, {100, 101, 102, 103, 104, 105, 106}, "", 2);
  a.finish(2, {200, 201, 202, 203, 204, 205}, "", 1);
  auto got = drain(a, 2);
  ASSERT_EQ(got.size(), 2U);
  const auto& sa = got[0].id == "A" ? got[0] : got[1];
  const auto& sb = got[0].id == "A" ? got[1] : got[0];
  EXPECT_EQ(sa.positions, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(sa.token_ids, (std::vector<std::int64_t>{100, 101, 102, 103, 104, 105}));
  EXPECT_EQ(sa.hidden, rows_of({10, 11, 12, 13, 40, 41}, {1, 0})) << "position 4: step 2's run, not step 1's";
  EXPECT_TRUE(sa.complete) << sa.reason;
  EXPECT_EQ(sb.positions, (std::vector<std::int64_t>{2, 3, 4}));
  EXPECT_EQ(sb.hidden, rows_of({20, 21, 31}, {0}));
  EXPECT_TRUE(sb.complete && sb.missing.empty());
  EXPECT_EQ(sb.row_bytes, row_bytes);
  (void)ch.close();
  a.close();
  EXPECT_TRUE(a.done());
  EXPECT_EQ(a.stats().steps_held, 0U) << "every step's rows let go once its requests were built";
}

TEST_F(SampleAssembler, ARequestNotFinishedAtCloseIsIncompleteWithWhatIsMissing)
{
  fk::sample_assembler a{{.hooks = 2}};
  fd::channel<B> ch{channel_config(), b, a, fd::hook_schema{}};
  a.add({.handle = 5, .id = "W", .lo = 1, .hi = 6, .keep = {0, 1}, .prompt = {9, 8, 7}, .strict = true});
  step(ch, 0, {3, 4}, {{5, 0, 2}}, {1});  // positions 1, 2 of [1, 6)
  EXPECT_FALSE(a.next(10ms).has_value()) << "not finished: not ready";
  (void)ch.close();
  a.close();
  auto got = drain(a, 1);
  ASSERT_EQ(got.size(), 1U);
  EXPECT_FALSE(got[0].complete);
  EXPECT_EQ(got[0].reason, "not finished when the capture closed");
  EXPECT_EQ(got[0].positions, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(got[0].token_ids, (std::vector<std::int64_t>{8, 7})) << "the prompt's tokens";
  EXPECT_EQ(got[0].missing, (std::vector<std::pair<std::int64_t, std::int64_t>>{{3, 6}}));
  EXPECT_EQ(got[0].hidden, rows_of({3, 4}, {0, 1}));
  EXPECT_TRUE(a.done());
}

TEST_F(SampleAssembler, PolicyDropReportsEachDroppedRequestAndItsTokens)
{
  fk::sample_assembler a{{.hooks = 2, .policy = fk::queue_policy::drop, .max_pending_bytes = 1}};
  fd::channel<B> ch{channel_config(), b, a, fd::hook_schema{}};
  a.add({.handle = 1, .id = "A", .lo = 0, .hi = 100, .keep = {0, 1}, .prompt = {}});
  a.add({.handle = 2, .id = "B", .lo = 0, .hi = 100, .keep = {0, 1}, .prompt = {}});
  step(ch, 0, {1, 2, 3, 4, 5}, {{1, 0, 2}, {2, 2, 3}}, {0, 0});
  a.finish(1, {0, 0, 0}, "", 0);
  step(ch, 1, {6}, {}, {});  // A ready: pending
  a.finish(2, {0, 0, 0, 0}, "", 0);
  step(ch, 2, {7}, {}, {});  // B ready beyond the limit: dropped
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (ch.stats().entries_drained < 6 && std::chrono::steady_clock::now() < end) { std::this_thread::sleep_for(1ms); }
  const std::vector<fk::request_drop> want{{2, 1, 3}};
  EXPECT_EQ(a.dropped_requests(), want);
  auto got = drain(a, 1);
  ASSERT_EQ(got.size(), 1U);
  EXPECT_EQ(got[0].id, "A");
  EXPECT_EQ(got[0].hidden, rows_of({1, 2}, {0, 1}));
  (void)ch.close();
  a.close();
  EXPECT_FALSE(a.next(10ms).has_value());
  EXPECT_EQ(a.stats().samples_dropped, 1U);
}

TEST_F(SampleAssembler, PolicyBlockHoldsTheDrainUntilTheWriterTakesAndLosesNothing)
{
  fk::sample_assembler a{{.hooks = 2, .policy = fk::queue_policy::block, .max_pending_bytes = 1, .timeout = 2s}};
  fd::channel<B> ch{channel_config(), b, a, fd::hook_schema{}};
  a.add({.handle = 1, .id = "A", .lo = 0, .hi = 100, .keep = {0, 1}, .prompt = {}});
  a.add({.handle = 2, .id = "B", .lo = 0, .hi = 100, .keep = {1}, .prompt = {}});
  step(ch, 0, {1, 2, 3, 4, 5}, {{1, 0, 2}, {2, 2, 3}}, {0, 0});
  a.finish(1, {0, 0, 0}, "", 0);
  a.finish(2, {0, 0, 0, 0}, "", 0);
  step(ch, 1, {6}, {}, {});  // both ready: A queued, B beyond the limit: the drain thread waits for next()
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (a.stats().stalls == 0 && std::chrono::steady_clock::now() < end) { std::this_thread::sleep_for(1ms); }
  EXPECT_EQ(a.stats().stalls, 1U);
  auto got = drain(a, 2);
  ASSERT_EQ(got.size(), 2U);
  EXPECT_EQ(got[0].hidden, rows_of({1, 2}, {0, 1}));
  EXPECT_EQ(got[1].hidden, rows_of({3, 4, 5}, {1}));
  EXPECT_EQ(a.stats().stall_timeouts, 0U) << "next() made room";
  EXPECT_TRUE(a.dropped_requests().empty());
  (void)ch.close();
  (void)a.close();
}

TEST_F(SampleAssembler, ARequestAddedTwiceIsALogicErrorNamingIt)
{
  fk::sample_assembler a{{.hooks = 1}};
  a.add({.handle = 3, .id = "x", .keep = {0}, .prompt = {}});
  EXPECT_THROW(a.add({.handle = 3, .id = "y", .keep = {0}, .prompt = {}}), ferry::logic_error);
  EXPECT_THROW((fk::sample_assembler{{.hooks = 0}}), ferry::logic_error);
}

}  // namespace
}  // namespace ferry::test
