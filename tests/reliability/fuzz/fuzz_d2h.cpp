// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the D2H producer API (begin_forward / capture / capture_dynamic / try_capture /
// begin_write / end_write / end_forward / plan / poll / close) driven by fuzz bytes, on
// faulty<host_backend> with a plan that never fails. On every reject (a ferry::error) the channel's
// counters are unchanged (except `stalls`, which counts a fail-fast reject by design) and no backend
// operation was enqueued. Whatever was accepted must drain: close() is clean once every forward ended.
#include "fuzz_common.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>

#include <chrono>
#include <optional>

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace fz = ferry::rel::fuzz;
using FB = fb::faulty<fb::host_backend>;

namespace {
bool same(fd::counters a, fd::counters b)
{
  a.stalls = b.stalls = 0;
  a.entries_published = b.entries_published = 0;  // the drain may acquire a newer head meanwhile (poll only)
  return a.entries_reserved == b.entries_reserved && a.publishes == b.publishes && a.copies == b.copies &&
         a.entries_drained == b.entries_drained && a.bytes_drained == b.bytes_drained;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
  fz::bytes in{data, size};
  static fb::fault_plan plan;  // never fails; counts and logs calls
  FB b{&plan};
  b.base().set_device(fb::device_id{0});
  static fb::stream<FB>* s = new fb::stream<FB>{b};              // reused across inputs (thread per stream)
  static fb::device_buffer<FB>* src = new fb::device_buffer<FB>{1 << 17, b};  // larger than any ring
  static fb::device_buffer<FB>* sz = new fb::device_buffer<FB>{64, b};
  fd::config cfg;
  cfg.ring_bytes = 16 * (in.u16() % 4097);  // 0 .. 64 KiB (0 is rejected)
  cfg.publish_every = in.u8() % 20;         // 0 is rejected
  cfg.size_slots = in.u8() % 9;
  cfg.fifo_capacity = in.u8() % 40;
  cfg.max_copies_in_flight = in.u8() % 5;
  cfg.staging_bytes = (in.u8() % 4) * 4096;
  cfg.placement = in.u8() % 2 ? fd::head_placement::managed : fd::head_placement::pinned_mapped;
  cfg.on_full = fd::full_policy::fail_fast;
  cfg.drain = fd::drain_mode::poll;
  cfg.timeout = std::chrono::milliseconds{50};
  std::optional<fd::channel<FB>> ch;
  try {
    // A consumer that releases every view at once: staging never stays held, so every published entry
    // must drain (a consumer that keeps views can legitimately stall the drain: close() then reports
    // those entries as `undrained`).
    ch.emplace(cfg, b, [](fd::entry_view&&) {});
  } catch (const ferry::logic_error&) {
    return 0;  // bad configuration: rejected
  }
  std::optional<fd::write_ticket> ticket;
  fd::forward_plan empty_plan;
  bool open = false;
  std::uint64_t accepted = 0;
  for (int op = 0; in.more() && op < 64; ++op) {
    const std::uint8_t code = in.u8() % 9;
    const std::uint32_t hook = in.u8();
    const std::uint64_t bytes = in.u16() % (1 << 17);
    const auto before = ch->stats();
    const auto calls_before = fz::enqueued(plan);
    try {
      switch (code) {
        case 0: ch->begin_forward(*s); open = true; break;
        case 1: (void)ch->end_forward(*s); open = false; break;
        case 2: ch->capture(fd::hook_id{hook}, src->data(), bytes, *s); ++accepted; break;
        case 3: ch->capture_dynamic(fd::hook_id{hook}, src->data(), bytes, sz->as<std::uint64_t>(), *s); ++accepted; break;
        case 4: accepted += ch->try_capture(fd::hook_id{hook}, src->data(), bytes, *s) ? 1 : 0; break;
        case 5: ticket = ch->begin_write(fd::hook_id{hook}, bytes, *s, hook % 2 == 1); break;
        case 6:
          if (ticket) {
            fd::write_ticket t = std::move(*ticket);
            ticket.reset();
            ch->end_write(std::move(t), *s);
            ++accepted;
          } else {
            ch->end_write(fd::write_ticket{}, *s);
          }
          break;
        case 7: ch->plan(empty_plan); break;
        default: (void)ch->poll(); break;
      }
    } catch (const ferry::backend_error& e) {
      fz::violation(std::string{"backend error with a plan that never fails: "} + e.what());
    } catch (const ferry::error& e) {
      if (!same(before, ch->stats())) { fz::violation(std::string{"counters changed by a reject: "} + e.what()); }
      if (fz::enqueued(plan) != calls_before) {
        fz::violation(std::string{"backend operation enqueued by a reject: "} + e.what());
      }
    }
  }
  (void)accepted;
  if (ticket) {  // end the open write (a dynamic one leaves size 0xCD..: the drain must not hang on it)
    try {
      ch->end_write(std::move(*ticket), *s);
    } catch (const ferry::error&) {
    }
  }
  if (open) {
    try {
      (void)ch->end_forward(*s);
      open = false;
    } catch (const ferry::error&) {
    }
  }
  try {
    (void)ch->close(std::chrono::milliseconds{2000});
  } catch (const fd::shutdown_error& e) {
    if (!open) { fz::violation(std::string{"close not clean after every forward ended: "} + e.what()); }
  }
  ch.reset();
  plan.reset_count();  // keep the log small
  return 0;
}
