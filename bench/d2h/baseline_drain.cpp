// SPDX-License-Identifier: Apache-2.0
// The old designs' consumer (baseline_drain.hpp): per-entry D2H of each ready entry, every word checked.
#include "baseline_drain.hpp"

namespace ferry::bench {

baseline_drain::baseline_drain(B be, std::uint64_t h, std::uint64_t by, const std::byte* r,
                               std::function<std::uint64_t(std::uint64_t)> ready_fn)
  : b{be}, H{h}, bytes{by}, ring{r}, ready{std::move(ready_fn)}, s{be}, staging{3 * h * by, be}
{
  t = std::thread([this] { run(); });
}

baseline_drain::~baseline_drain()
{
  stop.store(true);
  t.join();
}

void baseline_drain::run()
{
  b.set_device(fb::device_id{0});
  auto& k = checks();
  auto* stage = static_cast<std::byte*>(staging.data());
  std::uint64_t next = 0;
  while (!stop.load()) {
    const std::uint64_t f = ready(next);
    if (f <= next) {
      std::this_thread::yield();
      continue;
    }
    for (std::uint64_t e = next; e < f; ++e) {
      const std::uint64_t slot = e % (3 * H);
      b.memcpy_async(stage + slot * bytes, ring + slot * bytes, bytes, fb::memcpy_kind::device_to_host, s.handle());
    }
    s.synchronize();
    for (std::uint64_t e = next; e < f; ++e) {
      k.baseline_checked.fetch_add(1);
      if (!check_words(stage + (e % (3 * H)) * bytes, bytes, e, true)) { k.baseline_bad.fetch_add(1); }
    }
    next = f;
    consumed.store(next);
  }
}

}  // namespace ferry::bench
