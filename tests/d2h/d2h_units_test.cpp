// SPDX-License-Identifier: Apache-2.0
// Pure unit tests of the D2H channel's decision functions (no backend): the drain's coalescing rule
// (detail::coalesce), the copy kernel's launch shape (detail::copy_launch_shape and its helpers), and the
// gather's shape (detail::apportion_gather), the row kernels' (detail::rows_shape) and placement (the kernel bodies'
// gather_offset, gather_entry_of, prefix_find, rows_layout).
#include "kernels/d2h/gather/gather_publish.cuh"
#include "kernels/d2h/select/gather_rows_publish.cuh"  // rows_layout

#include <ferry/d2h/detail/coalesce.hpp>
#include <ferry/d2h/detail/gather.hpp>
#include <ferry/d2h/detail/launch_shape.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

namespace fd = ferry::d2h;
namespace fk = ferry::kernels::d2h;  // the gather kernel's body
using fd::detail::entry_meta;
using fd::detail::run_plan;

constexpr std::uint64_t R = 4096;  // ring bytes

/// FIFO entries placed back to back from `pos` with place() (as the producer does); sizes are payload bytes,
/// `dyn` marks dynamic entries.
std::vector<entry_meta> placed(std::uint64_t pos, const std::vector<std::uint64_t>& sizes,
                               const std::vector<bool>& dyn = {})
{
  std::vector<entry_meta> out;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::uint64_t reserved = fd::align_up(sizes[i], fd::entry_alignment);
    const auto p = fd::place(pos, reserved, R);
    const bool d = i < dyn.size() && dyn[i];
    out.push_back(entry_meta{i, p.start, reserved, d ? 0 : sizes[i], i, 7, d});
    pos = p.end;
  }
  return out;
}

/// coalesce() over `e` with head `h`, dynamic sizes `actual` (by slot) and `room` staging bytes.
run_plan run(const std::vector<entry_meta>& e, std::uint64_t h, std::uint64_t room = ~0ULL,
             const std::vector<std::uint64_t>& actual = {})
{
  return fd::detail::coalesce(
    e.size(), [&](std::size_t i) -> const entry_meta& { return e[i]; }, h, R,
    [&](const entry_meta& m) { return actual.at(m.slot); }, [&](std::uint64_t n) { return n <= room; });
}

TEST(D2hCoalesce, ContiguousPublishedEntriesAreOneRun)
{
  const auto e = placed(0, {100, 256, 40});
  EXPECT_EQ(run(e, 3), (run_plan{3, 112 + 256 + 40, 40, false})) << "span from the first start to the last payload end";
}

TEST(D2hCoalesce, StopsAtTheAcquiredHead)
{
  const auto e = placed(0, {100, 256, 40});
  EXPECT_EQ(run(e, 0).count, 0U) << "nothing is published: no copy";
  EXPECT_EQ(run(e, 2), (run_plan{2, 112 + 256, 256, false}));
}

TEST(D2hCoalesce, SplitsAtTheWrap)
{
  const auto e = placed(R - 512, {256, 400, 64});  // the second entry does not fit before the end: it wraps
  ASSERT_EQ(e[1].start % R, 0U);
  EXPECT_EQ(run(e, 3), (run_plan{1, 256, 256, false}));
  const std::vector<entry_meta> rest{e[1], e[2]};
  EXPECT_EQ(run(rest, 3), (run_plan{2, 400 + 64, 64, false}));
}

TEST(D2hCoalesce, AnEntryThatStartsTheRingStartsARun)
{
  // Exactly filling the ring: the next entry lands at physical 0 without padding, still a new run.
  const auto e = placed(R - 256, {256, 128});
  ASSERT_EQ(e[1].start, e[0].start + e[0].reserved);
  EXPECT_EQ(run(e, 2).count, 1U);
}

TEST(D2hCoalesce, AGapSplitsTheRun)
{
  auto e = placed(0, {64, 64});
  e[1].start += 16;  // not contiguous
  EXPECT_EQ(run(e, 2).count, 1U);
}

TEST(D2hCoalesce, ADynamicEntryEndsItsRunWithItsGpuSize)
{
  const auto e = placed(0, {64, 512, 32}, {false, true, false});
  EXPECT_EQ(run(e, 3, ~0ULL, {0, 300, 0}), (run_plan{2, 64 + 300, 300, false}));
}

TEST(D2hCoalesce, ADynamicEntryThatFilledItsBytesDoesNotEndItsRun)
{
  // capture_rows with a CPU-known count: the CPU asked for exactly the bytes the kernel wrote
  auto e = placed(0, {64, 512, 32}, {false, true, false});
  e[1].bytes = 512;
  EXPECT_EQ(run(e, 3, ~0ULL, {0, 512, 0}), (run_plan{3, 64 + 512 + 32, 32, false}));
  EXPECT_EQ(run(e, 3, ~0ULL, {0, 496, 0}), (run_plan{2, 64 + 496, 496, false})) << "short: it ends its run";
  EXPECT_EQ(run(e, 3, ~0ULL, {0, fd::selection_error_size, 0}), (run_plan{1, 64, 64, false}))
    << "a refused selection is a run of its own";
}

TEST(D2hCoalesce, AnOverflowingDynamicEntryIsARunOfItsOwnWithoutACopy)
{
  const auto e = placed(0, {64, 512, 32}, {false, true, false});
  EXPECT_EQ(run(e, 3, ~0ULL, {0, 9000, 0}), (run_plan{1, 64, 64, false})) << "the run stops before it";
  const std::vector<entry_meta> from_it{e[1], e[2]};
  EXPECT_EQ(run(from_it, 3, ~0ULL, {0, 9000, 0}), (run_plan{1, 0, 9000, true}));
}

TEST(D2hCoalesce, ARowEntryAboveItsPlannedRowsIsAnOverflowEvenInsideItsReservation)
{
  // plan()'s forward_meta::selected = 3 rows of 4 bytes: 12 bytes expected, 16 reserved (the 16-byte alignment)
  auto e = placed(0, {64, 16, 32}, {false, true, false});
  e[1].bytes = 12;
  e[1].row_bytes = 4;
  EXPECT_EQ(run(e, 3, ~0ULL, {0, 12, 0}), (run_plan{3, 64 + 16 + 32, 32, false})) << "exactly the planned rows";
  EXPECT_EQ(run(e, 3, ~0ULL, {0, 8, 0}), (run_plan{2, 64 + 8, 8, false})) << "fewer: it ends its run";
  const std::vector<entry_meta> from_it{e[1], e[2]};
  EXPECT_EQ(run(from_it, 3, ~0ULL, {0, 16, 0}), (run_plan{1, 0, 16, true})) << "a fourth row: flagged, not copied";
  e[1].row_bytes = 0;  // a dynamic entry that is not a row entry: only its reservation bounds it
  EXPECT_EQ(run(e, 3, ~0ULL, {0, 16, 0}), (run_plan{2, 64 + 16, 16, false}));
}

TEST(D2hCoalesce, StagingRoomLimitsTheRun)
{
  const auto e = placed(0, {256, 256, 256});
  EXPECT_EQ(run(e, 3, 600), (run_plan{2, 512, 256, false}));
  EXPECT_EQ(run(e, 3, 100).count, 0U) << "no room: nothing is copied";
}

TEST(D2hLaunchShape, VecsPerThreadIsNormalised)
{
  fd::config c;
  for (std::uint32_t v : {1U, 2U, 4U, 8U}) {
    c.tuning.copy_vecs_per_thread = v;
    EXPECT_EQ(fd::detail::vecs_per_thread(c), v);
  }
  for (std::uint32_t v : {0U, 3U, 16U}) {
    c.tuning.copy_vecs_per_thread = v;
    EXPECT_EQ(fd::detail::vecs_per_thread(c), 1U);
  }
}

/// The copy kernel's form: the vector width the launch shape uses from a 16-byte aligned source, the byte
/// kernel otherwise (a vector kernel on an unaligned source would fault or move the wrong bytes on the GPU).
TEST(D2hLaunchShape, CopyFormFollowsAlignmentAndVectorWidth)
{
  using fd::detail::copy_form;
  alignas(16) static std::byte buf[64];
  EXPECT_EQ(fd::detail::copy_form_of(buf, 2), copy_form::v2);
  EXPECT_EQ(fd::detail::copy_form_of(buf + 16, 8), copy_form::v8);
  EXPECT_EQ(fd::detail::copy_form_of(buf, 4), copy_form::v4);
  EXPECT_EQ(fd::detail::copy_form_of(buf, 3), copy_form::v1) << "an unsupported width is 1, as vecs_per_thread()";
  for (std::size_t off : {1U, 2U, 8U, 15U}) { EXPECT_EQ(fd::detail::copy_form_of(buf + off, 2), copy_form::bytes) << off; }
  for (std::uint32_t v : {0U, 1U, 2U, 4U, 8U, 16U}) {
    fd::config c;
    c.tuning.copy_vecs_per_thread = v;
    EXPECT_EQ(static_cast<std::uint32_t>(fd::detail::vec_form(v)), fd::detail::vecs_per_thread(c)) << v;
  }
}

/// The lean form (no pass loop, no byte tail, no size load) only where it copies every byte: a
/// static entry of a multiple of 16 bytes from an aligned source that one pass of the grid covers, copied by
/// copy_entry_kernel (not the one-block publishing kernel), and only with the knob on. The GPU kernels of
/// either form are run by every d2h_cuda test (entries of 16-byte multiples take the lean form by default).
TEST(D2hLaunchShape, LeanFormOnlyForOnePassStaticAlignedWholeVectors)
{
  using fd::detail::copy_form;
  fd::config c;
  c.tuning.copy_block_threads = 128;
  c.tuning.copy_vecs_per_thread = 2;
  const auto sh = fd::detail::copy_launch_shape(c, 2048, false, 132);
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::v2, sh, 2048, false), copy_form::v2_lean);
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::v2, sh, 2040, false), copy_form::v2) << "a byte tail";
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::v2, sh, 2048, true), copy_form::v2) << "a dynamic entry";
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::bytes, sh, 2048, false), copy_form::bytes) << "unaligned source";
  const auto one = fd::detail::copy_launch_shape(c, 2048, true, 132);
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::v2, one, 2048, false), copy_form::v2) << "the one-block kernel";
  const auto capped = fd::detail::copy_launch_shape(c, 1ULL << 30, false, 4);
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::v2, capped, 1ULL << 30, false), copy_form::v2) << "more than one pass";
  const std::uint64_t full = 64ULL * 128 * 2 * 16;  // exactly one pass of the capped grid
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::v2, capped, full, false), copy_form::v2_lean);
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::v2, capped, full + 16, false), copy_form::v2);
  for (const auto& [v, lean] : {std::pair{copy_form::v1, copy_form::v1_lean}, std::pair{copy_form::v4, copy_form::v4_lean},
                               std::pair{copy_form::v8, copy_form::v8_lean}}) {
    c.tuning.copy_vecs_per_thread = static_cast<std::uint32_t>(v);
    EXPECT_EQ(fd::detail::lean_form(c, v, fd::detail::copy_launch_shape(c, 4096, false, 132), 4096, false), lean);
  }
  c.tuning.lean_copy_kernel = false;
  EXPECT_EQ(fd::detail::lean_form(c, copy_form::v2, sh, 2048, false), copy_form::v2) << "knob off";
}

TEST(D2hLaunchShape, OneBlockForSmallEntriesAndFusedBatchEnds)
{
  fd::config c;
  c.tuning.single_block_copy_max_bytes = 1024;
  c.tuning.fused_copy_max_bytes = 32 << 10;
  EXPECT_TRUE(fd::detail::one_block_copy(c, 1024, false));
  EXPECT_FALSE(fd::detail::one_block_copy(c, 1040, false));
  EXPECT_TRUE(fd::detail::one_block_copy(c, 32 << 10, true));
  EXPECT_FALSE(fd::detail::one_block_copy(c, (32 << 10) + 16, true));
}

TEST(D2hLaunchShape, OneBlockHasEnoughThreadsForOnePass)
{
  fd::config c;
  c.tuning.copy_vecs_per_thread = 2;
  EXPECT_EQ(fd::detail::copy_launch_shape(c, 16, true, 132), (fd::detail::launch_shape{true, 1, 32, 2}));
  EXPECT_EQ(fd::detail::copy_launch_shape(c, 16 * 2 * 100, true, 132), (fd::detail::launch_shape{true, 1, 128, 2}));
  EXPECT_EQ(fd::detail::copy_launch_shape(c, 1 << 30, true, 132), (fd::detail::launch_shape{true, 1, 1024, 2}));
}

TEST(D2hLaunchShape, GridCoversOnePassUpToOneWave)
{
  fd::config c;
  c.tuning.copy_block_threads = 128;
  c.tuning.copy_vecs_per_thread = 2;
  // 64 KiB = 4096 vectors = 2048 per-thread units = 16 blocks of 128.
  EXPECT_EQ(fd::detail::copy_launch_shape(c, 64 << 10, false, 132), (fd::detail::launch_shape{false, 16, 128, 2}));
  // Capped at sm_count x (2048 / 128) blocks.
  EXPECT_EQ(fd::detail::copy_launch_shape(c, 1ULL << 30, false, 4), (fd::detail::launch_shape{false, 64, 128, 2}));
  c.tuning.copy_block_threads = 100;  // rounded up to a warp multiple
  EXPECT_EQ(fd::detail::copy_launch_shape(c, 16, false, 0).threads, 128U);
  EXPECT_EQ(fd::detail::copy_launch_shape(c, 16, false, 0).blocks, 1U);
}

}  // namespace

namespace {

/// The place_phys chain the CPU's place() mirrors, entry by entry (the definition gather_offset replaces).
std::uint64_t chain_offset(const fd::detail::gather_args& a, std::uint64_t phys, std::uint32_t i)
{
  std::uint64_t off = 0;
  for (std::uint32_t k = 0; k <= i; ++k) {
    const std::uint64_t r = fd::align_up(a.e[k].bytes, fd::entry_alignment);
    off = fd::place_phys(phys, r, a.dst.ring_bytes);
    phys = off + r == a.dst.ring_bytes ? 0 : off + r;
  }
  return off;
}

}  // namespace

// The gather's closed-form placement equals the chain for every entry and the batch's end, for batches
// that wrap by a skip, end exactly at the ring's end, start at 0, or do not wrap (every block of a gather
// computes its entry's offset from it; a wrong case would put an entry where the FIFO does not say).
TEST(D2hGatherPlacement, ClosedFormEqualsThePlacePhysChain)
{
  std::mt19937_64 rng{7};
  std::uint64_t cases = 0, wrapped = 0, exact = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    fd::detail::gather_args a{};
    a.dst.ring_bytes = 256 * (1 + rng() % 64);
    const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % fd::detail::gather_max_entries);
    std::vector<std::uint64_t> bytes;
    std::uint64_t sum = 0, mx = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint64_t b = 1 + rng() % (iter % 3 == 0 ? 64 : 600);
      const std::uint64_t r = fd::align_up(b, fd::entry_alignment);
      if (sum + r + std::max(mx, r) > a.dst.ring_bytes) { break; }  // deferred_batch::needs_flush_before
      bytes.push_back(b);
      sum += r;
      mx = std::max(mx, r);
    }
    if (bytes.empty()) { continue; }
    fd::detail::set_gather_entries(a, static_cast<std::uint32_t>(bytes.size()),
                                   [&](std::uint32_t i) { return fd::detail::gather_entry{nullptr, bytes[i]}; });
    std::uint64_t phys = fd::entry_alignment * (rng() % (a.dst.ring_bytes / fd::entry_alignment));
    if (iter % 5 == 0) { phys = a.dst.ring_bytes - a.pre[1 + rng() % a.n]; }  // an entry ends exactly at the end
    if (phys >= a.dst.ring_bytes) { phys = 0; }
    for (std::uint32_t i = 0; i < a.n; ++i) {
      ASSERT_EQ(fk::gather_offset(a, phys, i), chain_offset(a, phys, i))
        << "entry " << i << " of " << a.n << ", phys " << phys << ", ring " << a.dst.ring_bytes;
    }
    const std::uint64_t last = chain_offset(a, phys, a.n - 1) + (a.pre[a.n] - a.pre[a.n - 1]);
    ASSERT_EQ(fk::gather_end(a, phys), last == a.dst.ring_bytes ? 0 : last);
    ++cases;
    wrapped += phys + a.pre[a.n] > a.dst.ring_bytes ? 1 : 0;
    for (std::uint32_t k = 1; k < a.n; ++k) { exact += phys + a.pre[k] == a.dst.ring_bytes ? 1 : 0; }
  }
  EXPECT_GT(cases, 10000U);
  EXPECT_GT(wrapped, 1000U) << "batches that wrap inside";
  EXPECT_GT(exact, 500U) << "batches with an entry ending exactly at the ring's end";
}

// The block -> entry lookup (one block per entry, or a binary search) agrees with the first_block ranges.
TEST(D2hGatherPlacement, EveryBlockFindsItsEntry)
{
  std::mt19937_64 rng{11};
  for (int iter = 0; iter < 2000; ++iter) {
    fd::detail::gather_args a{};
    a.n = 1 + static_cast<std::uint32_t>(rng() % fd::detail::gather_max_entries);
    for (std::uint32_t i = 0; i < a.n; ++i) { a.e[i].bytes = iter % 2 == 0 ? 64 : 1 + rng() % (1 << 20); }
    fd::config cfg;
    const auto sh = fd::detail::apportion_gather(cfg, a, 132);
    ASSERT_EQ(sh.blocks, a.first_block[a.n]);
    for (std::uint32_t blk = 0; blk < sh.blocks; ++blk) {
      const std::uint32_t i = fk::gather_entry_of(a, blk);
      ASSERT_LT(i, a.n);
      ASSERT_LE(a.first_block[i], blk);
      ASSERT_LT(blk, a.first_block[i + 1]) << "block " << blk << " of " << sh.blocks << ", entry " << i;
    }
  }
}

// The prefix lookup of both gathers (prefix_find: a block's entry in first_block, a work item's entry in cpre)
// agrees with a linear search, with and without the one-position-per-range shortcut.
TEST(D2hGatherPlacement, PrefixFindAgreesWithALinearSearch)
{
  std::mt19937_64 rng{17};
  for (int iter = 0; iter < 2000; ++iter) {
    std::uint32_t pre[fd::detail::gather_max_entries + 1]{};
    const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % fd::detail::gather_max_entries);
    for (std::uint32_t i = 0; i < n; ++i) { pre[i + 1] = pre[i] + (iter % 3 == 0 ? 1 : 1 + static_cast<std::uint32_t>(rng() % 9)); }
    for (std::uint32_t u = 0; u < pre[n]; ++u) {
      std::uint32_t want = 0;
      while (pre[want + 1] <= u) { ++want; }
      ASSERT_EQ(ferry::kernels::prefix_find(pre, n, u), want) << "position " << u << " of " << pre[n] << ", " << n << " ranges";
    }
  }
}

namespace {
/// A row batch of `row_bytes` (sources at `src_of(i)`) sharing `sel`, laid out as producer::launch_deferred lays
/// it out: set_gather_rows with each entry's row_reserved of the selection's bound.
template <class SrcOf>
fd::detail::gather_rows_args row_batch_of(const fd::row_selection& sel, const std::vector<std::uint64_t>& row_bytes,
                                          SrcOf&& src_of)
{
  fd::detail::gather_rows_args a{};
  a.sel = sel;
  fd::detail::set_gather_rows(a, static_cast<std::uint32_t>(row_bytes.size()), [&](std::uint32_t i) {
    return fd::detail::gather_row_entry{src_of(i), row_bytes[i],
                                        fd::detail::row_reserved(sel.item_bound(), sel.rows_per_item(), row_bytes[i])};
  });
  return a;
}
const std::byte* fake_src(std::uintptr_t at) { return reinterpret_cast<const std::byte*>(at); }
}  // namespace

// rows_shape of a row batch (gather_rows_publish): every row in chunks of at most row_gather_chunk, the closed
// form and the 16-byte moves only where every row (and source) allows them, whole warps up to the widest chunk's
// vectors, one block per work item up to one wave; set_gather_rows' prefix sums are the entries' reservations.
TEST(D2hGatherShape, RowsShapeCoversEveryChunkOfEveryRowInOneWave)
{
  namespace rules = ferry::detail::launch_rules;
  std::mt19937_64 rng{19};
  std::uint64_t split = 0, vec = 0, capped = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    fd::config cfg;
    cfg.tuning.copy_block_threads = 32U << (rng() % 6);  // 32 .. 1024
    const int sms = 1 + static_cast<int>(rng() % 132);
    const bool aligned = iter % 2 == 0;
    fd::row_selection sel = fd::row_selection::rows(static_cast<const std::int32_t*>(nullptr), rng() % 64);
    if (iter % 3 == 1) { sel = fd::row_selection::window(nullptr, 4, nullptr, rng() % 8, 0, 1 + static_cast<std::int64_t>(rng() % 4)); }
    static const std::int32_t device_count = 0;  // never read: the shape takes the bound
    if (iter % 5 == 2) { sel = sel.counted_on_device(&device_count, rng() % 32); }
    std::vector<std::uint64_t> rb(1 + rng() % fd::detail::gather_max_entries);
    for (auto& b : rb) {
      b = rng() % 4 == 0 ? 16 * (1 + rng() % 5000) : 16 * (1 + rng() % 64);  // some wider than a chunk
      if (!aligned && rng() % 2 == 0) { b += 1 + rng() % 15; }
    }
    auto a = row_batch_of(sel, rb, [&](std::uint32_t i) { return fake_src(0x10000 * (i + 1) + (aligned ? 0 : 8 * (i % 2))); });
    const fd::detail::gather_shape sh = fd::detail::rows_shape(cfg, a, sms);
    const std::uint64_t cap = rules::block_threads(cfg.tuning.copy_block_threads);
    ASSERT_EQ(a.chunk_bytes, fd::detail::row_gather_chunk);
    ASSERT_EQ(a.chunk_bytes % 16, 0U);
    bool all16 = true, all_vec = true;
    std::uint64_t r16 = 0, widest = 0;
    ASSERT_EQ(a.cpre[0], 0U);
    ASSERT_EQ(a.pre[0], 0U);
    for (std::uint32_t i = 0; i < a.n; ++i) {
      const std::uint64_t chunks = a.cpre[i + 1] - a.cpre[i];
      ASSERT_GE(chunks * a.chunk_bytes, rb[i]) << "entry " << i << ": every byte of a row in a chunk";
      ASSERT_LT((chunks - 1) * a.chunk_bytes, rb[i]) << "entry " << i << ": no empty chunk";
      split += chunks > 1 ? 1 : 0;
      ASSERT_EQ(a.row_bytes[i], rb[i]);
      ASSERT_EQ(a.pre[i + 1] - a.pre[i], fd::detail::row_reserved(sel.item_bound(), sel.rows_per_item(), rb[i]));
      if (all16 && a.rpre16_ok != 0) { ASSERT_EQ(a.rpre16[i], r16) << "entry " << i; }
      all16 = all16 && rb[i] % 16 == 0;
      all_vec = all_vec && rb[i] % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.src[i]) % 16 == 0;
      r16 += rb[i] / 16;
      widest = std::max(widest, std::min<std::uint64_t>(rb[i], fd::detail::row_gather_chunk));
    }
    ASSERT_EQ(a.rpre16_ok != 0, all16) << "the closed form exactly where every row is a 16-byte multiple (sums fit)";
    ASSERT_EQ(a.vec != 0, all_vec);
    vec += all_vec ? 1 : 0;
    ASSERT_EQ(sh.threads % 32, 0U);
    ASSERT_GE(sh.threads, 32U);
    ASSERT_LE(sh.threads, cap);
    if (sh.threads < cap) {
      ASSERT_GE(sh.threads * 16ULL, widest / 16 * 16) << "a block covers the widest chunk's vectors in one step";
      ASSERT_LT((sh.threads - 32) * 16ULL, std::max<std::uint64_t>(widest / 16 * 16, 16)) << "and is no wider";
    } else {
      ++capped;
    }
    const std::uint64_t work = std::uint64_t{a.cpre[a.n]} * sel.item_bound() * sel.rows_per_item();
    const std::uint64_t wave = rules::one_wave_blocks(sms, sh.threads);
    ASSERT_GE(sh.blocks, 1U);
    ASSERT_LE(sh.blocks, wave) << "one wave at most";
    ASSERT_EQ(sh.blocks, std::max<std::uint64_t>(1, std::min(work, wave))) << "a block per work item up to the wave";
  }
  EXPECT_GT(split, 1000U) << "rows wider than a chunk";
  EXPECT_GT(vec, 500U) << "batches of 16-byte moves";
  EXPECT_GT(capped, 500U) << "blocks capped at copy_block_threads";
}

// The closed form of the planned prefix sums (rpre16) is refused where the sums of row_bytes / 16 leave 32 bits,
// however aligned the rows are; a batch of 16-byte rows is 32 threads wide.
TEST(D2hGatherShape, RowsShapeRefusesTheClosedFormPast32Bits)
{
  const fd::row_selection sel = fd::row_selection::rows(static_cast<const std::int32_t*>(nullptr), 3);
  fd::config cfg;
  auto wide = row_batch_of(sel, std::vector<std::uint64_t>(fd::detail::gather_max_entries, 1ULL << 31),
                           [](std::uint32_t i) { return fake_src(0x10000 * (i + 1)); });
  (void)fd::detail::rows_shape(cfg, wide, 132);
  EXPECT_EQ(wide.rpre16_ok, 0U);
  EXPECT_EQ(wide.vec, 1U);
  EXPECT_EQ(wide.cpre[1], (1U << 31) / fd::detail::row_gather_chunk);
  auto narrow = row_batch_of(sel, {16, 16}, [](std::uint32_t i) { return fake_src(0x10000 * (i + 1)); });
  const fd::detail::gather_shape sh = fd::detail::rows_shape(cfg, narrow, 132);
  EXPECT_EQ(narrow.rpre16_ok, 1U);
  EXPECT_EQ(narrow.rpre16[2], 2U);
  EXPECT_EQ(sh.threads, 32U);
  EXPECT_EQ(sh.blocks, 6U) << "2 entries x 3 rows x 1 chunk";
}

// rows_shape of one selected entry (select_rows, capture_rows): copy_block_threads threads, one block per row of
// the selection's bound up to one wave (at least one: an empty selection still commits its entry), 16-byte moves
// only for an aligned source with 16-byte multiple rows.
TEST(D2hGatherShape, RowsShapeOfOneSelectedEntry)
{
  namespace rules = ferry::detail::launch_rules;
  std::mt19937_64 rng{23};
  for (int iter = 0; iter < 2000; ++iter) {
    fd::config cfg;
    cfg.tuning.copy_block_threads = 32U << (rng() % 6);
    const int sms = 1 + static_cast<int>(rng() % 132);
    fd::detail::select_args a;
    a.sel = iter % 2 == 0 ? fd::row_selection::rows(static_cast<const std::int32_t*>(nullptr), rng() % 100000)
                          : fd::row_selection::window(nullptr, 4, nullptr, rng() % 64, 1, 2 + static_cast<std::int64_t>(rng() % 6));
    a.row_bytes = 1 + rng() % 4096;
    a.src = fake_src(0x10000 + (rng() % 2) * 8);
    const fd::detail::gather_shape sh = fd::detail::rows_shape(cfg, a, sms);
    const std::uint64_t rows = a.sel.item_bound() * a.sel.rows_per_item();
    ASSERT_EQ(sh.threads, rules::block_threads(cfg.tuning.copy_block_threads));
    ASSERT_EQ(sh.blocks, std::max<std::uint64_t>(1, std::min(rows, rules::one_wave_blocks(sms, sh.threads))));
    ASSERT_EQ(a.vec != 0, a.row_bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.src) % 16 == 0);
  }
}

// A replay's planned row batch (forward_meta::selected = items): the layout every block of gather_rows_publish
// computes (rows_layout: the closed form when every row is a 16-byte multiple, else the summed reservations) puts
// each entry where the CPU's place() chain over row_reserved puts it (plan()), and ends where it ends.
TEST(D2hGatherPlacement, PlannedRowLayoutEqualsThePlaceChainOfPlannedReservations)
{
  std::mt19937_64 rng{13};
  std::uint64_t cases = 0, wrapped = 0, closed = 0;
  fd::device_state st{};
  for (int iter = 0; iter < 20000; ++iter) {
    fd::detail::gather_rows_args a{};
    a.dst.state = &st;
    a.dst.ring_bytes = 256 * (1 + rng() % 64);
    a.planned = 1;
    a.sel = fd::row_selection::rows(static_cast<const std::int32_t*>(nullptr), 1 + rng() % 8);
    if (iter % 4 == 1) { a.sel = fd::row_selection::window(nullptr, 4, nullptr, 1 + rng() % 8, 0, 1 + static_cast<std::int64_t>(rng() % 3)); }
    const std::uint64_t per = a.sel.rows_per_item(), items = a.sel.item_bound();
    const bool aligned = iter % 2 == 0;
    std::uint64_t sum = 0, mx = 0;
    a.rpre16_ok = aligned ? 1U : 0U;
    for (std::uint32_t i = 0; i < fd::detail::gather_max_entries; ++i) {
      const std::uint64_t rb = aligned ? 16 * (1 + rng() % 8) : 1 + rng() % 100;
      const std::uint64_t r = fd::align_up(std::max<std::uint64_t>(items * per * rb, 16), 16);  // the captured bound
      if (sum + r + std::max(mx, r) > a.dst.ring_bytes) { break; }  // deferred_batch::needs_flush_before
      a.row_bytes[i] = static_cast<std::uint32_t>(rb);
      a.pre[i + 1] = a.pre[i] + r;
      a.rpre16[i + 1] = a.rpre16[i] + static_cast<std::uint32_t>(rb / 16);
      ++a.n;
      sum += r;
      mx = std::max(mx, r);
    }
    if (a.n == 0) { continue; }
    st.planned_items = rng() % (items + 1);  // what plan() gave: at most the bound
    std::uint64_t sums[fd::detail::gather_max_entries + 1];
    const fk::rows_layout l = fk::gather_rows_layout(a, items * per, sums, true);
    std::uint64_t phys = fd::entry_alignment * (rng() % (a.dst.ring_bytes / fd::entry_alignment));
    std::uint64_t pos = phys;  // the CPU's chain, in virtual positions from phys
    for (std::uint32_t i = 0; i < a.n; ++i) {
      const std::uint64_t r = fd::detail::row_reserved(st.planned_items, per, a.row_bytes[i]);
      const fd::placement p = fd::place(pos, r, a.dst.ring_bytes);
      ASSERT_EQ(fk::gather_offset(fk::rows_view_of(a, l), phys, i), p.start % a.dst.ring_bytes)
        << "entry " << i << " of " << a.n << ", phys " << phys << ", ring " << a.dst.ring_bytes << ", items "
        << st.planned_items << (aligned ? " (closed form)" : " (summed)");
      wrapped += p.start != pos ? 1 : 0;
      pos = p.end;
    }
    ASSERT_EQ(fk::gather_end(fk::rows_view_of(a, l), phys), pos % a.dst.ring_bytes);
    EXPECT_EQ(l.limit, std::min(items * per, st.planned_items * per));
    ++cases;
    closed += aligned && st.planned_items != 0 ? 1 : 0;
  }
  EXPECT_GT(cases, 10000U);
  EXPECT_GT(wrapped, 1000U) << "batches that wrap inside";
  EXPECT_GT(closed, 3000U) << "batches placed in closed form";
}
