// SPDX-License-Identifier: Apache-2.0
// sink::sample_assembler (sink/sample_assembler.hpp): the state behind the handle. Every member is under mu_, but
// a step's rows: the drain thread allocates a step under mu_ and copies each entry's rows into it without mu_ (only
// it writes steps), then marks the hook filled under mu_; next() reads a step only once it is whole (every hook's
// entry counted, or a later step's entry seen), through a shared_ptr taken under mu_, and builds the sample
// without mu_.
#include <ferry/error.hpp>
#include <ferry/sink/sample_assembler.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace ferry::sink::detail {

namespace {
constexpr const char* not_finished = "not finished when the capture closed";
}

class sample_assembler_impl {
 public:
  explicit sample_assembler_impl(sample_assembler_config cfg) : cfg_{cfg}
  {
    FERRY_EXPECTS(cfg_.hooks > 0, ferry::logic_error, "sample_assembler: expected hooks > 0, got 0");
  }

  void add(sample_request r)
  {
    std::lock_guard lk{mu_};
    FERRY_EXPECTS(!reqs_.contains(r.handle), ferry::logic_error,
                  "sample_assembler: request {} ('{}'): expected a new handle, got one already added ('{}')", r.handle,
                  r.id, reqs_.at(r.handle).r.id);
    reqs_[r.handle].r = std::move(r);
  }

  void finish(std::uint64_t handle, std::vector<std::int64_t> sequence, std::string reason, std::int64_t last_step)
  {
    std::lock_guard lk{mu_};
    auto it = reqs_.find(handle);
    if (it == reqs_.end() || it->second.finished) { return; }
    it->second.finished = true;
    it->second.sequence = sequence.empty() ? it->second.r.prompt : std::move(sequence);
    it->second.reason = std::move(reason);
    it->second.last_step = std::max(it->second.last_step, last_step);
    finished_.push_back(handle);
    ready_cv_.notify_all();
  }

  void deliver(d2h::entry_view&& v)
  {
    std::unique_lock lk{mu_};
    ++c_.entries;
    if (closed_) {
      ++c_.refused_entries;
      return;
    }
    const std::int64_t tag = static_cast<std::int64_t>(v.tag());
    const std::uint32_t hook = v.hook().value;
    const bool first = seen_[tag] == 0;  // (an entry of the step: the step is held until it is whole)
    if (tag - 1 > done_upto_) {  // a step's entries arrive consecutively: the earlier steps are whole
      done_upto_ = tag - 1;
      for (auto it = seen_.begin(); it != seen_.end() && it->first < tag;) {  // steps a hook skipped
        retire(it->first);
        it = seen_.erase(it);
      }
    }
    const d2h::forward_meta* m = v.meta();
    if (m != nullptr && !m->requests.empty()) {
      if (std::shared_ptr<step> into = file(v, *m, tag, hook, first)) {
        // The copy without the lock (the engine's add/finish and next() go on): only this thread writes a step,
        // and no sample reads step `tag` before it is whole, which needs this entry counted below.
        copying_ = true;  // close() makes every request ready: next() then waits for this copy (below)
        lk.unlock();
        const std::uint64_t rb = into->row_bytes, hooks = cfg_.hooks;
        const std::byte* src = v.bytes().data();
        for (std::uint64_t i = 0; i < into->rows; ++i) {
          std::memcpy(into->data.data() + (i * hooks + hook) * rb, src + i * rb, rb);
        }
        lk.lock();
        copying_ = false;
        into->filled[hook] = true;
        c_.rows += into->rows;
        ready_cv_.notify_all();
      }
    }
    if (++seen_[tag] >= cfg_.hooks) {
      done_upto_ = std::max(done_upto_, tag);
      seen_.erase(tag);
      retire(tag);
    }
    promote(&lk);
  }

  std::optional<assembled_sample> next(std::chrono::milliseconds wait)
  {
    std::unique_lock lk{mu_};
    promote(nullptr);
    if (ready_.empty()) {
      ready_cv_.wait_for(lk, wait, [&] {
        promote(nullptr);
        return !ready_.empty() || (closed_ && finished_.empty());
      });
    }
    if (ready_.empty()) { return std::nullopt; }
    // After close() a request is ready whatever was delivered: a copy still in flight (close() during a delivery)
    // ends first. Before close() a ready request's steps are whole: no copy writes them.
    ready_cv_.wait(lk, [&] { return !copying_; });
    ready_item it = std::move(ready_.front());
    ready_.pop_front();
    c_.pending_bytes -= it.bytes;
    ++c_.samples_taken;
    space_cv_.notify_all();
    std::vector<std::shared_ptr<const step>> held;
    for (const auto& s : it.q.segments) { held.push_back(take_step_ref(s.tag)); }
    lk.unlock();
    return build(it.q, held);
  }

  void close()
  {
    std::lock_guard lk{mu_};
    if (closed_) { return; }
    closed_ = true;
    for (auto& [h, q] : reqs_) {
      if (!q.finished) {
        q.finished = true;
        q.reason = not_finished;
        q.sequence = q.r.prompt;
        finished_.push_back(h);
      }
    }
    ready_cv_.notify_all();
    space_cv_.notify_all();
  }

  bool closed() const
  {
    std::lock_guard lk{mu_};
    return closed_;
  }
  bool done() const
  {
    std::lock_guard lk{mu_};
    return closed_ && finished_.empty() && ready_.empty();
  }
  std::vector<request_drop> dropped() const
  {
    std::lock_guard lk{mu_};
    return dropped_;
  }
  sample_assembler_stats stats() const
  {
    std::lock_guard lk{mu_};
    sample_assembler_stats s = c_;
    s.steps_held = steps_.size();
    s.bytes_held = bytes_held_;
    return s;
  }

 private:
  struct segment {
    std::int64_t tag;
    std::uint64_t first_row, rows;
    std::int64_t first_pos;
  };
  struct request_state {
    sample_request r;
    std::vector<segment> segments;
    std::vector<std::string> errors;
    std::vector<std::int64_t> sequence;
    std::string reason;
    std::int64_t last_step{-1};
    bool finished{false};
  };
  /// Bytes that resize() leaves uninitialised: a step's rows are read only for hooks whose entry wrote them
  /// (`filled`), so its buffer (a step of every layer is tens of MB) is not zeroed first.
  template <class T>
  struct uninit_allocator : std::allocator<T> {
    uninit_allocator() noexcept = default;
    template <class U>
    uninit_allocator(const uninit_allocator<U>&) noexcept  // NOLINT(google-explicit-constructor): rebinding
    {
    }
    template <class U>
    void construct(U* p) noexcept
    {
      ::new (static_cast<void*>(p)) U;
    }
  };
  struct step {
    std::uint64_t rows{0}, row_bytes{0};
    std::vector<std::byte, uninit_allocator<std::byte>> data;  // [rows, hooks, row_bytes]
    std::vector<bool> filled;     // per hook
    std::uint64_t refs{0};        // requests with a segment in it, not yet built
  };
  struct ready_item {
    request_state q;
    std::uint64_t bytes;
  };
  using step_map = std::map<std::int64_t, std::shared_ptr<step>>;

  // ---- the drain thread, under mu_ ----
  /// The entry's attribution (the step's first entry: each request's segment) and checks; the step its rows go
  /// into (null: none to copy).
  std::shared_ptr<step> file(const d2h::entry_view& v, const d2h::forward_meta& m, std::int64_t tag,
                             std::uint32_t hook, bool first)
  {
    if (first) {  // the step's attribution, once: each request's segment, its first position from the user bytes
      const std::size_t have = m.user.size() / sizeof(std::int64_t);
      for (std::size_t k = 0; k < m.requests.size() && k < have; ++k) {
        auto it = reqs_.find(m.requests[k].request);
        if (it == reqs_.end()) { continue; }
        std::int64_t p0 = 0;
        std::memcpy(&p0, m.user.data() + k * sizeof p0, sizeof p0);
        it->second.segments.push_back({tag, m.requests[k].first_row, m.requests[k].rows, p0});
        it->second.last_step = std::max(it->second.last_step, tag);
        ++step_of(tag)->refs;
      }
    }
    const auto charge = [&](const std::string& what) {
      for (const auto& q : m.requests) {
        auto it = reqs_.find(q.request);
        if (it != reqs_.end()) { it->second.errors.push_back(what); }
      }
    };
    if (!v.ok()) {
      ++c_.failed_entries;
      charge(ferry::detail::format("step {} hook {}: entry failed ({} bytes)", tag, hook, v.size()));
      return nullptr;
    }
    const std::uint64_t rows = v.rows();
    if (rows == 0 || hook >= cfg_.hooks) { return nullptr; }
    const std::uint64_t rb = v.row_bytes();
    std::shared_ptr<step>& into = step_of(tag);
    step& s = *into;
    if (s.data.empty()) {
      s.rows = rows;
      s.row_bytes = rb;
      s.data.resize(rows * cfg_.hooks * rb);
      s.filled.assign(cfg_.hooks, false);
      bytes_held_ += s.data.size();
    } else if (s.rows != rows || s.row_bytes != rb) {
      ++c_.refused_entries;
      charge(ferry::detail::format("step {} hook {}: expected every hook's rows of one shape {} x {} bytes, got "
                                   "{} x {}", tag, hook, s.rows, s.row_bytes, rows, rb));
      return nullptr;
    }
    return into;
  }

  std::shared_ptr<step>& step_of(std::int64_t tag)
  {
    auto& p = steps_[tag];
    if (!p) { p = std::make_shared<step>(); }
    return p;
  }
  /// Step `tag` is complete: its rows go now if no request of ours waits for them.
  void retire(std::int64_t tag)
  {
    auto st = steps_.find(tag);
    if (st != steps_.end() && st->second->refs == 0) { drop_step(st); }
  }
  void drop_step(step_map::iterator it)
  {
    bytes_held_ -= it->second->data.size();
    steps_.erase(it);
  }
  /// A reference to step `tag` for a sample being built (null: never filed); the step leaves the map with its
  /// last request.
  std::shared_ptr<const step> take_step_ref(std::int64_t tag)
  {
    auto it = steps_.find(tag);
    if (it == steps_.end()) { return nullptr; }
    std::shared_ptr<const step> p = it->second;
    if (--it->second->refs == 0 && !seen_.contains(tag)) { drop_step(it); }
    return p;
  }

  /// The bytes of `q`'s sample: its rows of every kept hook, with their positions and token ids.
  std::uint64_t sample_bytes(const request_state& q) const
  {
    std::uint64_t n = 0;
    for (const auto& s : q.segments) {
      auto it = steps_.find(s.tag);
      const std::uint64_t rb = it != steps_.end() ? it->second->row_bytes : 0;
      n += s.rows * (q.r.keep.size() * rb + 2 * sizeof(std::int64_t));
    }
    return n;
  }

  /// Finished requests whose steps were all delivered (all of them after close) become ready. Beyond
  /// max_pending_bytes of ready samples, policy drop drops the sample; policy block waits for next() once, up to
  /// the timeout, when `wait` is the drain thread's lock (never on next()'s own thread: it is the one that takes).
  void promote(std::unique_lock<std::mutex>* wait)
  {
    for (std::size_t i = 0; i < finished_.size();) {
      auto it = reqs_.find(finished_[i]);
      if (!closed_ && it->second.last_step > done_upto_) {
        ++i;
        continue;
      }
      const std::uint64_t n = sample_bytes(it->second);
      const bool over = c_.pending_bytes != 0 && c_.pending_bytes + n > cfg_.max_pending_bytes;
      if (over && cfg_.policy == queue_policy::block && wait != nullptr) {
        ++c_.stalls;
        const bool room = space_cv_.wait_for(*wait, cfg_.timeout, [&] {
          return closed_ || c_.pending_bytes == 0 || c_.pending_bytes + n <= cfg_.max_pending_bytes;
        });
        if (!room) { ++c_.stall_timeouts; }
        wait = nullptr;  // the lock was let go: start over, queueing what is ready now
        i = 0;
        continue;
      }
      if (over && cfg_.policy == queue_policy::drop) {
        drop_request(it);
      } else {
        enqueue(it, n);
      }
      finished_.erase(finished_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  void enqueue(std::unordered_map<std::uint64_t, request_state>::iterator it, std::uint64_t n)
  {
    ready_.push_back({std::move(it->second), n});
    reqs_.erase(it);
    c_.pending_bytes += n;
    ready_cv_.notify_all();
  }
  void drop_request(std::unordered_map<std::uint64_t, request_state>::iterator it)
  {
    std::uint64_t rows = 0;
    for (const auto& s : it->second.segments) {
      rows += s.rows;
      (void)take_step_ref(s.tag);
    }
    dropped_.push_back({it->second.r.handle, it->second.segments.size(), rows});  // every step it ran in
    ++c_.samples_dropped;
    reqs_.erase(it);
  }

  // ---- next()'s thread, without mu_ ----
  assembled_sample build(const request_state& q, const std::vector<std::shared_ptr<const step>>& steps) const;

  sample_assembler_config cfg_;
  mutable std::mutex mu_;
  std::condition_variable ready_cv_, space_cv_;
  std::unordered_map<std::uint64_t, request_state> reqs_;
  std::vector<std::uint64_t> finished_;  // finished, not ready yet (in finishing order)
  std::deque<ready_item> ready_;
  step_map steps_;
  std::map<std::int64_t, std::uint32_t> seen_;  // entries seen of steps not complete
  std::int64_t done_upto_{-1};
  std::uint64_t bytes_held_{0};
  std::vector<request_drop> dropped_;
  sample_assembler_stats c_;
  bool closed_{false};
  bool copying_{false};  // the drain thread copies an entry's rows without mu_
};

}  // namespace ferry::sink::detail

namespace ferry::sink::detail {

assembled_sample sample_assembler_impl::build(const request_state& q,
                                              const std::vector<std::shared_ptr<const step>>& steps) const
{
  assembled_sample out;
  out.handle = q.r.handle;
  out.id = q.r.id;
  out.keep = q.r.keep;
  const std::vector<std::int64_t>& seq = q.sequence;
  const std::int64_t end = std::min<std::int64_t>(q.r.hi, static_cast<std::int64_t>(seq.size()) - 1);
  // the segments in (first position, step) order: of a position run twice the later step comes last
  std::vector<std::size_t> order(q.segments.size());
  for (std::size_t i = 0; i < order.size(); ++i) { order[i] = i; }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = q.segments[a];
    const auto& y = q.segments[b];
    return x.first_pos != y.first_pos ? x.first_pos < y.first_pos : x.tag < y.tag;
  });
  struct row_ref {
    std::int64_t pos;
    const step* s;
    std::uint64_t row;
  };
  std::vector<row_ref> rows;
  std::uint64_t rb = 0;
  for (const std::size_t i : order) {
    const segment& g = q.segments[i];
    const step* s = steps[i].get();
    const bool whole = s != nullptr && !s->data.empty() && g.first_row + g.rows <= s->rows &&
                       std::all_of(q.r.keep.begin(), q.r.keep.end(), [&](std::uint32_t h) {
                         return h < s->filled.size() && s->filled[h];
                       });
    if (!whole || (rb != 0 && s->row_bytes != rb)) { continue; }  // a failed entry: its positions are missing
    rb = s->row_bytes;
    for (std::uint64_t k = 0; k < g.rows; ++k) {
      rows.push_back({g.first_pos + static_cast<std::int64_t>(k), s, g.first_row + k});
    }
  }
  // a position run twice (a recomputed step): the later run wins; stable order keeps runs in step order
  std::stable_sort(rows.begin(), rows.end(), [](const row_ref& a, const row_ref& b) { return a.pos < b.pos; });
  std::vector<row_ref> kept;
  const std::int64_t target_end = (q.r.strict || !q.reason.empty()) ? q.r.hi : std::max(q.r.lo, end);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i + 1 < rows.size() && rows[i + 1].pos == rows[i].pos) { continue; }
    if (rows[i].pos >= q.r.lo && rows[i].pos < target_end) { kept.push_back(rows[i]); }
  }
  const std::size_t taps = q.r.keep.size();
  out.row_bytes = rb;
  out.hidden.resize(kept.size() * taps * rb);
  out.positions.reserve(kept.size());
  out.token_ids.reserve(kept.size());
  const std::uint64_t hooks = cfg_.hooks;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const row_ref& r = kept[i];
    for (std::size_t t = 0; t < taps; ++t) {
      std::memcpy(out.hidden.data() + (i * taps + t) * rb, r.s->data.data() + (r.row * hooks + q.r.keep[t]) * rb, rb);
    }
    out.positions.push_back(r.pos);
    out.token_ids.push_back(r.pos < static_cast<std::int64_t>(seq.size()) ? seq[static_cast<std::size_t>(r.pos)] : -1);
  }
  std::int64_t at = q.r.lo;  // the ranges of [lo, target_end) no kept row holds
  for (const row_ref& r : kept) {
    if (r.pos > at) { out.missing.emplace_back(at, r.pos); }
    at = std::max(at, r.pos + 1);
  }
  if (at < target_end) { out.missing.emplace_back(at, target_end); }
  out.reason = q.reason;
  for (const std::string& e : q.errors) { out.reason += (out.reason.empty() ? "" : "; ") + e; }
  out.complete = out.missing.empty() && out.reason.empty();
  return out;
}

}  // namespace ferry::sink::detail

// ---- the handle ----
namespace ferry::sink {

sample_assembler::sample_assembler(sample_assembler_config cfg)
    : impl_{std::make_shared<detail::sample_assembler_impl>(cfg)}
{
}
sample_assembler::sample_assembler(sample_assembler&&) noexcept = default;
sample_assembler& sample_assembler::operator=(sample_assembler&& o) noexcept
{
  if (this != &o) {
    if (impl_) { impl_->close(); }
    impl_ = std::move(o.impl_);
  }
  return *this;
}
sample_assembler::~sample_assembler()
{
  if (impl_) { impl_->close(); }
}
detail::sample_assembler_impl& sample_assembler::impl() const
{
  FERRY_EXPECTS(impl_ != nullptr, ferry::logic_error, "sample_assembler: expected a live handle, got a moved-from one");
  return *impl_;
}
std::function<void(d2h::entry_view&&)> sample_assembler::callback() const
{
  (void)impl();
  return [p = impl_](d2h::entry_view&& v) { p->deliver(std::move(v)); };
}
void sample_assembler::add(sample_request r) { impl().add(std::move(r)); }
void sample_assembler::finish(std::uint64_t handle, std::vector<std::int64_t> sequence, std::string reason,
                              std::int64_t last_step)
{
  impl().finish(handle, std::move(sequence), std::move(reason), last_step);
}
std::optional<assembled_sample> sample_assembler::next(std::chrono::milliseconds wait) { return impl().next(wait); }
sample_assembler_stats sample_assembler::close()
{
  impl().close();
  return impl().stats();
}
bool sample_assembler::closed() const { return impl().closed(); }
bool sample_assembler::done() const { return impl().done(); }
std::vector<request_drop> sample_assembler::dropped_requests() const { return impl().dropped(); }
sample_assembler_stats sample_assembler::stats() const { return impl().stats(); }

}  // namespace ferry::sink
