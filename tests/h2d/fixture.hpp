// SPDX-License-Identifier: Apache-2.0
// The fixture of the H2D typed suites (tests/h2d/{ordering,capacity,graph,lifecycle,failure}.hpp), one
// instantiation per backend: host and faulty<host> (CI, label host), cuda and faulty<cuda> (H200, label
// gpu, FERRY_REQUIRE_GPU=1). Every test can fail: each checks exact device bytes against a host model of
// what must be there (published prefix, untouched tail, poison).
#pragma once

#include "support/gpu.hpp"

#include <ferry/backend.hpp>
#include <ferry/testing/probe.hpp>
#include <ferry/testing/h2d_access.hpp>
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
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ferry::test::h2d {

namespace fb = ferry::backend;
namespace fh = ferry::h2d;
using ferry::testing::h2d_access;

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

/// Shared setup and helpers: owner and aux streams, the standard mixed declaration, a host model of every
/// destination's bytes, producers that fill sources from a seed.
template <class B>
class h2d_fixture : public ::testing::Test {
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
    c.debug_sources = knob_debug_sources;
    pub.initialize(c, owner->view());
  }
  // Scatter knobs used by init() (tests of the tile / speculation paths change them).
  std::size_t knob_tile_bytes{fh::config{}.tile_bytes};
  std::uint32_t knob_threads{fh::config{}.threads_per_tile};
  int knob_speculation{-1};
  /// nullopt: FERRY_H2D_DEBUG_SOURCES decides (FERRY_H2D_DEBUG_SOURCES=1 ctest -R H2d: no suite writes a
  /// source after its publication).
  std::optional<bool> knob_debug_sources{};

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

}  // namespace ferry::test::h2d
