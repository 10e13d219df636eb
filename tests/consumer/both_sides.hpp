// SPDX-License-Identifier: Apache-2.0
// What every consumer translation unit (.cpp with g++ / clang++, .cu with nvcc, .hip with hipcc) runs
// against an installed (or build-tree) ferry: one D2H forward (a d2h::channel captures a few entries; every
// delivered byte is checked) and one H2D publication (an h2d::publisher uploads one group; the device bytes
// are read back and checked). Only public headers and the documented API.
#pragma once

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/h2d.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace consumer {

inline std::byte byte_of(std::uint32_t hook, std::size_t i) { return static_cast<std::byte>((hook * 131U + i * 7U) & 0xFFU); }

/// Returns 0 when every check passed; prints what failed otherwise.
template <class B>
int run_both_sides(const char* who)
{
  namespace fb = ferry::backend;
  namespace fd = ferry::d2h;
  namespace fh = ferry::h2d;
  int failures = 0;
  B b;
  fb::stream<B> compute{b};

  // ---- D2H: one forward of `hooks` entries ----
  constexpr std::uint32_t hooks = 5;
  constexpr std::size_t bytes = 3000;
  fb::pinned_buffer<B> staging{bytes * hooks, b};
  fb::device_buffer<B> src{bytes * hooks, b};
  for (std::uint32_t h = 0; h < hooks; ++h) {
    for (std::size_t i = 0; i < bytes; ++i) { staging.template as<std::byte>()[h * bytes + i] = byte_of(h, i); }
  }
  b.memcpy_async(src.data(), staging.data(), bytes * hooks, fb::memcpy_kind::host_to_device, compute.handle());
  std::mutex m;
  std::map<std::uint32_t, std::vector<std::byte>> got;
  {
    fd::config cfg;
    cfg.ring_bytes = 1 << 16;
    cfg.publish_every = 2;
    fd::channel<B> ch{cfg, b, [&](fd::entry_view&& e) {
                        const auto s = e.bytes();
                        std::lock_guard lock{m};
                        got[e.hook().value].assign(s.begin(), s.end());
                      }};
    ch.begin_forward(compute);
    for (std::uint32_t h = 0; h < hooks; ++h) {
      ch.capture(fd::hook_id{h}, static_cast<const std::byte*>(src.data()) + h * bytes, bytes, compute);
    }
    (void)ch.end_forward(compute);
    compute.synchronize();
    (void)ch.close();
  }
  for (std::uint32_t h = 0; h < hooks; ++h) {
    const auto it = got.find(h);
    bool ok = it != got.end() && it->second.size() == bytes;
    for (std::size_t i = 0; ok && i < bytes; ++i) { ok = it->second[i] == byte_of(h, i); }
    if (!ok) {
      std::printf("%s: d2h entry of hook %u missing or wrong\n", who, h);
      ++failures;
    }
  }

  // ---- H2D: one publication of one group ----
  fh::publisher<B> pub{b};
  const auto ids = pub.declare({.name = "input_ids", .groups = {"step"}, .unit = fh::count_unit::elements,
                                .element_size = 4, .capacity = 64});
  pub.initialize({.slots = 2, .backend = fh::upload_backend::packed, .device = b.current_device()}, compute);
  constexpr std::size_t n = 37;
  fb::pinned_buffer<B> back{64 * 4, b};
  {
    auto slot = pub.begin(0);
    {
      auto p = pub.producer("step");
      auto dst = p.template source<std::int32_t>(ids);
      for (std::size_t i = 0; i < n; ++i) { dst[i] = static_cast<std::int32_t>(i * 3 + 1); }
      p.set_count(ids, n);
    }
    pub.publish("step", compute);
    b.memcpy_async(back.data(), pub.device_pointer(ids), n * 4, fb::memcpy_kind::device_to_host, compute.handle());
    compute.synchronize();
    slot.finish();
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (back.template as<std::int32_t>()[i] != static_cast<std::int32_t>(i * 3 + 1)) {
      std::printf("%s: h2d element %zu wrong\n", who, i);
      ++failures;
      break;
    }
  }
  std::printf("ferry consumer (%s): d2h %zu/%u entries, h2d %zu ids: %s\n", who, got.size(), hooks, n,
              failures == 0 ? "ok" : "FAILED");
  return failures;
}

}  // namespace consumer
