// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the D2H producer API (begin_forward / capture / capture_dynamic / try_capture /
// begin_write / end_write / end_forward / abort_forward / plan / poll / close) driven by fuzz bytes, on
// faulty<host_backend> with a plan that never fails. On every reject (a ferry::error) the channel's
// counters are unchanged (except `stalls`, which counts a fail-fast reject by design) and no backend
// operation was enqueued. Whatever was accepted must drain: close() is clean once every forward ended.
// Operation order and stream identity: forwards begin on either of two streams (a forward on a new stream
// is joined; every delivered byte is checked), a call on the other stream inside a forward must be refused,
// a user writer may skip ring_ref::commit() (then close() must report it: invalidated_error), and
// abort_forward may end a forward mid-way (then close() is clean again). Deferred capture and flush mix
// with immediate captures (the gather kernel); immediate captures up to 2 KiB may bounce (a config bit).
// A captured forward is replayed with plan(), or launched without it: then the channel must be invalidated
// "graph replayed without plan()" (reported by close()).
#include "fuzz_common.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace fb = ferry::backend;
namespace fd = ferry::d2h;
namespace fz = ferry::rel::fuzz;
using FB = fb::faulty<fb::host_backend>;

namespace {
/// The byte every source and every user writer holds at offset i: a delivered entry must match it.
std::uint8_t byte_at(std::uint64_t i) { return static_cast<std::uint8_t>(i * 131 + 7); }

/// A user writer kernel: fills the entry's capacity with byte_at, then commits (`commit` != 0; a dynamic
/// entry commits its capacity as the actual size) or not (the missing-commit misuse).
void user_write(const fb::host_detail::launch_ctx& ctx, fd::ring_ref ref, std::uint64_t commit)
{
  if (ctx.block_idx.x != 0) { return; }
  auto* dst = reinterpret_cast<std::uint8_t*>(ref.data());
  for (std::uint64_t i = 0; i < ref.capacity(); ++i) { dst[i] = byte_at(i); }
  if (commit != 0) { ref.commit(ref.capacity()); }
}
const fb::host_kernel<fd::ring_ref, std::uint64_t> user_write_kernel{&user_write, "fuzz_user_write"};

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
  static fb::stream<FB>* s2 = new fb::stream<FB>{b};             // the second stream
  static fb::device_buffer<FB>* src = [&] {                      // larger than any ring, byte_at(i) at i
    auto* d = new fb::device_buffer<FB>{1 << 17, b};
    auto* p = d->as<std::uint8_t>();                              // host backend: device memory is host memory
    for (std::uint64_t i = 0; i < (1 << 17); ++i) { p[i] = byte_at(i); }
    return d;
  }();
  static fb::device_buffer<FB>* sz = new fb::device_buffer<FB>{64, b};
  fd::config cfg;
  cfg.ring_bytes = 16 * (in.u16() % 4097);  // 0 .. 64 KiB (0 is rejected)
  cfg.publish_every = in.u8() % 20;         // 0 is rejected
  cfg.tuning.size_slots = in.u8() % 9;
  cfg.fifo_capacity = in.u8() % 40;
  cfg.tuning.max_copies_in_flight = in.u8() % 5;
  cfg.staging_bytes = (in.u8() % 4) * 4096;
  const std::uint8_t flags = in.u8();  // bit 0: placement; bits 1, 2: where batch releases run; bit 3: bounce
  cfg.tuning.head_memory = flags % 2 ? fd::head_memory::managed : fd::head_memory::pinned_mapped;
  cfg.tuning.branch_publish = (flags & 2U) == 0;
  cfg.tuning.gather_branch_publish = (flags & 4U) == 0;
  cfg.tuning.bounce_capture_max_bytes = (flags & 8U) != 0 ? 2048 : 0;  // captures up to 2 KiB bounce (capture_bounced)
  cfg.on_full = fd::full_policy::fail_fast;
  cfg.drain = fd::drain_mode::poll;
  cfg.timeout = std::chrono::milliseconds{50};
  std::optional<fd::channel<FB>> ch;
  // Set just before a captured forward is launched without plan() (the misuse): from then on an entry may
  // legitimately carry that launch's bytes (docs/api/d2h.md: detection is on the drainer, after the launch).
  bool unplanned_launched = false;
  try {
    // A consumer that releases every view at once: staging never stays held, so every published entry
    // must drain (a consumer that keeps views can legitimately stall the drain: close() then reports
    // those entries as `undrained`).
    ch.emplace(cfg, b, [&unplanned_launched](fd::entry_view&& v) {
      if (!v.ok() || unplanned_launched) { return; }  // a dynamic entry's size (0xCD.. or ~0 after a missing commit) overflows
      const auto bytes = v.bytes();
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        if (static_cast<std::uint8_t>(bytes[i]) != byte_at(i)) {
          fz::violation("wrong byte " + std::to_string(i) + " in entry " + std::to_string(v.seq().value));
        }
      }
    });
  } catch (const ferry::logic_error&) {
    return 0;  // bad configuration: rejected
  }
  std::optional<fd::write_ticket> ticket;
  fd::forward_plan empty_plan;
  bool open = false;
  bool missing_commit = false;  // a writer skipped ring_ref::commit(): close() must report it
  bool unplanned = false;       // a captured forward launched without plan(): close() must report it
  fb::stream<FB>* cur = s;      // the stream of the open (or last) forward
  std::uint64_t accepted = 0;
  for (int op = 0; in.more() && op < 64 && !unplanned; ++op) {  // nothing after an unplanned replay
    const std::uint8_t code = in.u8() % 16;
    const std::uint32_t hook = in.u8();
    const std::uint64_t bytes = in.u16() % (1 << 17);
    fb::stream<FB>* other = cur == s ? s2 : s;
    if ((code == 6 || code == 11) && ticket && open) {  // the writer, enqueued before end_write (not a reject)
      b.launch(user_write_kernel, fb::launch_config{{1}, {32}, 0}, cur->handle(), ticket->ref(),
               std::uint64_t{code == 6 ? 1U : 0U});
    }
    const auto before = ch->stats();
    const auto calls_before = fz::enqueued(plan);
    try {
      switch (code) {
        case 0: ch->begin_forward(*s); open = true; cur = s; break;
        case 1: (void)ch->end_forward(*cur); open = false; break;
        case 2: ch->capture(fd::hook_id{hook}, src->data(), bytes, *cur); ++accepted; break;
        case 3: ch->capture_dynamic(fd::hook_id{hook}, src->data(), bytes, sz->as<std::uint64_t>(), *cur); ++accepted; break;
        case 4: accepted += ch->try_capture(fd::hook_id{hook}, src->data(), bytes, *cur) ? 1 : 0; break;
        case 5: ticket = ch->begin_write(fd::hook_id{hook}, bytes, *cur, hook % 2 == 1); break;
        case 6:
        case 11:
          if (ticket) {
            fd::write_ticket t = std::move(*ticket);
            ticket.reset();
            ch->end_write(std::move(t), *cur);
            ++accepted;
            missing_commit = missing_commit || code == 11;
          } else {
            ch->end_write(fd::write_ticket{}, *cur);
          }
          break;
        case 7: ch->plan(empty_plan); break;
        case 9: ch->begin_forward(*s2); open = true; cur = s2; break;  // a forward on the other stream: joined
        case 10:  // a capture on the stream that is not the forward's: always refused
          ch->capture(fd::hook_id{hook}, src->data(), bytes, *other);
          fz::violation(open ? "a capture on a second stream inside a forward was accepted"
                             : "a capture outside a forward was accepted");
        case 12:
          if (ch->abort_forward(*cur)) { ticket.reset(); }  // the open ticket is dropped with the forward
          open = false;
          break;
        case 13: ch->capture_deferred(fd::hook_id{hook}, src->data(), bytes, *cur); ++accepted; break;
        case 14: ch->flush(*cur); break;
        case 15: {  // a captured forward replayed: with plan() (ch.replay), or for hook % 4 == 0 without (misuse)
          if (open || ticket) {
            (void)ch->poll();
            break;
          }
          fd::forward_plan gp;
          auto g = fb::graph_exec<FB>::capture(
            cur->view(),
            [&](fb::stream_view<FB> cs) {
              ch->begin_forward(cs);
              ch->capture(fd::hook_id{hook}, src->data(), 1 + bytes % 4096, cs);
              gp = ch->end_forward(cs);
            },
            [&](fb::stream_view<FB> cs) { (void)ch->abort_forward(cs); });
          if (hook % 4 == 0) {
            unplanned_launched = true;
            g.launch(*cur);  // the misuse: the drainer must invalidate the channel ("without plan()")
            unplanned = true;
          } else {
            ch->replay(g, gp, *cur);
          }
          cur->synchronize();  // the graph runs before it is destroyed
          break;
        }
        default: (void)ch->poll(); break;
      }
    } catch (const ferry::backend_error& e) {
      fz::violation(std::string{"backend error with a plan that never fails: "} + e.what());
    } catch (const ferry::error& e) {
      if (code == 15) { continue; }  // a refused capture or replay: the graph's own capture calls were enqueued
      if (!same(before, ch->stats())) { fz::violation(std::string{"counters changed by a reject: "} + e.what()); }
      if (fz::enqueued(plan) != calls_before) {
        fz::violation(std::string{"backend operation enqueued by a reject: "} + e.what());
      }
    }
  }
  (void)accepted;
  if (ticket) {  // end the open write, its writer committing
    try {
      if (open) {
        b.launch(user_write_kernel, fb::launch_config{{1}, {32}, 0}, cur->handle(), ticket->ref(), std::uint64_t{1});
      }
      ch->end_write(std::move(*ticket), *cur);
    } catch (const ferry::error&) {
    }
  }
  if (open) {
    try {
      (void)ch->end_forward(*cur);
      open = false;
    } catch (const ferry::error&) {
    }
  }
  try {
    (void)ch->close(std::chrono::milliseconds{2000});
    if (missing_commit) { fz::violation("close() did not report a writer that skipped ring_ref::commit()"); }
    if (unplanned) { fz::violation("close() did not report a graph launched without plan()"); }
  } catch (const ferry::invalidated_error& e) {
    // Only a missing commit or an unplanned replay invalidates (a deferred entry reserves its space at
    // capture_deferred: under fail_fast a full ring refuses that entry, its batch's flush cannot fail).
    if (!missing_commit && !unplanned) {
      fz::violation(std::string{"channel invalidated without a missing commit or an unplanned replay: "} + e.what());
    }
    if (unplanned && !missing_commit && std::string{e.what()}.find("without plan()") == std::string::npos) {
      fz::violation(std::string{"an unplanned replay reported as something else: "} + e.what());
    }
  } catch (const fd::shutdown_error& e) {
    if (!open) { fz::violation(std::string{"close not clean after every forward ended: "} + e.what()); }
  }
  ch.reset();
  plan.reset_count();  // keep the log small
  return 0;
}
