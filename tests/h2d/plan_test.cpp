// SPDX-License-Identifier: Apache-2.0
// The backend-free parts of H2D publication, tested without a backend: the arena plan (layout, tiles,
// header, overlap checks), the declaration rules, the slot/epoch state and its validation, the debug check
// of published sources, and the environment variables. Part of h2d_host (label host).
#include <ferry/h2d/detail/env.hpp>
#include <ferry/h2d/detail/plan.hpp>
#include <ferry/h2d/detail/slots.hpp>
#include <ferry/h2d/detail/source_check.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace ferry::test::h2d {
namespace {

namespace fh = ferry::h2d;
namespace fd = ferry::h2d::detail;

/// The standard mixed declaration of the typed suites: `step` (5 members) covers `tokens` and `sampling`.
fd::declarations mixed()
{
  fd::declarations d;
  (void)d.declare({.name = "input_ids", .groups = {"step", "tokens"}, .unit = fh::count_unit::elements,
                   .element_size = 4, .capacity = 64});
  (void)d.declare({.name = "positions", .groups = {"step"}, .unit = fh::count_unit::elements, .element_size = 8,
                   .capacity = 64});
  (void)d.declare({.name = "temperature_bf16", .groups = {"step", "sampling"}, .unit = fh::count_unit::bytes,
                   .element_size = 1, .capacity = 2 * 64});
  (void)d.declare({.name = "is_greedy_bool", .groups = {"step", "sampling"}, .unit = fh::count_unit::bytes,
                   .element_size = 1, .capacity = 61});
  (void)d.declare({.name = "block_table", .groups = {"step"}, .unit = fh::count_unit::rows, .element_size = 4,
                   .row_size = 4 * 9, .capacity = 300});
  return d;
}

std::string message_of(auto&& op)
{
  try {
    op();
  } catch (const ferry::logic_error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(H2dPlan, LargestGroupGetsTheArenaAndCoversTheSmallerOnes)
{
  const auto d = mixed();
  ASSERT_EQ(d.groups.size(), 3U);  // step, tokens, sampling (first named first)
  const auto p = fd::plan_arenas(d, true);
  const auto& step = p.groups[0];
  EXPECT_EQ(step.packed_members, (std::vector<std::uint32_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(step.direct_members.empty());
  EXPECT_FALSE(step.covered);
  EXPECT_EQ(step.header_bytes, 80U);  // 5 x 16
  // Payloads in declaration order, each 16-byte aligned: 256, 512, 128, 61 -> 64, 10800 bytes.
  const std::size_t want_offset[] = {80, 336, 848, 976, 1040};
  for (std::uint32_t m = 0; m < 5; ++m) {
    EXPECT_EQ(p.buffers[m].home, 0U) << m;
    EXPECT_EQ(p.buffers[m].arena_offset, want_offset[m]) << m;
  }
  EXPECT_EQ(step.arena_bytes, 1040U + 300 * 36);
  for (std::size_t g : {1, 2}) {
    EXPECT_TRUE(p.groups[g].covered) << g;
    EXPECT_EQ(p.groups[g].arena_bytes, 0U) << g;
    EXPECT_TRUE(p.groups[g].packed_members.empty()) << g;
  }
  EXPECT_EQ(p.standalone_bytes, fd::arena_align);  // nothing standalone
}

TEST(H2dPlan, DirectPlanHasNoArenaAndPacksStandaloneSources)
{
  const auto d = mixed();
  const auto p = fd::plan_arenas(d, false);
  for (const auto& g : p.groups) {
    EXPECT_EQ(g.arena_bytes, 0U);
    EXPECT_FALSE(g.covered);
  }
  const std::size_t want_offset[] = {0, 256, 768, 896, 960};
  for (std::uint32_t m = 0; m < 5; ++m) {
    EXPECT_EQ(p.buffers[m].home, fd::none) << m;
    EXPECT_EQ(p.buffers[m].standalone_offset, want_offset[m]) << m;
  }
  EXPECT_EQ(p.standalone_bytes, 960U + 300 * 36);
}

TEST(H2dPlan, StridedMembersStayDirectAndPartialOverlapIsNotCovered)
{
  fd::declarations d;
  int storage = 0;
  (void)d.declare({.name = "a", .groups = {"g", "h"}, .unit = fh::count_unit::bytes, .capacity = 32});
  (void)d.declare({.name = "b", .groups = {"g"}, .unit = fh::count_unit::bytes, .capacity = 32});
  (void)d.declare({.name = "rows", .groups = {"g"}, .unit = fh::count_unit::rows, .element_size = 4, .row_size = 8,
                   .capacity = 4, .device_ptr = &storage, .stride = 16});
  (void)d.declare({.name = "c", .groups = {"h"}, .unit = fh::count_unit::bytes, .capacity = 32});
  const auto p = fd::plan_arenas(d, true);
  EXPECT_EQ(p.groups[0].packed_members, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(p.groups[0].direct_members, (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(p.buffers[2].home, fd::none) << "a strided member is never homed in an arena";
  // h shares `a` with g but `c` lives nowhere: not covered, no arena, direct copies.
  EXPECT_FALSE(p.groups[1].covered);
  EXPECT_EQ(p.groups[1].arena_bytes, 0U);
  EXPECT_EQ(p.buffers[3].home, fd::none);
  EXPECT_EQ(p.buffers[2].standalone_offset, 0U);
  EXPECT_EQ(p.buffers[3].standalone_offset, 32U);
}

TEST(H2dPlan, TilesInterleaveMembersAndClipToCapacity)
{
  fd::declarations d;
  (void)d.declare({.name = "m0", .groups = {"g"}, .unit = fh::count_unit::bytes, .capacity = 100});
  (void)d.declare({.name = "m1", .groups = {"g"}, .unit = fh::count_unit::bytes, .capacity = 40});
  const auto p = fd::plan_arenas(d, true);
  ASSERT_EQ(p.groups[0].header_bytes, 32U);
  ASSERT_EQ(p.buffers[1].arena_offset, 32U + 112);
  const std::vector<std::uint64_t> dsts{0x10000, 0x20000};
  const auto t = fd::make_tiles(d, p, 0, dsts, 32);
  struct want {
    std::uint32_t member;
    std::uint64_t start;
    std::uint32_t len;
  };
  const want w[] = {{0, 0, 32}, {1, 0, 32}, {0, 32, 32}, {1, 32, 8}, {0, 64, 32}, {0, 96, 4}};
  ASSERT_EQ(t.size(), std::size(w));
  for (std::size_t i = 0; i < t.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(t[i].member, w[i].member);
    EXPECT_EQ(t[i].start, w[i].start);
    EXPECT_EQ(t[i].len, w[i].len);
    EXPECT_EQ(t[i].dst, dsts[w[i].member] + w[i].start);
    EXPECT_EQ(t[i].src, p.buffers[w[i].member].arena_offset + w[i].start);
  }
  EXPECT_EQ(fd::scatter_grid(t.size(), 4, 256), 6U);  // fewer tiles than resident blocks: one per tile
  EXPECT_EQ(fd::scatter_grid(1000, 4, 256), 32U);     // 4 SMs x 8 blocks of 256 threads
  EXPECT_EQ(fd::scatter_grid(1000, 0, 1024), 2U);     // no SM count reported: one SM
}

TEST(H2dPlan, HeaderHoldsOffsetAndPublishedBytesPerPackedMember)
{
  const auto d = mixed();
  const auto p = fd::plan_arenas(d, true);
  const std::vector<std::size_t> counts{3, 2, 7, 0, 5};  // units
  std::vector<std::int64_t> h(10, -1);
  fd::write_header(h.data(), d, p, 0, counts);
  const std::int64_t want[] = {80, 12, 336, 16, 848, 7, 976, 0, 1040, 5 * 36};
  for (std::size_t i = 0; i < 10; ++i) { EXPECT_EQ(h[i], want[i]) << i; }
}

TEST(H2dPlan, OverlappingDestinationsAreRejectedNamingBoth)
{
  fd::declarations d;
  alignas(16) static unsigned char dev[4096];
  (void)d.declare({.name = "slot_mapping", .groups = {"kv"}, .unit = fh::count_unit::elements, .element_size = 8,
                   .capacity = 64, .device_ptr = dev});
  (void)d.declare({.name = "rows", .groups = {"kv"}, .unit = fh::count_unit::rows, .element_size = 4, .row_size = 8,
                   .capacity = 4, .device_ptr = dev + 1024, .stride = 64});  // extent 3 * 64 + 8 = 200
  (void)d.declare({.name = "seq_lens", .groups = {"kv"}, .unit = fh::count_unit::elements, .element_size = 4,
                   .capacity = 8, .device_ptr = dev + 1024 + 200});
  const auto p = fd::plan_arenas(d, true);
  std::vector<void*> dst{dev, dev + 1024, dev + 1024 + 200};
  EXPECT_NO_THROW(fd::check_overlaps(d, p, dst));
  dst[2] = dev + 1024 + 199;  // one byte into the strided extent
  const auto w = message_of([&] { fd::check_overlaps(d, p, dst); });
  EXPECT_NE(w.find("destination range of buffer 'seq_lens'"), std::string::npos) << w;
  EXPECT_NE(w.find("overlaps buffer 'rows'"), std::string::npos) << w;
}

TEST(H2dPlan, DeclarationsRejectBadSpecsNamingTheBuffer)
{
  fd::declarations d;
  (void)d.declare({.name = "a", .groups = {"g"}, .capacity = 4});
  EXPECT_NE(message_of([&] { (void)d.declare({.name = "a", .groups = {"g"}, .capacity = 4}); }).find("'a': declared twice"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)d.declare({.name = "", .groups = {"g"}, .capacity = 4}); }).find("needs a name"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)d.declare({.name = "b", .groups = {}, .capacity = 4}); }).find("'b': expected at least one group"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)d.declare({.name = "c", .groups = {"g"}}); }).find("'c': expected a capacity > 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              (void)d.declare({.name = "s", .groups = {"g"}, .unit = fh::count_unit::rows, .element_size = 4,
                               .row_size = 8, .capacity = 4, .stride = 16});
            }).find("'s': a stride needs unit rows and a bound device pointer"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)d.declare({.name = "t", .groups = {"g", "g"}, .capacity = 4}); })
              .find("'t': group 'g' listed twice"),
            std::string::npos);
  // Normalization: rows default to one element per row; a stride equal to the row size is contiguous.
  int storage = 0;
  const auto r = d.declare({.name = "r", .groups = {"g"}, .unit = fh::count_unit::rows, .element_size = 8,
                            .capacity = 3, .device_ptr = &storage, .stride = 8});
  EXPECT_EQ(d.buffers[r.value].spec.row_size, 8U);
  EXPECT_FALSE(d.buffers[r.value].strided);
  EXPECT_EQ(d.buffers[r.value].cap_bytes, 24U);
}

TEST(H2dSlots, EpochsCountsAndPublicationMarksWithoutABackend)
{
  fd::declarations d;
  (void)d.declare({.name = "x", .groups = {"g", "both"}, .unit = fh::count_unit::bytes, .capacity = 8});
  (void)d.declare({.name = "y", .groups = {"both"}, .unit = fh::count_unit::bytes, .capacity = 8});
  const auto g = d.group_of("g");
  const auto both = d.group_of("both");
  fd::slot_table t;
  t.reset(2, d.buffers.size());
  EXPECT_NE(message_of([&] { t.open_producer(d, g); }).find("no active slot"), std::string::npos);
  EXPECT_NE(message_of([&] { t.check_begin(2); }).find("slot 2 out of range (have 2)"), std::string::npos);
  EXPECT_NE(message_of([&] { (void)t.resume(0); }).find("never began"), std::string::npos);
  t.check_begin(0);
  const auto e1 = t.start_epoch(0);
  EXPECT_TRUE(t.is_active(0, e1));
  EXPECT_NE(message_of([&] { t.check_begin(1); }).find("while slot 0 is active"), std::string::npos);
  t.open_producer(d, g);
  EXPECT_NE(message_of([&] { t.open_producer(d, both); }).find("held by the open producer of group 'g'"),
            std::string::npos);
  EXPECT_NE(message_of([&] { t.set_count(d, fh::buffer_handle{0}, 9); }).find("count 9 exceeds capacity 8"),
            std::string::npos);
  t.set_count(d, fh::buffer_handle{0}, 5);
  t.check_members(d, g);
  t.close_producer(d, g);
  EXPECT_NE(message_of([&] { t.check_members(d, both); }).find("buffer 'y' has no count in epoch 1"), std::string::npos);
  t.commit(d, g);
  EXPECT_EQ(t[0].published_epoch[0], e1);
  EXPECT_NE(message_of([&] { t.check_members(d, g); }).find("duplicate publication of buffer 'x'"), std::string::npos);
  EXPECT_NE(message_of([&] { t.open_producer(d, both); }).find("already published in epoch 1 by group 'g'"),
            std::string::npos);
  t.check_rewrite(d, g);
  t.reopen(d, g);
  t.check_members(d, g);  // reopened: the count still stands
  t.finished();
  EXPECT_EQ(t.active(), -1);
  EXPECT_TRUE(t[0].recorded);
  EXPECT_EQ(t.resume(0), e1);
  t.finished();
  EXPECT_GT(t.start_epoch(1), e1);
}

TEST(H2dEnv, VariablesFillOnlyWhatTheConfigLeavesUnset)
{
  ::setenv("FERRY_H2D_SPECULATION", "1", 1);
  ::setenv("FERRY_H2D_BACKEND", "zerocopy", 1);
  fh::config c;
  fd::apply_env(c);
  EXPECT_EQ(c.speculation, 1);
  EXPECT_EQ(c.backend, fh::upload_backend::zerocopy);
  fh::config set;
  set.speculation = 0;
  set.backend = fh::upload_backend::direct;
  fd::apply_env(set);
  EXPECT_EQ(set.speculation, 0);
  EXPECT_EQ(set.backend, fh::upload_backend::direct);
  ::setenv("FERRY_H2D_SPECULATION", "3", 1);
  fh::config bad;
  EXPECT_NE(message_of([&] { fd::apply_env(bad); }).find("FERRY_H2D_SPECULATION='3' is not 0, 1 or 2"),
            std::string::npos);
  ::setenv("FERRY_H2D_SPECULATION", "", 1);  // empty: unset
  ::setenv("FERRY_H2D_BACKEND", "fast", 1);
  fh::config bad2;
  EXPECT_NE(message_of([&] { fd::apply_env(bad2); }).find("FERRY_H2D_BACKEND='fast'"), std::string::npos);
  ::unsetenv("FERRY_H2D_SPECULATION");
  ::unsetenv("FERRY_H2D_BACKEND");
  fh::config none;
  fd::apply_env(none);
  EXPECT_EQ(none.speculation, -1);
  EXPECT_FALSE(none.backend.has_value());
}

/// The expected-slot check of open_producer (producer(group, slot)): refused before anything is held.
TEST(H2dSlots, ExpectedSlotIsCheckedBeforeTheMembers)
{
  auto d = mixed();
  fd::slot_table t;
  t.reset(2, d.buffers.size());
  EXPECT_NE(message_of([&] { t.open_producer(d, d.group_of("tokens"), 1); })
              .find("h2d producer 'tokens': expected slot 1, got no active slot (call begin(1) first)"),
            std::string::npos);
  const auto e = t.start_epoch(1);
  EXPECT_NE(message_of([&] { t.open_producer(d, d.group_of("step"), 0); })
              .find("h2d producer 'step': expected slot 0, got active slot 1 (epoch " + std::to_string(e) + ")"),
            std::string::npos);
  for (auto o : t.producer_open()) { EXPECT_EQ(o, fd::none); }  // nothing held
  t.open_producer(d, d.group_of("step"), 1);
  EXPECT_EQ(t.producer_open()[0], d.group_of("step").value);
}

/// source_check without a publisher: the copy of a published prefix, the first changed byte, reported once,
/// and the releases (begin of the slot, rewrite of a buffer, recover).
TEST(H2dSourceCheck, CopiesAreComparedAndReleased)
{
  auto d = mixed();
  std::vector<unsigned char> ids(256, 0x11), pos(512, 0x22);
  fd::source_check c;
  c.reset(false, 2);
  c.record(0, 0, 0, 1, ids.data(), 40);
  EXPECT_EQ(c.size(), 0U) << "disabled: nothing copied";
  c.reset(true, 2);
  c.record(0, 0, 0, 1, ids.data(), 40);
  c.record(0, 1, 0, 1, pos.data(), 80);
  c.record(0, 0, 0, 1, ids.data(), 40);  // a second publication (rewrite) replaces the first copy
  EXPECT_EQ(c.size(), 2U);
  ids[40] = 0x99;  // past the published prefix: not uploaded, not reported
  EXPECT_NO_THROW(c.verify(d, "begin()"));
  ids[7] = 0x12;
  ids[9] = 0x13;
  const auto w = message_of([&] { c.verify(d, "begin()"); });
  EXPECT_NE(w.find("h2d group 'step': buffer 'input_ids' source of slot 0 was written after publish() (epoch 1): "
                   "byte 7 of its 40 published bytes was 0x11, is 0x12 now (found by begin()"),
            std::string::npos)
    << w;
  EXPECT_EQ(c.size(), 1U);
  EXPECT_NO_THROW(c.verify(d, "begin()")) << "reported once";
  pos[3] = 0;
  c.drop(0, 1);  // rewrite() acquired positions
  EXPECT_NO_THROW(c.verify(d, "producer()"));
  c.record(0, 1, 1, 2, pos.data(), 8);
  c.release_slot(0);
  EXPECT_EQ(c.size(), 1U) << "slot 1's copy stays";
  pos[3] = 1;
  EXPECT_NE(message_of([&] { c.verify(d, "stage()"); }).find("slot 1"), std::string::npos);
  c.record(0, 1, 1, 2, pos.data(), 8);
  c.release_all();
  EXPECT_EQ(c.size(), 0U);
}

TEST(H2dEnv, DebugSourcesVariable)
{
  const char* old = std::getenv("FERRY_H2D_DEBUG_SOURCES");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("FERRY_H2D_DEBUG_SOURCES", "1", 1);
  fh::config on;
  fd::apply_env(on);
  EXPECT_EQ(on.debug_sources, true);
  fh::config set;
  set.debug_sources = false;
  fd::apply_env(set);
  EXPECT_EQ(set.debug_sources, false) << "the config wins";
  ::setenv("FERRY_H2D_DEBUG_SOURCES", "0", 1);
  fh::config off;
  fd::apply_env(off);
  EXPECT_EQ(off.debug_sources, false);
  ::setenv("FERRY_H2D_DEBUG_SOURCES", "yes", 1);
  fh::config bad;
  EXPECT_NE(message_of([&] { fd::apply_env(bad); }).find("FERRY_H2D_DEBUG_SOURCES='yes' is not 0 or 1"),
            std::string::npos);
  ::unsetenv("FERRY_H2D_DEBUG_SOURCES");
  fh::config none;
  fd::apply_env(none);
  EXPECT_FALSE(none.debug_sources.has_value());
  if (old != nullptr) { ::setenv("FERRY_H2D_DEBUG_SOURCES", saved.c_str(), 1); }
}

/// A capacity whose bytes do not fit (capacity x unit bytes, or x stride, above 2^48) is refused at declare
/// with the buffer's name and the capacity; before, 2^62 + 16 elements of 4 bytes wrapped to 64 bytes and the
/// publication wrote past the allocation (SIGSEGV), and 2^62 wrapped to 0 ("expected a size > 0 bytes").
TEST(H2dPlan, CapacityWhoseBytesOverflowIsRefusedAtDeclare)
{
  for (std::size_t cap : {(std::size_t{1} << 62) + 16, std::size_t{1} << 62, (std::size_t{1} << 46) + 1}) {
    fd::declarations d;
    try {
      (void)d.declare({.name = "ids", .groups = {"step"}, .unit = fh::count_unit::elements, .element_size = 4,
                       .capacity = cap});
      ADD_FAILURE() << "capacity " << cap << " accepted";
    } catch (const ferry::logic_error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("h2d buffer 'ids'"), std::string::npos) << w;
      EXPECT_NE(w.find("at most 2^48 bytes, got capacity " + std::to_string(cap)), std::string::npos) << w;
    }
    EXPECT_TRUE(d.buffers.empty());  // nothing declared
  }
  fd::declarations ok;
  EXPECT_NO_THROW((void)ok.declare({.name = "ids", .groups = {"step"}, .unit = fh::count_unit::elements,
                                    .element_size = 4, .capacity = std::size_t{1} << 46}));
}

}  // namespace
}  // namespace ferry::test::h2d
