// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the H2D API (declare / initialize / begin / resume / producer + set_count / set_count /
// publish / rewrite / finish) driven by fuzz bytes, on faulty<host_backend> with a plan that never fails,
// with an operation-order dimension of guard misuse: source<T> with T of 2, 4 or 8 bytes (accepted only when
// it fits the buffer), a moved-from producer guard used, and (at the end) the publisher destroyed while
// guards are held, after which every guard use must throw logic_error and every guard destructor is a no-op.
// On every reject (a ferry::error): the publisher's snapshot and storage (ferry::testing::h2d_access) are
// unchanged, every destination's device bytes are unchanged, and no backend operation was enqueued.
#include "fuzz_common.hpp"

#include <ferry/backend.hpp>
#include <ferry/h2d.hpp>
#include <ferry/testing/h2d_access.hpp>

#include <cstring>
#include <optional>
#include <vector>

namespace fb = ferry::backend;
namespace fh = ferry::h2d;
namespace fz = ferry::rel::fuzz;
using FB = fb::faulty<fb::host_backend>;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
  fz::bytes in{data, size};
  static fb::fault_plan plan;
  FB b{&plan};
  const fb::host_backend hb = b.base();
  hb.set_device(fb::device_id{0});
  static fb::stream<FB>* owner = new fb::stream<FB>{b};
  static fb::stream<FB>* other = new fb::stream<FB>{b};
  const char* groups[] = {"a", "b", "c", "zz"};
  std::vector<fh::buffer_handle> bufs;
  std::optional<fh::publisher<FB>> owned;
  owned.emplace(b);
  auto& pub = *owned;
  // declarations (some rejected)
  const int ndecl = 1 + in.u8() % 5;
  for (int i = 0; i < ndecl; ++i) {
    fh::buffer_spec sp;
    sp.name = "buf" + std::to_string(i % 4);  // duplicates possible
    const std::uint8_t g = in.u8();
    for (int k = 0; k < 4; ++k) {
      if (g & (1 << k)) { sp.groups.push_back(groups[k]); }
    }
    sp.unit = static_cast<fh::count_unit>(in.u8() % 3);
    sp.element_size = in.u8() % 10;
    sp.row_size = in.u8() % 40;
    sp.capacity = in.u16() % 300;
    try {
      bufs.push_back(pub.declare(sp));
    } catch (const ferry::logic_error&) {
    }
  }
  fh::config c;
  c.slots = in.u8() % 4;
  const fh::upload_backend kinds[] = {fh::upload_backend::packed, fh::upload_backend::zerocopy,
                                      fh::upload_backend::direct, fh::upload_backend::batch};
  c.backend = kinds[in.u8() % 4];
  c.device = hb.current_device();
  c.calibration_iterations = 1;
  try {
    pub.initialize(c, owner->view());
  } catch (const ferry::logic_error&) {
    return 0;
  }
  auto image = [&] {
    hb.stream_synchronize(owner->handle());
    std::vector<std::uint8_t> v;
    for (auto h : bufs) {
      const auto* p = static_cast<const std::uint8_t*>(pub.device_pointer(h));  // host backend: host memory
      v.insert(v.end(), p, p + pub.capacity_bytes(h));
    }
    return v;
  };
  std::optional<fh::slot_guard<FB>> slot;
  std::optional<fh::producer_guard<FB>> prod;
  for (int op = 0; in.more() && op < 48; ++op) {
    const std::uint8_t code = in.u8() % 11;
    const std::uint8_t x = in.u8();
    const std::uint16_t n = in.u16() % 400;
    const char* g = groups[x % 4];
    const fh::buffer_handle h = bufs.empty() ? fh::buffer_handle{x} : bufs[x % bufs.size()];
    // Guard releases are the harness's own steps (a guard's destructor finishes / closes): before the snapshot.
    if (code != 3 && code != 4 && code != 8 && code != 9 && code != 10) { prod.reset(); }
    if (code == 0 || code == 1) { slot.reset(); }
    const auto st = ferry::testing::h2d_access::snapshot(pub);
    const auto storage = ferry::testing::h2d_access::storage(pub);
    const auto img = image();
    const auto calls = fz::enqueued(plan);
    try {
      switch (code) {
        case 0: slot.emplace(pub.begin(x % 5)); break;
        case 1: slot.emplace(pub.resume(x % 5)); break;
        case 2: prod.emplace(pub.producer(g)); break;
        case 3:
          if (prod) {
            auto span = prod->template source<std::uint8_t>(h);
            std::memset(span.data(), x, std::min<std::size_t>(span.size(), n));
            prod->set_count(h, n);
          } else {
            pub.set_count(h, n);
          }
          break;
        case 4: pub.publish(g, (x & 0x80) ? other->view() : owner->view()); break;
        case 5: prod.emplace(pub.rewrite(g, (x & 1) ? "fuzz" : "")); break;
        case 6: if (slot) { slot->finish(); } else { pub.finish(); } break;
        case 7: break;
        case 9:  // source<T> with a T of 2, 4 or 8 bytes: when accepted, the span covers the capacity exactly
          if (prod) {
            std::size_t got = 0;
            const auto sz = std::size_t{2} << (x % 3);
            if (sz == 2) { got = prod->template source<std::uint16_t>(h).size_bytes(); }
            if (sz == 4) { got = prod->template source<std::uint32_t>(h).size_bytes(); }
            if (sz == 8) { got = prod->template source<std::uint64_t>(h).size_bytes(); }
            if (got != pub.capacity_bytes(h)) { fz::violation("source<T> span does not cover the capacity"); }
          }
          break;
        case 10:  // a moved-from producer guard is refused; the moved-to one keeps the scope
          if (prod) {
            fh::producer_guard<FB> moved{std::move(*prod)};
            try {
              (void)prod->template source<std::uint8_t>(h);  // NOLINT(bugprone-use-after-move)
              fz::violation("a moved-from producer guard was accepted");
            } catch (const ferry::logic_error&) {
            }
            prod.reset();
            prod.emplace(std::move(moved));
          }
          break;
        default: (void)pub.declare({.name = "late", .groups = {"a"}, .capacity = 4}); break;
      }
    } catch (const ferry::backend_error& e) {
      fz::violation(std::string{"backend error with a plan that never fails: "} + e.what());
    } catch (const ferry::error& e) {
      if (!(ferry::testing::h2d_access::snapshot(pub) == st)) { fz::violation(std::string{"state changed by a reject: "} + e.what()); }
      if (ferry::testing::h2d_access::storage(pub) != storage) { fz::violation(std::string{"storage changed by a reject: "} + e.what()); }
      if (fz::enqueued(plan) != calls) { fz::violation(std::string{"backend op enqueued by a reject: "} + e.what()); }
      if (image() != img) { fz::violation(std::string{"device bytes changed by a reject: "} + e.what()); }
    }
  }
  if (in.more() && (in.u8() & 1) != 0) {  // the publisher dies first: held guards are refused, then no-ops
    owned.reset();
    auto refused = [](auto&& f, const char* what) {
      try {
        f();
        fz::violation(std::string{what} + " accepted after the publisher was destroyed");
      } catch (const ferry::logic_error&) {
      }
    };
    if (prod) {
      refused([&] { (void)prod->template source<std::uint8_t>(fh::buffer_handle{0}); }, "producer_guard::source");
      refused([&] { prod->set_count(fh::buffer_handle{0}, 1); }, "producer_guard::set_count");
    }
    if (slot) { refused([&] { slot->finish(); }, "slot_guard::finish"); }
  }
  prod.reset();
  slot.reset();
  owned.reset();
  hb.stream_synchronize(owner->handle());
  plan.reset_count();
  return 0;
}
