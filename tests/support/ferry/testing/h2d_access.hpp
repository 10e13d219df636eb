// SPDX-License-Identifier: Apache-2.0
// Test instrumentation (not installed): reads an H2D publisher's internal state, as the validation,
// failure and fuzz tests compare it before and after a call. ferry::h2d::publisher befriends h2d_access.
#pragma once

#include <ferry/h2d/publisher.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::testing {

/// Everything a validation failure must leave unchanged (tests compare snapshots).
struct h2d_snapshot {
  int active_slot{-1};
  std::uint64_t epoch{0};
  bool invalidated{false};
  std::vector<std::uint64_t> words;  ///< per slot: epochs, counts, publication marks, arena headers
  friend bool operator==(const h2d_snapshot&, const h2d_snapshot&) = default;
};

/// The testing accessor of ferry::h2d::publisher.
struct h2d_access {
  /// The publisher's comparable state: active slot, epoch counter, invalidation, and the words
  ///   per slot: epoch, recorded, per buffer {count, count epoch, published epoch}, each arena header;
  ///   then the open producer of each buffer.
  template <class B>
  [[nodiscard]] static h2d_snapshot snapshot(const ferry::h2d::publisher<B>& p)
  {
    h2d_snapshot st;
    st.active_slot = p.slots_.active();
    st.epoch = p.slots_.epoch_counter();
    st.invalidated = p.invalid_;
    for (std::size_t si = 0; si < p.slots_.size(); ++si) {
      const auto& s = p.slots_[si];
      st.words.push_back(s.epoch);
      st.words.push_back(s.recorded ? 1 : 0);
      for (std::size_t m = 0; m < p.decl_.buffers.size(); ++m) {
        st.words.push_back(s.counts[m]);
        st.words.push_back(s.count_epoch[m]);
        st.words.push_back(s.published_epoch[m]);
      }
      for (std::size_t gi = 0; gi < p.plan_.groups.size(); ++gi) {
        if (p.plan_.groups[gi].arena_bytes == 0) { continue; }
        const auto* h = p.store_.slots[si].arenas[gi].template as<const std::uint64_t>();
        st.words.insert(st.words.end(), h, h + 2 * p.plan_.groups[gi].packed_members.size());
      }
    }
    for (auto o : p.slots_.producer_open()) { st.words.push_back(o); }
    return st;
  }

  /// Addresses of all storage a DMA may read (tests check it is retained across failures): per slot its
  /// arenas, staging copies and standalone block; then every destination.
  template <class B>
  [[nodiscard]] static std::vector<const void*> storage(const ferry::h2d::publisher<B>& p)
  {
    std::vector<const void*> v;
    for (const auto& s : p.store_.slots) {
      for (const auto& a : s.arenas) { v.push_back(a.data()); }
      for (const auto& a : s.staging) { v.push_back(a.data()); }
      v.push_back(s.standalone.data());
    }
    for (std::size_t m = 0; m < p.decl_.buffers.size(); ++m) {
      v.push_back(p.device_pointer(ferry::h2d::buffer_handle{static_cast<std::uint32_t>(m)}));
    }
    return v;
  }
};

}  // namespace ferry::testing
