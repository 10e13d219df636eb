// SPDX-License-Identifier: Apache-2.0
// The D2H typed suite D2hPlannedRows, over backends (host and faulty<host> in CI, cuda on the H200): plan()'s
// forward_meta::selected on a replayed graph's row entries, immediate (capture_rows: select_rows) and deferred
// (capture_rows_deferred: gather_rows_publish). Each row entry of such a replay reserves exactly its rows
// (detail::row_reserved) and the device places it there (the replay token carries the count to the row
// kernels: kernels/d2h/replay). Every delivered row is compared with its source; a device count above the plan is
// a size_overflow that writes nothing past its entry; one below is delivered right.
#pragma once

#include "d2h/gather_rows.hpp"

#include <ferry/d2h/detail/kernel_args.hpp>  // row_reserved

#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace ferry::test {

template <class B>
class D2hPlannedRows : public D2hGatherRows<B> {
 protected:
  using base = D2hSelectRows<B>;
  static constexpr std::uint64_t bound = 8;         ///< items a selection may hold (its device count's bound)
  static constexpr std::int64_t win_a = 1, win_b = 3;  ///< the window form: rows [1, 3) of each request
  static constexpr std::uint32_t n_req = 8;         ///< 8 requests of 8 tokens: query_start_loc 0, 8, .., 64

  struct got_entry {
    fd::entry_status status{};
    std::vector<std::uint8_t> bytes;
    std::uint64_t reserved{0}, size{0};
  };
  struct collector {
    std::mutex m;
    std::vector<got_entry> v;
    auto callback()
    {
      return [this](fd::entry_view&& e) {
        got_entry g{e.status(), {}, e.reserved_bytes(), e.size()};
        if (e.ok()) {
          const auto s = e.bytes();
          g.bytes.assign(reinterpret_cast<const std::uint8_t*>(s.data()), reinterpret_cast<const std::uint8_t*>(s.data()) + s.size());
        }
        std::lock_guard lock{m};
        v.push_back(std::move(g));
      };
    }
    std::size_t size()
    {
      std::lock_guard lock{m};
      return v.size();
    }
  };
  /// One replay's expectation: the source rows of its selection, the device's item count, the plan's.
  struct step {
    std::vector<std::int64_t> rows;
    std::uint64_t device{0};
    std::optional<std::uint64_t> selected;
  };

  /// A forward of `hooks` row entries (row sizes `sizes[h % n]`, source h salted by 5h) reading one selection at
  /// fixed addresses with a device count (bound 8): an index list, or (`window`) the window [1, 3) of the listed
  /// requests; immediate or (`deferred`) recorded. A whole 64-byte entry follows them (row 0 of a source salted 99):
  /// the entry after an overflowing one. Captured into a graph. `ring` 0: twice a forward at the bound.
  void build(bool deferred, bool window, std::vector<std::uint64_t> sizes, std::uint64_t hooks, std::size_t ring = 0)
  {
    reset();
    window_ = window;
    sizes_ = std::move(sizes);
    hooks_ = hooks;
    for (std::uint64_t h = 0; h < hooks && ring == 0; ++h) { ring_ += bound_reserved(row_bytes(h)); }
    ring_ = ring != 0 ? ring : 2 * (ring_ + 64);
    s_.emplace(this->b);
    const auto sv = s_->view();
    for (std::uint64_t h = 0; h < hooks; ++h) { src_.push_back(this->salted(row_bytes(h), static_cast<std::uint8_t>(h * 5), sv)); }
    whole_.emplace(this->salted(64, 99, sv));
    std::vector<std::int32_t> q;
    for (std::uint32_t r = 0; r <= n_req; ++r) { q.push_back(static_cast<std::int32_t>(r * 8)); }
    qsl_.emplace(this->upload(q, sv));
    idx_.emplace(bound * 4, this->b);
    count_.emplace(4, this->b);
    auto cfg = this->rows_config(ring_);
    cfg.publish_every = 4;  // releases inside the forward too
    ch_.emplace(cfg, this->b, got_.callback());
    const auto* ip = static_cast<const std::int32_t*>(idx_->data());
    const auto* cp = static_cast<const std::int32_t*>(count_->data());
    const auto sel = (window ? fd::row_selection::window(static_cast<const std::int32_t*>(qsl_->data()), n_req, ip, 0, win_a, win_b)
                             : fd::row_selection::rows(ip, 0))
                       .counted_on_device(cp, bound);
    g_.emplace(fb::graph_exec<B>::capture(sv, [&](fb::stream_view<B> cs) {
      ch_->begin_forward(cs);
      for (std::uint64_t h = 0; h < hooks; ++h) {
        const fd::hook_id id{static_cast<std::uint32_t>(h)};
        if (deferred) {
          ch_->capture_rows_deferred(id, src_[h].data(), base::n_rows, row_bytes(h), sel, cs);
        } else {
          ch_->capture_rows(id, src_[h].data(), base::n_rows, row_bytes(h), sel, cs);
        }
      }
      const fd::hook_id last{static_cast<std::uint32_t>(hooks)};
      if (deferred) {
        ch_->capture_deferred(last, whole_->data(), 64, cs);
      } else {
        ch_->capture(last, whole_->data(), 64, cs);
      }
      plan_ = ch_->end_forward(cs);
    }));
  }
  /// The last build's graph, channel and buffers gone (in that order).
  void reset()
  {
    g_.reset();
    ring_ = 0;
    plan_ = {};
    ch_.reset();
    got_.v.clear();
    whole_.reset();
    qsl_.reset();
    idx_.reset();
    count_.reset();
    src_.clear();
    s_.reset();
  }
  [[nodiscard]] std::uint64_t row_bytes(std::uint64_t h) const { return sizes_[h % sizes_.size()]; }
  [[nodiscard]] std::uint64_t per_item() const { return window_ ? static_cast<std::uint64_t>(win_b - win_a) : 1; }
  /// The ring bytes of a row entry reserved for the bound (a replay without forward_meta::selected).
  [[nodiscard]] std::uint64_t bound_reserved(std::uint64_t rb) const
  {
    return fd::align_up(std::max(bound * per_item() * rb, std::uint64_t{16}), 16);
  }

  /// Writes a random selection of `device` items (its source rows into `st.rows`), synchronized.
  step select(std::mt19937_64& rng, std::uint64_t device, std::optional<std::uint64_t> selected)
  {
    step st{{}, device, selected};
    std::vector<std::int32_t> v(device);
    for (auto& x : v) {
      x = static_cast<std::int32_t>(window_ ? rng() % n_req : rng() % base::n_rows);
      for (std::int64_t k = 0; k < static_cast<std::int64_t>(per_item()); ++k) { st.rows.push_back(window_ ? x * 8 + win_a + k : x); }
    }
    this->write(*idx_, v, s_->view());
    this->write(*count_, std::vector<std::int32_t>{static_cast<std::int32_t>(device)}, s_->view());
    return st;
  }
  /// One replay of step `st` (plan with its forward_meta::selected, then the launch), synchronized.
  void replay(const step& st)
  {
    fd::forward_meta m;
    m.selected = st.selected;
    ch_->replay(*g_, plan_, s_->view(), std::move(m));
    s_->synchronize();
  }

  /// Every replay's entries, in order: a row entry holds its rows and reserves exactly them when planned (the
  /// captured bound otherwise); above the plan it is a size_overflow naming the planned bytes; the whole entry
  /// after it is intact. Returns the ring bytes the replays' entries reserved.
  std::uint64_t check(const std::vector<step>& steps)
  {
    const std::uint64_t per = hooks_ + 1;
    EXPECT_TRUE(wait_until<B>([&] { return got_.size() == steps.size() * per; }, 10s));
    EXPECT_NO_THROW((void)ch_->close(10s));
    EXPECT_EQ(got_.v.size(), steps.size() * per);
    std::uint64_t reserved = 0, overflows = 0;
    for (std::size_t i = 0; i < got_.v.size() && i < steps.size() * per; ++i) {
      const step& st = steps[i / per];
      const std::uint64_t h = i % per;
      const got_entry& e = got_.v[i];
      reserved += e.reserved;
      SCOPED_TRACE(::testing::Message() << "replay " << i / per << " hook " << h << ": device " << st.device << ", planned "
                                      << (st.selected ? std::to_string(*st.selected) : std::string{"none"}));
      if (h == hooks_) {
        EXPECT_EQ(e.status, fd::entry_status::ok);
        EXPECT_EQ(e.bytes, D2hGatherRows<B>::expect({0}, 64, 99)) << "the entry after the row entries";
        continue;
      }
      const std::uint64_t rb = row_bytes(h);
      const std::uint64_t items = st.selected.value_or(bound);
      const std::uint64_t want_reserved =
        st.selected ? fd::detail::row_reserved(items, per_item(), rb) : bound_reserved(rb);
      if (st.device > items) {
        ++overflows;
        EXPECT_EQ(e.status, fd::entry_status::size_overflow);
        EXPECT_EQ(e.size, st.device * per_item() * rb) << "the true size";
        EXPECT_EQ(e.reserved, items * per_item() * rb) << "the planned rows' bytes";
        continue;
      }
      EXPECT_EQ(e.status, fd::entry_status::ok);
      EXPECT_EQ(e.reserved, want_reserved) << "the ring bytes this replay reserved for the entry";
      EXPECT_EQ(e.bytes, D2hGatherRows<B>::expect(st.rows, rb, static_cast<std::uint8_t>(h * 5)));
    }
    EXPECT_EQ(ch_->stats().size_overflows, overflows);
    return reserved;
  }

  bool window_{false};
  std::uint64_t ring_{0};
  std::vector<std::uint64_t> sizes_;
  std::uint64_t hooks_{0};
  std::optional<fb::stream<B>> s_;
  std::vector<fb::device_buffer<B>> src_;
  std::optional<fb::device_buffer<B>> whole_, qsl_, idx_, count_;
  collector got_;
  std::optional<fd::channel<B>> ch_;
  fd::forward_plan plan_;
  std::optional<fb::graph_exec<B>> g_;
};
TYPED_TEST_SUITE_P(D2hPlannedRows);

/// Replays whose plan() gives the step's count (random every replay, 0 and the bound included; every fifth replay
/// without one: the captured bound) over a ring that wraps many times: each row entry reserves exactly its rows
/// (entry_view::reserved_bytes, the observable that fails with the captured bound) and holds them, for the
/// immediate and the deferred path, the index and the window form, rows of 16-byte multiples (the gather's closed
/// form) and odd rows (its summed layout), one wider than the gather's 16 KiB chunk.
TYPED_TEST_P(D2hPlannedRows, ExactReservationEveryReplayAcrossWraps)
{
  for (const bool deferred : {false, true}) {
    for (const bool window : {false, true}) {
      for (const auto& sizes : {std::vector<std::uint64_t>{48, 16, 96, 1024}, std::vector<std::uint64_t>{48, 36, 4, 17008}}) {
        SCOPED_TRACE(::testing::Message() << (deferred ? "deferred" : "immediate") << (window ? ", window" : ", rows")
                                        << ", row sizes from " << sizes[0] << ", " << sizes[1] << ", " << sizes[2] << ", " << sizes[3]);
        this->build(deferred, window, sizes, 6);
        std::mt19937_64 rng{static_cast<std::uint64_t>(deferred * 4 + window * 2 + sizes[1] % 3)};
        std::vector<typename TestFixture::step> steps;
        for (std::uint64_t r = 0; r < 30; ++r) {
          const std::uint64_t n = r == 0 ? 0 : r == 1 ? TestFixture::bound : rng() % (TestFixture::bound + 1);
          steps.push_back(this->select(rng, n, r % 5 == 4 ? std::nullopt : std::optional<std::uint64_t>{n}));
          this->replay(steps.back());
        }
        EXPECT_GT(this->check(steps), 3 * this->ring_) << "the ring wrapped at least three times";
      }
    }
  }
}

/// A device count that disagrees with the plan: above it (by several items, by one row that fits the entry's
/// 16-byte alignment slack, from a plan of 0) the entry is delivered as size_overflow (counted; nothing written past
/// it: the entry after it is intact), below it (down to 0) the entry holds its rows; the replays after are whole.
TYPED_TEST_P(D2hPlannedRows, ADeviceCountThatDisagreesIsFlaggedAboveAndDeliveredBelow)
{
  for (const bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "deferred" : "immediate");
    this->build(deferred, false, {32, 4, 20}, 4, 64 << 10);
    std::mt19937_64 rng{3};
    std::vector<typename TestFixture::step> steps;
    const std::vector<std::pair<std::uint64_t, std::uint64_t>> cases{{3, 5}, {3, 3}, {5, 2}, {0, 1}, {4, 0},
                                                                     {3, 4}, {8, 8}, {2, 8}, {6, 6}};
    for (const auto& [planned, device] : cases) {
      steps.push_back(this->select(rng, device, planned));
      this->replay(steps.back());
    }
    (void)this->check(steps);
  }
}

/// plan() ahead of its launches: each token carries its own count (a queue on the device), so three plans before
/// three launches place each replay by its own count. More than planned_queue plans ahead overflow the queue: the
/// channel is invalidated naming it and the launches write and deliver nothing.
TYPED_TEST_P(D2hPlannedRows, PlansAheadOfTheirLaunchesKeepTheirCounts)
{
  using B = TypeParam;
  {
    this->build(true, false, {48, 36}, 3, 64 << 10);
    std::mt19937_64 rng{9};
    const std::vector<std::uint64_t> counts{2, 5, 0, 8};
    for (const auto n : counts) {
      fd::forward_meta m;
      m.selected = n;
      this->ch_->plan(this->plan_, this->s_->view(), std::move(m));
    }
    std::vector<typename TestFixture::step> steps;
    for (const auto n : counts) {
      steps.push_back(this->select(rng, n, n));
      this->g_->launch(this->s_->view());
      this->s_->synchronize();
    }
    (void)this->check(steps);
  }
  this->build(false, false, {16}, 1, 64 << 10);
  std::mt19937_64 rng{10};
  (void)this->select(rng, 1, 1);
  for (std::uint32_t k = 0; k <= fd::planned_queue; ++k) {
    fd::forward_meta m;
    m.selected = 1;
    this->ch_->plan(this->plan_, this->s_->view(), std::move(m));
  }
  for (std::uint32_t k = 0; k <= fd::planned_queue; ++k) { this->g_->launch(this->s_->view()); }
  this->s_->synchronize();
  EXPECT_TRUE(wait_until<B>([&] { return this->ch_->invalidated(); }, 5s));
  EXPECT_NE(this->ch_->invalidation_reason().find("more than 16 plan()s armed ahead"), std::string::npos)
    << this->ch_->invalidation_reason();
  EXPECT_THROW((void)this->ch_->close(100ms), ferry::invalidated_error);  // its entries never publish: a short wait
  EXPECT_EQ(this->got_.size(), 0U) << "no replay after the overflow wrote or published anything";
}

REGISTER_TYPED_TEST_SUITE_P(D2hPlannedRows, ExactReservationEveryReplayAcrossWraps,
                            ADeviceCountThatDisagreesIsFlaggedAboveAndDeliveredBelow,
                            PlansAheadOfTheirLaunchesKeepTheirCounts);

}  // namespace ferry::test
