// SPDX-License-Identifier: Apache-2.0
// The graphed vllm-full forward of ferry_bench_sinks (sinks.hpp): 28 layers of bench/d2h's layer kernel (it
// writes every hook's bytes, pattern_word(tag * hooks + hook, i), then spins to the layer's time), 341 hooks of
// DMI's vllm-full sizes per token (forward_sizes; token ids int64) at `tokens` rows each, every hook captured with
// capture_deferred (one gather per K hooks). A device counter, advanced at the end of every graph of every
// contestant, is the forward's tag: the host counts the replays alike and plans each with that tag, so a
// consumer regenerates any entry's bytes from (tag, hook) and nothing captured needs to be kept for the check.
#include "sinks.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace ferry::bench::sinks {

spread spread_of(const std::vector<double>& us)
{
  if (us.empty()) { return {}; }
  return {median(us), *std::min_element(us.begin(), us.end()), *std::max_element(us.begin(), us.end())};
}

forward_shape::forward_shape(std::uint64_t t) : tokens{t}
{
  row_bytes = forward_sizes(hooks, true);  // 4 B token ids first, 2-6 KiB per layer hook, 297 KiB logits last
  row_bytes.front() = 8;                   // token ids: int64
  for (std::uint64_t h = 0; h < hooks; ++h) {
    bytes.push_back(tokens * row_bytes[h]);
    off.push_back(span);
    span += fd::align_up(bytes[h], 256);
    step_bytes += bytes[h];
  }
}

fd::hook_schema forward_shape::schema() const
{
  fd::hook_schema s;
  s.add(fd::hook_id{0}, "token_ids", fd::dtype::i64);
  for (std::uint64_t h = 1; h < hooks; ++h) {
    char name[32];
    std::snprintf(name, sizeof name, "hook%03llu", static_cast<unsigned long long>(h));
    s.add(fd::hook_id{static_cast<std::uint32_t>(h)}, h + 1 == hooks ? "logits" : name, fd::dtype::bf16, {row_bytes[h] / 2});
  }
  return s;
}

namespace {
B ready_backend()
{
  B b{};
  b.set_device(fb::device_id{0});
  return b;
}
}  // namespace

forward_rig::forward_rig(const options& o)
  : o_{o}, shape_{o.tokens}, b_{ready_backend()}, sms_{b_.attributes(fb::device_id{0}).sm_count}, s_{b_},
    act_{shape_.span, b_}, mix_{2 * shape_.hooks * 8, b_}, aux_{256, b_}
{
  const std::uint64_t H = shape_.hooks;
  fb::pinned_buffer<B> host{2 * H * 8, b_};
  std::memcpy(host.data(), shape_.off.data(), H * 8);
  std::memcpy(static_cast<std::byte*>(host.data()) + H * 8, shape_.bytes.data(), H * 8);
  b_.memcpy_async(mix_.data(), host.data(), 2 * H * 8, fb::memcpy_kind::host_to_device, s_.handle());
  b_.memset_async(aux_.data(), 0, 256, s_.handle());
  s_.synchronize();
}

std::string forward_rig::device_name() const { return b_.attributes(fb::device_id{0}).name; }

fd::config forward_rig::channel_config() const
{
  fd::config cfg;
  cfg.ring_bytes = fd::align_up(4 * shape_.step_bytes + MiB, MiB);  // four forwards in flight
  cfg.publish_every = o_.k;
  cfg.tuning.gather_batch = o_.k;  // one gather per K hooks
  cfg.fifo_capacity = static_cast<std::uint32_t>(std::max<std::uint64_t>(8192, 8 * shape_.hooks));
  cfg.timeout = std::chrono::seconds(60);
  return cfg;
}

std::unique_ptr<contestant> forward_rig::make(std::string name, std::unique_ptr<fd::channel<B>> ch)
{
  auto c = std::make_unique<contestant>();
  c->name = std::move(name);
  c->ch = std::move(ch);
  const std::uint64_t H = shape_.hooks, layers = 28;
  const fb::launch_config layer_shape{{host_mode ? 1U : static_cast<std::uint32_t>(sms_)}, {256}, 0};
  auto* counter = aux_.template as<std::uint64_t>();
  const auto* hook_off = mix_.template as<std::uint64_t>();
  auto* act = static_cast<std::byte*>(act_.data());
  c->g.emplace(fb::graph_exec<B>::capture(s_.view(), [&](fb::stream_view<B> g) {
    if (c->ch) { c->ch->begin_forward(g); }
    for (std::uint64_t l = 0; l < layers; ++l) {
      const std::uint64_t first = l * H / layers, last = (l + 1) * H / layers;
      const layer_args la{counter, H, first, last - first, act, 0, o_.spin_ns, hook_off, hook_off + H};
      b_.launch(layer_kernel(typename B::tag{}), layer_shape, g.handle(), la);
      for (std::uint64_t h = first; h < last && c->ch; ++h) {
        c->ch->capture_deferred(fd::hook_id{static_cast<std::uint32_t>(h)}, act + shape_.off[h], shape_.bytes[h], g);
      }
    }
    if (c->ch) { c->plan = c->ch->end_forward(g); }
    b_.launch(next_forward_kernel(typename B::tag{}), fb::launch_config{{1}, {1}, 0}, g.handle(), counter);
  }));
  return c;
}

void forward_rig::step(contestant& c)
{
  if (c.ch) {
    fd::forward_meta m;
    m.tag = tag_;
    c.ch->replay(*c.g, c.plan, s_.view(), std::move(m));
  } else {
    c.g->launch(s_.view());
  }
  ++tag_;
  ++c.replays;
}

void forward_rig::wait_delivered(contestant& c)
{
  if (!c.ch) { return; }
  const std::uint64_t want = c.replays * shape_.hooks;
  const auto end = clk::now() + std::chrono::seconds(120);
  while (c.ch->stats().entries_drained < want) {
    if (clk::now() > end) {
      throw std::runtime_error("ferry_bench_sinks: " + c.name + ": expected " + std::to_string(want) +
                               " entries delivered within 120 s, got " + std::to_string(c.ch->stats().entries_drained));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

double forward_rig::run(contestant& c, int n)
{
  fb::event<B> e0{b_, fb::event_flags::timing}, e1{b_, fb::event_flags::timing};
  s_.synchronize();
  e0.record(s_);
  for (int i = 0; i < n; ++i) { step(c); }
  e1.record(s_);
  e1.synchronize();
  const double us = static_cast<double>(e1.elapsed_ms_since(e0)) * 1000.0 / n;
  wait_delivered(c);  // the next contestant's round starts with no drain of this one running
  return us;
}

void forward_rig::interleave(const std::vector<contestant*>& cs, int rounds, int steps)
{
  const std::size_t n = cs.size();
  for (int r = -1; r < rounds; ++r) {  // round -1: warm-up
    for (std::size_t i = 0; i < n; ++i) {
      contestant& c = *cs[(i + static_cast<std::size_t>(std::max(r, 0))) % n];  // each round starts with another
      const double us = run(c, steps);
      if (r >= 0) { c.us.push_back(us); }
    }
  }
  for (const auto* c : cs) {
    const spread sp = spread_of(c->us);
    std::fprintf(stderr, "  %-22s median %9.1f us/step (min %9.1f, max %9.1f; %zu rounds of %d steps)\n", c->name.c_str(),
                 sp.median, sp.min, sp.max, c->us.size(), steps);
  }
}

}  // namespace ferry::bench::sinks
