// SPDX-License-Identifier: Apache-2.0
// The H2D publication contract, one typed suite for every backend: host and faulty<host> (CI, label host),
// cuda and faulty<cuda> (H200, label gpu, FERRY_REQUIRE_GPU=1). Every test can fail: each checks exact
// device bytes against a host model of what must be there (published prefix, untouched tail, poison).
#pragma once

#include "support/gpu.hpp"

#include <ferry/backend.hpp>
#include <ferry/backend/probe.hpp>
#include <ferry/testing/pattern.hpp>
#include <ferry/h2d.hpp>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace ferry::test::h2d {

namespace fb = ferry::backend;
namespace fh = ferry::h2d;

template <class B>
constexpr bool is_faulty = false;
template <class X>
constexpr bool is_faulty<fb::faulty<X>> = true;

constexpr std::uint8_t poison = 0xEE;

/// Random, never-zero bytes derived from (seed, i).
inline std::uint8_t data_byte(std::uint64_t seed, std::size_t i)
{
  const auto v = ferry::testing::pattern_byte(seed, i);
  return v == 0 ? std::uint8_t{0x5A} : v;
}

inline const std::array<fh::upload_backend, 5> all_backends{fh::upload_backend::direct, fh::upload_backend::batch,
                                                            fh::upload_backend::packed, fh::upload_backend::zerocopy,
                                                            fh::upload_backend::automatic};

template <class B>
class H2d : public ::testing::Test {
 protected:
  void SetUp() override
  {
    FERRY_REQUIRE_DEVICE(B{}.device_count());
    owner.emplace(b);
    aux.emplace(b);
  }
  void TearDown() override
  {
    if constexpr (std::is_same_v<typename B::tag, fb::host_tag>) { fb::host_backend::set_jitter({}); }
  }

  static void jitter(int us)
  {
    if constexpr (std::is_same_v<typename B::tag, fb::host_tag>) { fb::host_backend::set_jitter(std::chrono::microseconds{us}); }
  }

  /// The standard mixed-unit declaration: `step` (5 members) covers `tokens` (1 member) and `sampling` (2).
  struct mixed {
    fh::buffer_handle ids, positions, bf16, mask, table;
  };
  mixed declare_mixed(fh::publisher<B>& pub)
  {
    mixed m;
    m.ids = pub.declare({.name = "input_ids", .groups = {"step", "tokens"}, .unit = fh::count_unit::elements,
                         .element_size = 4, .capacity = 64});
    m.positions = pub.declare({.name = "positions", .groups = {"step"}, .unit = fh::count_unit::elements,
                               .element_size = 8, .capacity = 64});
    m.bf16 = pub.declare({.name = "temperature_bf16", .groups = {"step", "sampling"}, .unit = fh::count_unit::bytes,
                          .element_size = 1, .capacity = 2 * 64});
    m.mask = pub.declare({.name = "is_greedy_bool", .groups = {"step", "sampling"}, .unit = fh::count_unit::bytes,
                          .element_size = 1, .capacity = 61});
    m.table = pub.declare({.name = "block_table", .groups = {"step"}, .unit = fh::count_unit::rows, .element_size = 4,
                           .row_size = 4 * 9, .capacity = 300});
    remember(pub, m);
    return m;
  }

  void init(fh::publisher<B>& pub, fh::upload_backend k, std::size_t slots = 2)
  {
    fh::config c;
    c.slots = slots;
    c.backend = k;
    c.device = b.current_device();
    c.calibration_iterations = 3;
    c.tile_bytes = knob_tile_bytes;
    c.threads_per_tile = knob_threads;
    c.speculation = knob_speculation;
    pub.initialize(c, owner->view());
  }
  // Scatter knobs used by init() (tests of the tile / speculation paths change them).
  std::size_t knob_tile_bytes{fh::config{}.tile_bytes};
  std::uint32_t knob_threads{fh::config{}.threads_per_tile};
  int knob_speculation{-1};

  /// Host model of each buffer's device bytes.
  struct model {
    std::map<std::uint32_t, std::vector<std::uint8_t>> bytes;
  };

  void poison_all(fh::publisher<B>& pub, model& md, std::initializer_list<fh::buffer_handle> bufs)
  {
    for (auto h : bufs) {
      const auto n = pub.capacity_bytes(h);
      b.memset_async(pub.device_pointer(h), poison, n, owner->handle());
      md.bytes[h.value].assign(n, poison);
    }
    owner->synchronize();
  }

  /// The standard mixed group, initialized with backend `k` and every destination poisoned (recorded in md).
  mixed prepare(fh::publisher<B>& pub, fh::upload_backend k, model& md, std::size_t slots = 2)
  {
    auto m = declare_mixed(pub);
    init(pub, k, slots);
    poison_all(pub, md, {m.ids, m.positions, m.bf16, m.mask, m.table});
    return m;
  }

  /// One captured graph per runner slot, each uploading group "step" from that slot (replay graphs[slot]).
  std::vector<fb::graph_exec<B>> step_graphs(fh::publisher<B>& pub, std::size_t slots = 2)
  {
    std::vector<fb::graph_exec<B>> graphs;
    for (std::size_t slot = 0; slot < slots; ++slot) {
      graphs.push_back(fb::graph_exec<B>::capture(owner->view(), [&](fb::stream_view<B> s) {
        pub.capture_upload("step", slot, s);
      }));
    }
    return graphs;
  }

  /// Counts of the standard "step" publication for batch size n (mask capped at its capacity).
  static std::vector<std::pair<fh::buffer_handle, std::size_t>> step_counts(const mixed& m, std::size_t n)
  {
    return {{m.ids, n}, {m.positions, n}, {m.bf16, 2 * n}, {m.mask, std::min<std::size_t>(n, 61)}, {m.table, 4 * n}};
  }

  /// Producer work: fills `count` units of each buffer with data from `seed` and sets the count.
  void produce(fh::publisher<B>& pub, std::string_view group, model* md,
               const std::vector<std::pair<fh::buffer_handle, std::size_t>>& counts, std::uint64_t seed)
  {
    auto p = pub.producer(group);
    for (auto [h, n] : counts) {
      auto src = p.template source<std::uint8_t>(h);
      const std::size_t unit = pub.capacity_bytes(h) / capacity_units(pub, h);
      const std::size_t bytes = n * unit;
      for (std::size_t i = 0; i < bytes; ++i) { src[i] = data_byte(seed + h.value * 1000003ULL, i); }
      p.set_count(h, n);
      if (md != nullptr) {
        auto& v = md->bytes[h.value];
        for (std::size_t i = 0; i < bytes; ++i) { v[i] = src[i]; }
      }
    }
  }
  std::size_t capacity_units(fh::publisher<B>&, fh::buffer_handle h) { return units.at(h.value); }

  std::vector<std::uint8_t> read_back(const void* dev, std::size_t n)
  {
    fb::pinned_buffer<B> tmp{std::max<std::size_t>(n, 16), b};
    b.memcpy_async(tmp.data(), dev, n, fb::memcpy_kind::device_to_host, aux->handle());
    aux->synchronize();
    std::vector<std::uint8_t> v(n);
    std::memcpy(v.data(), tmp.data(), n);
    return v;
  }

  void expect_model(fh::publisher<B>& pub, const model& md, const char* where)
  {
    owner->synchronize();
    for (const auto& [id, want] : md.bytes) {
      const auto got = read_back(pub.device_pointer(fh::buffer_handle{id}), want.size());
      std::size_t bad = 0, first = want.size();
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (got[i] != want[i]) {
          ++bad;
          first = std::min(first, i);
        }
      }
      EXPECT_EQ(bad, 0U) << where << ": buffer #" << id << " first mismatch at byte " << first;
    }
  }

  std::vector<std::uint8_t> device_image(fh::publisher<B>& pub, const model& md)
  {
    owner->synchronize();
    std::vector<std::uint8_t> all;
    for (const auto& [id, want] : md.bytes) {
      auto v = read_back(pub.device_pointer(fh::buffer_handle{id}), want.size());
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }

  /// Remembers capacities in units (the suite declares them).
  void remember(fh::publisher<B>& pub, const mixed& m)
  {
    (void)pub;
    units[m.ids.value] = 64;
    units[m.positions.value] = 64;
    units[m.bf16.value] = 128;
    units[m.mask.value] = 61;
    units[m.table.value] = 300;
  }

  /// A full standard cycle on `slot` publishing `step` with the given counts.
  void step_cycle(fh::publisher<B>& pub, const mixed& m, model& md, std::size_t slot, std::size_t batch,
                  std::uint64_t seed)
  {
    auto s = pub.begin(slot);
    produce(pub, "step", &md, this->step_counts(m, batch), seed);
    pub.publish("step", owner->view());
    s.finish();
  }

  B b{};
  std::optional<fb::stream<B>> owner;  // declared before every publisher: outlives them
  std::optional<fb::stream<B>> aux;
  std::map<std::uint32_t, std::size_t> units;
};

TYPED_TEST_SUITE_P(H2d);

// ---- exact values, units, tails ------------------------------------------------------------------------

TYPED_TEST_P(H2d, ExactValuesForEveryBackendAndUnit)
{
  using B = TypeParam;
  for (auto k : all_backends) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    auto m = this->declare_mixed(pub);
    this->init(pub, k);
    EXPECT_EQ(pub.info("step").arena_bytes > 0, k != fh::upload_backend::direct);
    typename TestFixture::model md;
    this->poison_all(pub, md, {m.ids, m.positions, m.bf16, m.mask, m.table});
    for (std::size_t round = 0; round < 4; ++round) {
      this->step_cycle(pub, m, md, round % 2, 7 + round * 13, 100 + round);
      this->expect_model(pub, md, "after publish");
    }
  }
}

TYPED_TEST_P(H2d, UntouchedTailsAndChangingBatchSizes)
{
  using B = TypeParam;
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    // Shrinking and growing batches: bytes past each prefix keep what the last longer publication left.
    const std::size_t sizes[] = {64, 3, 40, 1, 0, 17, 64, 2};
    std::uint64_t seed = 7;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      this->step_cycle(pub, m, md, i % 2, sizes[i], ++seed);
      this->expect_model(pub, md, "batch size change");
    }
  }
}

TYPED_TEST_P(H2d, GraphPaddingIsPublished)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  // 5 real requests padded to the captured graph batch of 8: padding rows are producer data too.
  auto s = pub.begin(0);
  {
    auto p = pub.producer("step");
    auto ids = p.template source<std::int32_t>(m.ids);
    for (int i = 0; i < 8; ++i) { ids[static_cast<std::size_t>(i)] = i < 5 ? 1000 + i : -1; }
    auto pos = p.template source<std::int64_t>(m.positions);
    for (int i = 0; i < 8; ++i) { pos[static_cast<std::size_t>(i)] = i < 5 ? 77 * i : 0; }
    p.set_count(m.ids, 8);
    p.set_count(m.positions, 8);
    p.set_count(m.bf16, 0);
    p.set_count(m.mask, 0);
    p.set_count(m.table, 0);
  }
  pub.publish("step", this->owner->view());
  s.finish();
  this->owner->synchronize();
  auto ids = this->read_back(pub.device_pointer(m.ids), 8 * 4);
  auto pos = this->read_back(pub.device_pointer(m.positions), 8 * 8);
  for (int i = 0; i < 8; ++i) {
    std::int32_t v;
    std::memcpy(&v, ids.data() + 4 * i, 4);
    EXPECT_EQ(v, i < 5 ? 1000 + i : -1);
    std::int64_t w;
    std::memcpy(&w, pos.data() + 8 * i, 8);
    EXPECT_EQ(w, i < 5 ? 77 * i : 0);
  }
  auto tail = this->read_back(pub.device_pointer(m.ids), 64 * 4);
  for (std::size_t i = 8 * 4; i < tail.size(); ++i) { ASSERT_EQ(tail[i], poison) << i; }
}

// ---- slots, epochs, source reuse ----------------------------------------------------------------------

TYPED_TEST_P(H2d, DelayedSourceReuseMakesBeginWait)
{
  using B = TypeParam;
  this->jitter(30);
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    // Stall the owner stream: a kernel spins until the CPU releases the flag.
    fb::mapped_buffer<B> flag{64, this->b};
    fb::device_buffer<B> sink{64, this->b};
    auto* f = flag.template as<std::uint64_t>();
    fb::host_store_release(f, 0);
    this->b.launch(fb::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {32}, 0},
                   this->owner->handle(), static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()),
                   std::uint64_t{1}, static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()),
                   sink.template as<std::uint64_t>(), std::uint64_t{1});
    auto first = md;
    this->step_cycle(pub, m, first, 0, 33, 500);  // queued behind the stall
    this->step_cycle(pub, m, first, 1, 20, 600);  // slot 1: no wait needed
    std::thread releaser{[f] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      fb::host_store_release(f, 1);
    }};
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto s = pub.begin(0);  // must wait until slot 0's uploads have read their sources
      const auto waited = std::chrono::steady_clock::now() - t0;
      EXPECT_GE(waited, std::chrono::milliseconds(100)) << "begin() did not wait for source reuse";
      // The producer now overwrites slot 0's sources; the earlier upload must already have its bytes.
      typename TestFixture::model scratch = first;
      this->produce(pub, "step", &scratch,
                    {{m.ids, 64}, {m.positions, 64}, {m.bf16, 128}, {m.mask, 61}, {m.table, 300}}, 999);
      releaser.join();
      this->expect_model(pub, first, "slot 0 sources rewritten after begin()");
      pub.publish("step", this->owner->view());
      s.finish();
      this->expect_model(pub, scratch, "third publication");
    }
  }
}

TYPED_TEST_P(H2d, PipelineRotationOverThreeSlots)
{
  using B = TypeParam;
  this->jitter(20);
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md, 3);
  // Back to back without any CPU synchronization: each slot's sources stay intact until its upload read them.
  for (std::size_t step = 0; step < 12; ++step) { this->step_cycle(pub, m, md, step % 3, 1 + (step * 5) % 64, 40 + step); }
  this->expect_model(pub, md, "after rotation");
  EXPECT_THROW((void)pub.begin(3), ferry::logic_error);
}

TYPED_TEST_P(H2d, TwoBatchOverlapResumesTheSameEpoch)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  auto a = pub.declare({.name = "ub0_ids", .groups = {"ubatch0"}, .unit = fh::count_unit::elements, .element_size = 4, .capacity = 32});
  auto a2 = pub.declare({.name = "ub0_pos", .groups = {"ubatch0"}, .unit = fh::count_unit::elements, .element_size = 8, .capacity = 32});
  auto c = pub.declare({.name = "ub1_ids", .groups = {"ubatch1"}, .unit = fh::count_unit::elements, .element_size = 4, .capacity = 32});
  auto c2 = pub.declare({.name = "ub1_pos", .groups = {"ubatch1"}, .unit = fh::count_unit::elements, .element_size = 8, .capacity = 32});
  this->units = {{a.value, 32}, {a2.value, 32}, {c.value, 32}, {c2.value, 32}};
  this->init(pub, fh::upload_backend::packed);
  typename TestFixture::model md;
  this->poison_all(pub, md, {a, a2, c, c2});
  std::uint64_t epoch = 0;
  {
    auto s = pub.begin(0);
    epoch = s.epoch();
    this->produce(pub, "ubatch0", &md, {{a, 10}, {a2, 10}}, 1);
    pub.publish("ubatch0", this->owner->view());
    s.finish();
  }
  {
    auto s = pub.resume(0);  // late preparation of the second micro-batch
    EXPECT_EQ(s.epoch(), epoch);
    EXPECT_THROW((void)pub.producer("ubatch0"), ferry::logic_error) << "ubatch0 is already published this epoch";
    this->produce(pub, "ubatch1", &md, {{c, 12}, {c2, 5}}, 2);
    pub.publish("ubatch1", this->owner->view());
    EXPECT_THROW(pub.publish("ubatch0", this->owner->view()), ferry::logic_error);
    s.finish();  // records completion again
  }
  this->expect_model(pub, md, "tbo");
  {
    auto s = pub.begin(0);  // a new epoch: both groups may publish again
    EXPECT_GT(s.epoch(), epoch);
    this->produce(pub, "ubatch0", &md, {{a, 3}, {a2, 4}}, 3);
    pub.publish("ubatch0", this->owner->view());
  }  // the guard's destructor finishes the epoch
  this->expect_model(pub, md, "next epoch");
}

// ---- producers ------------------------------------------------------------------------------------------

TYPED_TEST_P(H2d, ProducerReentryIsRejectedAndSourcesStayIntact)
{
  using B = TypeParam;
  this->jitter(20);
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  auto s = pub.begin(0);
  {
    auto p = pub.producer("step");
    // Nested reentry while the first producer is open: rejected.
    EXPECT_THROW((void)pub.producer("step"), ferry::logic_error);
    EXPECT_THROW((void)pub.producer("tokens"), ferry::logic_error) << "tokens shares input_ids with the open producer";
  }
  this->produce(pub, "step", &md, {{m.ids, 9}, {m.positions, 9}, {m.bf16, 18}, {m.mask, 9}, {m.table, 36}}, 11);
  std::vector<std::uint8_t> before;
  {
    // Snapshot the sources through a fresh producer is impossible now (reentry); snapshot via the model.
    before = md.bytes[m.ids.value];
  }
  pub.publish("step", this->owner->view());
  // Reentry after publication, directly and through the covered group whose upload went through `step`.
  try {
    (void)pub.producer("step");
    ADD_FAILURE() << "reentry after publication accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("reentry rejected"), std::string::npos) << e.what();
    EXPECT_NE(std::string{e.what()}.find("'step'"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)pub.producer("tokens"), ferry::logic_error);
  EXPECT_THROW((void)pub.producer("sampling"), ferry::logic_error);
  EXPECT_THROW(pub.set_count(m.ids, 3), ferry::logic_error);
  s.finish();
  this->expect_model(pub, md, "after rejected reentry");
  // A stale guard (from a finished epoch) is refused too.
  auto s2 = pub.begin(1);
  auto p2 = pub.producer("tokens");
  s2.finish();
  EXPECT_THROW((void)p2.template source<std::int32_t>(m.ids), ferry::logic_error);
}

TYPED_TEST_P(H2d, SecondPublicationNeedsReasonAndStallsUntilSourceRead)
{
  using B = TypeParam;
  this->jitter(20);
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  fb::mapped_buffer<B> flag{64, this->b};
  fb::device_buffer<B> sink{64, this->b};
  auto* f = flag.template as<std::uint64_t>();
  fb::host_store_release(f, 0);
  auto s = pub.begin(0);
  this->b.launch(fb::probe::consume_kernel(typename B::tag{}), fb::launch_config{{1}, {32}, 0}, this->owner->handle(),
                 static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()), std::uint64_t{1},
                 static_cast<const std::uint64_t*>(flag.template device_as<std::uint64_t>()),
                 sink.template as<std::uint64_t>(), std::uint64_t{1});
  auto first = md;
  this->produce(pub, "step", &first, {{m.ids, 20}, {m.positions, 20}, {m.bf16, 40}, {m.mask, 20}, {m.table, 80}}, 21);
  pub.publish("step", this->owner->view());
  EXPECT_THROW(pub.publish("step", this->owner->view()), ferry::logic_error);
  EXPECT_THROW((void)pub.rewrite("step", ""), ferry::logic_error);
  std::thread releaser{[f] {
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    fb::host_store_release(f, 1);
  }};
  const auto t0 = std::chrono::steady_clock::now();
  {
    auto p = pub.rewrite("step", "speculative verification corrected the draft");
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(80)) << "rewrite did not acquire";
    releaser.join();
    this->expect_model(pub, first, "first publication read its sources before the rewrite");
  }
  auto second = first;
  this->produce(pub, "step", &second, {{m.ids, 5}, {m.positions, 5}, {m.bf16, 10}, {m.mask, 5}, {m.table, 20}}, 22);
  pub.publish("step", this->owner->view());
  s.finish();
  EXPECT_EQ(pub.last_rewrite_reason(), "speculative verification corrected the draft");
  this->expect_model(pub, second, "second publication");
}

// ---- planning --------------------------------------------------------------------------------------------

TYPED_TEST_P(H2d, OverlappingBindingsAreRejectedNamingBoth)
{
  using B = TypeParam;
  fb::device_buffer<B> storage{4096, this->b};
  auto* base = storage.template as<unsigned char>();
  fh::publisher<B> pub{this->b};
  (void)pub.declare({.name = "slot_mapping", .groups = {"kv"}, .unit = fh::count_unit::elements, .element_size = 8,
                     .capacity = 64, .device_ptr = base});
  (void)pub.declare({.name = "seq_lens", .groups = {"kv"}, .unit = fh::count_unit::elements, .element_size = 4,
                     .capacity = 64, .device_ptr = base + 500});
  try {
    this->init(pub, fh::upload_backend::packed);
    ADD_FAILURE() << "overlap accepted";
  } catch (const ferry::logic_error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("slot_mapping"), std::string::npos) << w;
    EXPECT_NE(w.find("seq_lens"), std::string::npos) << w;
    EXPECT_NE(w.find("overlaps"), std::string::npos) << w;
  }
}

TYPED_TEST_P(H2d, CoveredGroupKeepsCheckedDirectCopiesWithoutArena)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  auto m = this->declare_mixed(pub);
  this->init(pub, fh::upload_backend::packed);
  const auto step = pub.info("step");
  const auto sampling = pub.info("sampling");
  const auto tokens = pub.info("tokens");
  EXPECT_EQ(step.backend, fh::upload_backend::packed);
  EXPECT_GT(step.arena_bytes, 0U);
  EXPECT_TRUE(sampling.covered);
  EXPECT_EQ(sampling.arena_bytes, 0U) << "no duplicate packed arena for a covered group";
  EXPECT_TRUE(tokens.covered);
  typename TestFixture::model md;
  this->poison_all(pub, md, {m.ids, m.positions, m.bf16, m.mask, m.table});
  auto s = pub.begin(0);
  this->produce(pub, "sampling", &md, {{m.bf16, 6}, {m.mask, 3}}, 5);
  pub.publish("sampling", this->owner->view());  // standalone caller: checked direct copies
  this->produce(pub, "tokens", &md, {{m.ids, 4}}, 6);
  pub.publish("tokens", this->owner->view());
  // The combined group now finds its members already published this epoch.
  EXPECT_THROW((void)pub.producer("step"), ferry::logic_error);
  s.finish();
  this->expect_model(pub, md, "covered groups published standalone");
}

TYPED_TEST_P(H2d, CoveredGroupThenCombinedGroupIsDuplicate)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  auto s = pub.begin(0);
  this->produce(pub, "sampling", &md, {{m.bf16, 6}, {m.mask, 3}}, 5);
  pub.publish("sampling", this->owner->view());
  this->produce(pub, "tokens", &md, {{m.ids, 4}}, 6);
  pub.publish("tokens", this->owner->view());
  EXPECT_THROW((void)pub.producer("step"), ferry::logic_error);
  try {
    pub.publish("step", this->owner->view());
    ADD_FAILURE() << "duplicate accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string{e.what()}.find("duplicate publication"), std::string::npos) << e.what();
  }
  s.finish();
  this->expect_model(pub, md, "covered groups");
}

TYPED_TEST_P(H2d, DirectFallbackFromEnvironmentAndStridedBindings)
{
  using B = TypeParam;
  ::setenv("FERRY_H2D_BACKEND", "direct", 1);
  fh::publisher<B> pub{this->b};
  auto m = this->declare_mixed(pub);
  fh::config c;
  c.device = this->b.current_device();
  pub.initialize(c, this->owner->view());  // reads FERRY_H2D_BACKEND once
  ::setenv("FERRY_H2D_BACKEND", "packed", 1);
  EXPECT_EQ(pub.requested_backend(), fh::upload_backend::direct);
  EXPECT_EQ(pub.info("step").backend, fh::upload_backend::direct);
  EXPECT_EQ(pub.info("step").arena_bytes, 0U);
  typename TestFixture::model md;
  this->poison_all(pub, md, {m.ids, m.positions, m.bf16, m.mask, m.table});
  this->step_cycle(pub, m, md, 0, 30, 3);
  this->expect_model(pub, md, "direct");
  ::unsetenv("FERRY_H2D_BACKEND");

  ::setenv("FERRY_H2D_BACKEND", "fast", 1);
  {
    fh::publisher<B> bad{this->b};
    (void)this->declare_mixed(bad);
    EXPECT_THROW(bad.initialize(c, this->owner->view()), ferry::logic_error);
  }
  ::unsetenv("FERRY_H2D_BACKEND");

  // A strided binding (every row 48 bytes apart) inside a packed group: direct row copies, gaps untouched.
  fb::device_buffer<B> tensor{48 * 16, this->b};
  this->b.memset_async(tensor.data(), poison, 48 * 16, this->owner->handle());
  fh::publisher<B> pub2{this->b};
  auto dense = pub2.declare({.name = "dense", .groups = {"g"}, .unit = fh::count_unit::elements, .element_size = 4, .capacity = 16});
  auto dense2 = pub2.declare({.name = "dense2", .groups = {"g"}, .unit = fh::count_unit::elements, .element_size = 4, .capacity = 16});
  auto strided = pub2.declare({.name = "strided_rows", .groups = {"g"}, .unit = fh::count_unit::rows, .element_size = 4,
                               .row_size = 32, .capacity = 16, .device_ptr = tensor.data(), .stride = 48});
  this->units = {{dense.value, 16}, {dense2.value, 16}, {strided.value, 16}};
  this->init(pub2, fh::upload_backend::packed);
  EXPECT_EQ(pub2.info("g").backend, fh::upload_backend::packed);
  typename TestFixture::model md2;
  this->poison_all(pub2, md2, {dense, dense2});
  auto s = pub2.begin(0);
  std::vector<std::uint8_t> rows;
  {
    auto p = pub2.producer("g");
    auto src = p.template source<std::uint8_t>(strided);
    for (std::size_t i = 0; i < 5 * 32; ++i) { src[i] = data_byte(77, i); }
    rows.assign(src.begin(), src.begin() + 5 * 32);
    p.set_count(strided, 5);
  }
  this->produce(pub2, "g", &md2, {{dense, 7}, {dense2, 9}}, 8);
  pub2.publish("g", this->owner->view());
  s.finish();
  this->expect_model(pub2, md2, "dense members");
  auto t = this->read_back(tensor.data(), 48 * 16);
  for (std::size_t r = 0; r < 16; ++r) {
    for (std::size_t i = 0; i < 48; ++i) {
      const std::uint8_t want = (r < 5 && i < 32) ? rows[r * 32 + i] : poison;
      ASSERT_EQ(t[r * 48 + i], want) << "row " << r << " byte " << i;
    }
  }
}

TYPED_TEST_P(H2d, SingleActiveMemberUsesOneDirectCopy)
{
  using B = TypeParam;
  fb::fault_plan plan;  // unarmed: only counts and logs calls (faulty backends)
  B pb = this->b;
  if constexpr (is_faulty<B>) { pb = B{&plan}; }
  fh::publisher<B> pub{pb};
  typename TestFixture::model md;
  auto m = this->prepare(pub, fh::upload_backend::packed, md);
  this->step_cycle(pub, m, md, 0, 64, 1);  // a packed publication first
  this->step_cycle(pub, m, md, 1, 64, 2);
  auto s = pub.begin(0);
  this->produce(pub, "step", &md, {{m.ids, 0}, {m.positions, 0}, {m.bf16, 0}, {m.mask, 0}, {m.table, 7}}, 3);
  const auto before = pub.snapshot();
  plan.reset_count();
  pub.publish("step", this->owner->view());
  const auto log = plan.log();
  s.finish();
  this->expect_model(pub, md, "single member");
  if constexpr (is_faulty<B>) {
    std::size_t copies = 0, launches = 0;
    for (const auto& l : log) {
      copies += l.rfind("copy:", 0) == 0;
      launches += l.rfind("launch:", 0) == 0;
    }
    EXPECT_EQ(copies, 1U) << "one direct copy, no arena DMA";
    EXPECT_EQ(launches, 0U) << "no scatter kernel";
  }
  // The arena header of slot 0 still holds the earlier packed publication's pairs (not borrowed).
  const auto after = pub.snapshot();
  ASSERT_EQ(before.words.size(), after.words.size());
  const std::size_t hdr = 2 * 5;
  const std::size_t slot0_end = 2 + 3 * 5 + hdr;
  for (std::size_t i = 2 + 3 * 5; i < slot0_end; ++i) { EXPECT_EQ(before.words[i], after.words[i]) << i; }
}

// ---- validation -------------------------------------------------------------------------------------------

TYPED_TEST_P(H2d, EveryValidationFailureLeavesStateAndMemoryUnchanged)
{
  using B = TypeParam;
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    this->step_cycle(pub, m, md, 0, 10, 1);
    const auto image0 = this->device_image(pub, md);

    auto expect_rejected = [&](const char* what, auto&& op, std::initializer_list<const char*> words) {
      SCOPED_TRACE(what);
      const auto st = pub.snapshot();
      const auto img = this->device_image(pub, md);
      try {
        op();
        ADD_FAILURE() << what << ": accepted";
      } catch (const ferry::logic_error& e) {
        for (const char* w : words) { EXPECT_NE(std::string{e.what()}.find(w), std::string::npos) << e.what(); }
      }
      EXPECT_EQ(pub.snapshot(), st) << what << ": state changed";
      EXPECT_EQ(this->device_image(pub, md), img) << what << ": device memory changed";
    };

    expect_rejected("no active slot", [&] { pub.publish("step", this->owner->view()); }, {"step", "no active slot"});
    auto s = pub.begin(1);
    {
      auto p = pub.producer("step");
      auto ids = p.template source<std::uint8_t>(m.ids);
      for (std::size_t i = 0; i < ids.size(); ++i) { ids[i] = data_byte(9, i); }
      p.set_count(m.ids, 64);
      p.set_count(m.positions, 64);
      p.set_count(m.bf16, 128);
      p.set_count(m.mask, 61);
      expect_rejected("over capacity", [&] { p.set_count(m.table, 301); }, {"block_table", "301", "300"});
    }
    expect_rejected("missing count", [&] { pub.publish("step", this->owner->view()); }, {"step", "block_table", "no count"});
    pub.set_count(m.table, 300);
    expect_rejected("wrong stream", [&] { pub.publish("step", this->aux->view()); }, {"step", "owner stream"});
    expect_rejected("wrong thread", [&] {
      std::exception_ptr ep;
      std::thread t{[&] {
        try {
          pub.publish("step", this->owner->view());
        } catch (...) {
          ep = std::current_exception();
        }
      }};
      t.join();
      if (ep) { std::rethrow_exception(ep); }
    }, {"step", "owner thread"});
    if (this->b.device_count() > 1) {
      expect_rejected("wrong device", [&] {
        const auto d = this->b.current_device();
        this->b.set_device(fb::device_id{d.value == 0 ? 1 : 0});
        struct restore {
          B b;
          fb::device_id d;
          ~restore() { b.set_device(d); }
        } r{this->b, d};
        pub.publish("step", this->owner->view());
      }, {"step", "device"});
    }
    expect_rejected("during capture", [&] {
      this->b.capture_begin(this->owner->handle());
      struct end {
        B b;
        typename B::stream_type s;
        ~end() { b.graph_destroy(b.capture_end(s)); }
      } e{this->b, this->owner->handle()};
      pub.publish("step", this->owner->view());
    }, {"step", "capture"});
    expect_rejected("unknown group", [&] { pub.publish("nope", this->owner->view()); }, {"nope"});
    // The valid publication still goes through afterwards, then duplicates are rejected.
    pub.publish("step", this->owner->view());
    expect_rejected("duplicate", [&] { pub.publish("step", this->owner->view()); }, {"duplicate", "input_ids"});
    expect_rejected("duplicate via covered group", [&] { pub.publish("tokens", this->owner->view()); }, {"duplicate", "tokens"});
    expect_rejected("rewrite without reason", [&] { (void)pub.rewrite("step", ""); }, {"reason"});
    s.finish();
    expect_rejected("finish twice", [&] { pub.finish(); }, {"no active slot"});
    (void)image0;
  }
}

TYPED_TEST_P(H2d, FaultAtEachBackendCallInvalidatesAndRetainsStorage)
{
  using B = TypeParam;
  if constexpr (!is_faulty<B>) {
    GTEST_SKIP() << "needs the fault-injecting backend";
  } else {
    for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct,
                   fh::upload_backend::batch}) {
      SCOPED_TRACE(std::string{fh::to_string(k)});
      fb::fault_plan plan;
      B fb_backend{&plan};
      // Count the calls of one full cycle (begin of a reused slot, publication, finish).
      std::uint64_t n_calls = 0;
      {
        fh::publisher<B> pub{fb_backend};
        typename TestFixture::model md;
        auto m = this->prepare(pub, k, md);
        this->step_cycle(pub, m, md, 0, 9, 1);
        plan.reset_count();
        this->step_cycle(pub, m, md, 0, 9, 2);
        n_calls = plan.calls();
        this->owner->synchronize();
      }
      // Every upload goes through the backend layer (the batch backend too: memcpy_batch_h2d_async), so
      // the injector sees at least: begin wait, capture query, upload, completion record.
      ASSERT_GE(n_calls, 4U) << "begin wait, capture query, upload (>= 1), completion record";
      for (std::uint64_t i = 0; i < n_calls; ++i) {
        SCOPED_TRACE("fail call " + std::to_string(i));
        plan.disarm();
        fh::publisher<B> pub{fb_backend};
        typename TestFixture::model md;
        auto m = this->prepare(pub, k, md);
        this->step_cycle(pub, m, md, 0, 9, 1);
        this->owner->synchronize();
        const auto storage = pub.storage();
        plan.reset_count();
        plan.fail_at(i);
        std::string failed_call;
        try {
          this->step_cycle(pub, m, md, 0, 9, 2);
          ADD_FAILURE() << "no failure surfaced";
        } catch (const ferry::backend_error& e) {
          const auto log = plan.log();
          ASSERT_GT(log.size(), i);
          failed_call = log[i].substr(log[i].find(':') + 1);
          EXPECT_NE(std::string{e.what()}.find(failed_call), std::string::npos) << e.what();
        }
        plan.disarm();
        EXPECT_TRUE(pub.invalidated());
        EXPECT_NE(pub.invalidation_reason().find(failed_call), std::string::npos) << pub.invalidation_reason();
        EXPECT_EQ(pub.storage(), storage) << "storage moved or was released";
        EXPECT_THROW((void)pub.begin(1), ferry::invalidated_error);
        EXPECT_THROW(pub.publish("step", this->owner->view()), ferry::invalidated_error);
        EXPECT_THROW((void)pub.producer("step"), ferry::invalidated_error);
        // Explicit recovery after the drain; the bound storage is unchanged and publication works again.
        pub.recover();
        EXPECT_FALSE(pub.invalidated());
        EXPECT_EQ(pub.storage(), storage);
        this->step_cycle(pub, m, md, 1, 17, 3);
        this->expect_model(pub, md, "after recovery");
      }
    }
  }
}

// ---- graphs -----------------------------------------------------------------------------------------------

TYPED_TEST_P(H2d, FirstConsumerInGraphReplayReadsPublishedValues)
{
  using B = TypeParam;
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy, fh::upload_backend::direct,
                 fh::upload_backend::automatic}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    // The consumer graph (captured once): copies every destination into a result buffer on the device.
    const fh::buffer_handle all[] = {m.ids, m.positions, m.bf16, m.mask, m.table};
    std::size_t total = 0;
    for (auto h : all) { total += pub.capacity_bytes(h); }
    fb::device_buffer<B> result{total, this->b};
    auto g = fb::graph_exec<B>::capture(this->owner->view(), [&](fb::stream_view<B> s) {
      std::size_t off = 0;
      for (auto h : all) {
        this->b.memcpy_async(result.template as<unsigned char>() + off, pub.device_pointer(h), pub.capacity_bytes(h),
                             fb::memcpy_kind::device_to_device, s.handle());
        off += pub.capacity_bytes(h);
      }
    });
    for (std::size_t step = 0; step < 6; ++step) {
      auto s = pub.begin(step % 2);
      const std::size_t n = 1 + step * 11;
      this->produce(pub, "step", &md, {{m.ids, n}, {m.positions, n}, {m.bf16, 2 * n}, {m.mask, n}, {m.table, 4 * n}},
                    300 + step);
      pub.publish("step", this->owner->view());  // before replay, on the consumer stream
      g.launch(this->owner->view());
      s.finish();
      this->owner->synchronize();
      const auto got = this->read_back(result.data(), total);
      std::size_t off = 0;
      for (auto h : all) {
        const auto& want = md.bytes[h.value];
        ASSERT_EQ(0, std::memcmp(got.data() + off, want.data(), want.size())) << "step " << step << " buffer " << h.value;
        off += want.size();
      }
    }
  }
}

TYPED_TEST_P(H2d, CapturedUploadReplaysWithStagedCounts)
{
  using B = TypeParam;
  for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy}) {
    SCOPED_TRACE(std::string{fh::to_string(k)});
    fh::publisher<B> pub{this->b};
    typename TestFixture::model md;
    auto m = this->prepare(pub, k, md);
    auto graphs = this->step_graphs(pub);
    // batch is never capturable
    for (std::size_t step = 0; step < 6; ++step) {
      auto s = pub.begin(step % 2);
      const std::size_t n = (step * 23) % 64;
      this->produce(pub, "step", &md, this->step_counts(m, n),
                    700 + step);
      pub.stage("step");
      EXPECT_THROW(pub.publish("step", this->owner->view()), ferry::logic_error);
      graphs[step % 2].launch(this->owner->view());
      s.finish();
      this->expect_model(pub, md, "graph replay");
    }
  }
}

// Every scatter knob keeps the exact bytes: small tiles (a member spans many tiles, partial last vectors),
// warp-sized blocks, each speculation mode, eager (counts in the parameters) and replayed (counts from the
// header) publications with changing counts.
TYPED_TEST_P(H2d, ScatterKnobsKeepExactBytes)
{
  using B = TypeParam;
  for (std::size_t tile : {std::size_t{32}, std::size_t{48}, std::size_t{4096}, std::size_t{8192}}) {
    for (std::uint32_t th : {32u, 128u, 256u}) {
      for (int spec : {0, 1, 2}) {
        for (auto k : {fh::upload_backend::packed, fh::upload_backend::zerocopy}) {
          SCOPED_TRACE(fmt::format("{} tile {} threads {} spec {}", fh::to_string(k), tile, th, spec));
          this->knob_tile_bytes = tile;
          this->knob_threads = th;
          this->knob_speculation = spec;
          fh::publisher<B> pub{this->b};
          typename TestFixture::model md;
          auto m = this->prepare(pub, k, md);
          auto graphs = this->step_graphs(pub);
          for (std::size_t step = 0; step < 6; ++step) {
            auto s = pub.begin(step % 2);
            const std::size_t n = (step * 37 + 5) % 64;
            this->produce(pub, "step", &md,
                          this->step_counts(m, n),
                          900 + step);
            if (step % 2 == 0) {
              pub.publish("step", this->owner->view());
            } else {
              pub.stage("step");
              graphs[step % 2].launch(this->owner->view());
            }
            s.finish();
            this->expect_model(pub, md, "knobs");
          }
        }
      }
    }
  }
  this->knob_tile_bytes = fh::config{}.tile_bytes;
  this->knob_threads = fh::config{}.threads_per_tile;
  this->knob_speculation = -1;
}

TYPED_TEST_P(H2d, AutoPicksAMeasuredBackendPerGroup)
{
  using B = TypeParam;
  fh::publisher<B> pub{this->b};
  auto m = this->declare_mixed(pub);
  this->init(pub, fh::upload_backend::automatic);
  const auto i = pub.info("step");
  ASSERT_EQ(i.calibration_us.size(), 4U);
  EXPECT_GE(i.calibration_us[0], 0.0);
  EXPECT_GE(i.calibration_us[2], 0.0);
  EXPECT_GE(i.calibration_us[3], 0.0);
  EXPECT_EQ(i.calibration_us[1] >= 0.0, fh::publisher<B>::batch_native());
  EXPECT_NE(i.backend, fh::upload_backend::automatic);
  double best = 1e300;
  for (double v : i.calibration_us) {
    if (v >= 0) { best = std::min(best, v); }
  }
  const auto idx = i.backend == fh::upload_backend::direct  ? 0
                   : i.backend == fh::upload_backend::batch ? 1
                   : i.backend == fh::upload_backend::packed ? 2
                                                             : 3;
  // The fastest, or zero-copy within 3% of it (near-tie preference: one operation, least CPU).
  if (i.backend == fh::upload_backend::zerocopy) {
    EXPECT_LE(i.calibration_us[3], best * 1.03);
  } else {
    EXPECT_EQ(i.calibration_us[static_cast<std::size_t>(idx)], best);
    EXPECT_GT(i.calibration_us[3], best * 1.03);
  }
  // The graph choice is the fastest replayed-graph candidate (batch is never capturable).
  ASSERT_EQ(i.calibration_graph_us.size(), 4U);
  EXPECT_LT(i.calibration_graph_us[1], 0.0);
  EXPECT_NE(i.graph_backend, fh::upload_backend::batch);
  double best_graph = 1e300;
  for (double v : i.calibration_graph_us) {
    if (v >= 0) { best_graph = std::min(best_graph, v); }
  }
  const auto gidx = i.graph_backend == fh::upload_backend::direct ? 0 : i.graph_backend == fh::upload_backend::packed ? 2 : 3;
  if (i.graph_backend == fh::upload_backend::zerocopy) {
    EXPECT_LE(i.calibration_graph_us[3], best_graph * 1.03);
  } else {
    EXPECT_EQ(i.calibration_graph_us[static_cast<std::size_t>(gidx)], best_graph);
    EXPECT_GT(i.calibration_graph_us[3], best_graph * 1.03);
  }
  // Calibration never wrote the destinations.
  typename TestFixture::model md;
  for (auto h : {m.ids, m.positions, m.bf16, m.mask, m.table}) { md.bytes[h.value].assign(pub.capacity_bytes(h), poison); }
  for (auto h : {m.ids, m.positions, m.bf16, m.mask, m.table}) {
    this->b.memset_async(pub.device_pointer(h), poison, pub.capacity_bytes(h), this->owner->handle());
  }
  this->step_cycle(pub, m, md, 0, 13, 4);
  this->expect_model(pub, md, "auto");
}

REGISTER_TYPED_TEST_SUITE_P(H2d, ScatterKnobsKeepExactBytes, ExactValuesForEveryBackendAndUnit, UntouchedTailsAndChangingBatchSizes,
                            GraphPaddingIsPublished, DelayedSourceReuseMakesBeginWait, PipelineRotationOverThreeSlots,
                            TwoBatchOverlapResumesTheSameEpoch, ProducerReentryIsRejectedAndSourcesStayIntact,
                            SecondPublicationNeedsReasonAndStallsUntilSourceRead,
                            OverlappingBindingsAreRejectedNamingBoth, CoveredGroupKeepsCheckedDirectCopiesWithoutArena,
                            CoveredGroupThenCombinedGroupIsDuplicate, DirectFallbackFromEnvironmentAndStridedBindings,
                            SingleActiveMemberUsesOneDirectCopy, EveryValidationFailureLeavesStateAndMemoryUnchanged,
                            FaultAtEachBackendCallInvalidatesAndRetainsStorage,
                            FirstConsumerInGraphReplayReadsPublishedValues, CapturedUploadReplaysWithStagedCounts,
                            AutoPicksAMeasuredBackendPerGroup);

}  // namespace ferry::test::h2d
