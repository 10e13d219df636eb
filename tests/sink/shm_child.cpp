// SPDX-License-Identifier: Apache-2.0
// The other process of the shared-memory stream tests (shm_stream_test.cpp): a reader (or a producer) in a
// process of its own, driven by its arguments, reporting on stdout one line per event:
//
//   ferry_shm_child read <name> <count> [<release_first> [<delay_us> [<window>]]]
//       attaches, prints "attached <start index>", reads up to <count> entries (or to the end of the stream),
//       each checked byte by byte against shm_pattern(tag, hook, i), printing
//       "entry <index> <hook> <seq> <forward> <tag> <size> <status> <bytes ok 0|1>"; with <release_first> >= 0
//       releases only the first <release_first>, holds the rest, prints "holding" and sleeps (the test kills
//       it); else holds the last <window> entries and checks each again before releasing it; <delay_us>: sleep
//       that long before each poll (a slow reader).
//   ferry_shm_child typed <name> <count>
//       attaches, prints "attached <start index> schema <hooks in the stream's schema now>", reads <count>
//       entries (or to the end of the stream), each checked against shm_pattern(tag, hook, i) through its typed
//       view where the schema declares its hook (the elements as the dtype's C++ type, the shape against the size),
//       printing "typed <index> <hook> <tag> <name> <dtype> <shape, 'x'-separated> <ok 0|1>", else its bytes,
//       printing "raw <index> <hook> <tag> <size> <ok 0|1>".
//   ferry_shm_child attrib <name> <count> [<delay_us> [<start_ms>]]
//       attaches, prints "attached <start index>", sleeps <start_ms> (the producer fills the ring meanwhile), reads
//       <count> entries (or to the end of the stream; <delay_us>: a sleep before each poll of one entry), printing per entry one line of key=value fields (shm_attr_line:
//       its descriptor, reserved bytes, rows, attribution, the meta's tag / selected / requests / user bytes in
//       hex, an FNV-1a digest of each request's rows_of(), whether rows_of refused a whole entry and an unknown
//       request), and a line "what <index> <message>" for an entry whose bytes() or attribution throws.
//   ferry_shm_child stall <name> <sleep_ms>
//       attaches, reads one entry and keeps it, prints "stalled", sleeps <sleep_ms>, then polls once and prints
//       "detached" (reader_detached_error) or "still attached".
//   ferry_shm_child hold <name>
//       attaches, prints "attached", sleeps until killed.
//   ferry_shm_child produce <name> <forwards>
//       a host-backend channel feeding stream <name>: <forwards> forwards of the test's three hooks (tags
//       1000 + f), prints "published", then sleeps until killed (never closing the stream: a dead producer).
// Errors print "error <type> <message>" and exit 3.
#include "sink/shm_attr_line.hpp"
#include "sink/shm_pattern.hpp"

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/sink.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fk = ferry::sink;
using namespace std::chrono_literals;

void say(const std::string& s)
{
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

[[noreturn]] void sleep_forever()
{
  for (;;) { std::this_thread::sleep_for(1s); }
}

/// Whether every byte of `e` is the pattern's.
bool bytes_ok(const fk::shm_entry& e)
{
  if (!e.ok()) { return true; }
  const auto b = e.bytes();
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (static_cast<std::uint8_t>(b[i]) != ferry::test::shm_pattern(e.tag(), e.hook().value, i)) { return false; }
  }
  return true;
}

void print_entry(const fk::shm_entry& e, bool ok)
{
  say("entry " + std::to_string(e.index()) + " " + std::to_string(e.hook().value) + " " + std::to_string(e.seq().value) +
      " " + std::to_string(e.forward_index()) + " " + std::to_string(e.tag()) + " " + std::to_string(e.size()) + " " +
      std::to_string(static_cast<int>(e.status())) + " " + (ok ? "1" : "0"));
}

/// Reads up to `count` entries (or to the end of the stream). release_first >= 0: prints each at once, releases
/// the first release_first and holds the rest, then sleeps. Else keeps the last `window` entries unreleased
/// (all released when a poll finds nothing new: the producer may be waiting for them) and checks each entry's
/// bytes twice, when read and again just before releasing it (a region the producer reused while this process
/// still held it fails the second check), printing it then.
int read(const std::string& name, std::uint64_t count, long release_first, long delay_us, long window)
{
  fk::shm_reader r{name, 10s};
  say("attached " + std::to_string(r.stats().start_index));
  std::vector<fk::shm_entry> kept;
  std::deque<std::pair<fk::shm_entry, bool>> win;
  const auto retire = [&] {
    auto& [e, ok] = win.front();
    print_entry(e, ok && bytes_ok(e));
    win.pop_front();  // released
  };
  std::uint64_t n = 0;
  while (n < count && !r.ended()) {
    if (delay_us > 0) { std::this_thread::sleep_for(std::chrono::microseconds(delay_us)); }
    auto got = r.poll(delay_us > 0 ? 1 : std::min<std::uint64_t>(64, count - n), 20ms);
    if (got.empty()) {  // nothing new: the producer may wait for what this window holds
      while (!win.empty()) { retire(); }
    }
    for (auto& e : got) {
      ++n;
      if (release_first >= 0) {
        print_entry(e, bytes_ok(e));
        if (static_cast<long>(n) > release_first) { kept.push_back(std::move(e)); }
        continue;
      }
      const bool ok = bytes_ok(e);
      win.emplace_back(std::move(e), ok);
      while (win.size() > static_cast<std::size_t>(std::max(window, 0L))) { retire(); }
    }
  }
  while (!win.empty()) { retire(); }
  if (release_first >= 0) {
    say("holding");
    sleep_forever();
  }
  say(r.ended() ? "ended" : "done");
  return 0;
}

/// Whether `t`'s elements, as T, are the pattern's bytes of entry (tag, hook), and as many as its shape says.
template <class T>
bool elements_ok(const ferry::d2h::typed_view& t, const fk::shm_entry& e)
{
  const std::span<const T> x = t.as<T>();
  std::uint64_t n = 1;
  for (const auto d : t.shape()) { n *= d; }
  if (x.size() != n || x.size_bytes() != e.size() || static_cast<const void*>(x.data()) != e.bytes().data()) {
    return false;
  }
  const auto* b = reinterpret_cast<const std::uint8_t*>(x.data());
  for (std::size_t i = 0; i < x.size_bytes(); ++i) {
    if (b[i] != ferry::test::shm_pattern(e.tag(), e.hook().value, i)) { return false; }
  }
  return true;
}

int typed(const std::string& name, std::uint64_t count)
{
  namespace fd = ferry::d2h;
  struct half { std::uint16_t bits; };  // F16, BF16: a user's type of the element's size
  struct byte8 { std::uint8_t bits; };  // F8_*
  fk::shm_reader r{name, 10s};
  say("attached " + std::to_string(r.stats().start_index) + " schema " + std::to_string(r.schema()->size()));
  for (std::uint64_t n = 0; n < count && !r.ended();) {
    for (auto& e : r.poll(64, 20ms)) {
      ++n;
      if (e.spec() == nullptr) {
        say("raw " + std::to_string(e.index()) + " " + std::to_string(e.hook().value) + " " + std::to_string(e.tag()) +
            " " + std::to_string(e.size()) + " " + (bytes_ok(e) ? "1" : "0"));
        continue;
      }
      const fd::typed_view t = e.typed();
      bool ok = false;
      switch (t.type()) {
        case fd::dtype::f64: ok = elements_ok<double>(t, e); break;
        case fd::dtype::f32: ok = elements_ok<float>(t, e); break;
        case fd::dtype::f16:
        case fd::dtype::bf16: ok = elements_ok<half>(t, e); break;
        case fd::dtype::f8_e4m3:
        case fd::dtype::f8_e5m2: ok = elements_ok<byte8>(t, e); break;
        case fd::dtype::i64: ok = elements_ok<std::int64_t>(t, e); break;
        case fd::dtype::i32: ok = elements_ok<std::int32_t>(t, e); break;
        case fd::dtype::i16: ok = elements_ok<std::int16_t>(t, e); break;
        case fd::dtype::i8: ok = elements_ok<std::int8_t>(t, e); break;
        case fd::dtype::u64: ok = elements_ok<std::uint64_t>(t, e); break;
        case fd::dtype::u32: ok = elements_ok<std::uint32_t>(t, e); break;
        case fd::dtype::u16: ok = elements_ok<std::uint16_t>(t, e); break;
        case fd::dtype::u8: ok = elements_ok<std::uint8_t>(t, e); break;
        case fd::dtype::boolean: ok = elements_ok<bool>(t, e); break;
      }
      std::string shape;
      for (const auto d : t.shape()) { shape += (shape.empty() ? "" : "x") + std::to_string(d); }
      say("typed " + std::to_string(e.index()) + " " + std::to_string(e.hook().value) + " " + std::to_string(e.tag()) +
          " " + t.name() + " " + std::string{fd::dtype_name(t.type())} + " " + shape + " " + (ok ? "1" : "0"));
    }
  }
  say(r.ended() ? "ended" : "done");
  return 0;
}

int attrib(const std::string& name, std::uint64_t count, long delay_us, long start_ms)
{
  fk::shm_reader r{name, 10s};
  say("attached " + std::to_string(r.stats().start_index));
  std::this_thread::sleep_for(std::chrono::milliseconds(start_ms));
  for (std::uint64_t n = 0; n < count && !r.ended();) {
    if (delay_us > 0) { std::this_thread::sleep_for(std::chrono::microseconds(delay_us)); }
    for (auto& e : r.poll(delay_us > 0 ? 1 : 64, 20ms)) {
      ++n;
      std::string what;
      say(ferry::test::shm_attr_line(e, what));
      if (!what.empty()) { say("what " + std::to_string(e.index()) + " " + what); }
    }
  }
  say(r.ended() ? "ended" : "done");
  return 0;
}

int produce(const std::string& name, std::uint64_t forwards)
{
  namespace fb = ferry::backend;
  namespace fd = ferry::d2h;
  using B = fb::host_backend;
  B b;
  b.set_device(fb::device_id{0});
  fk::shm_stream_config sc;
  sc.name = name;
  sc.staging_bytes = 1 << 20;
  fk::shm_stream stream{sc};
  fd::config cfg;
  cfg.ring_bytes = 1 << 20;
  fd::channel<B> ch{cfg, b, stream.callback(), stream.staging(b)};
  fb::stream<B> s{b};
  std::vector<fb::device_buffer<B>> src;
  for (std::uint32_t k = 0; k < ferry::test::shm_hooks; ++k) { src.emplace_back(ferry::test::shm_hook_bytes(k) * forwards + 1, b); }
  for (std::uint64_t f = 0; f < forwards; ++f) {
    fd::forward_meta m;
    m.tag = 1000 + f;
    ch.begin_forward(s, m);
    for (std::uint32_t k = 0; k < ferry::test::shm_hooks; ++k) {
      const auto bytes = ferry::test::shm_hook_bytes(k);
      auto data = ferry::test::shm_entry_bytes(1000 + f, k);
      auto* dst = static_cast<std::byte*>(src[k].data()) + f * bytes;
      b.memcpy_async(dst, data.data(), bytes, fb::memcpy_kind::host_to_device, s.handle());
      ch.capture(fd::hook_id{k}, dst, bytes, s);
    }
    (void)ch.end_forward(s);
  }
  while (ch.stats().entries_drained < forwards * ferry::test::shm_hooks) { std::this_thread::sleep_for(1ms); }
  say("published");
  sleep_forever();
}

}  // namespace

int main(int argc, char** argv)
{
  const std::vector<std::string> a(argv + 1, argv + argc);
  const auto num = [&](std::size_t i, long dflt) { return i < a.size() ? std::atol(a[i].c_str()) : dflt; };
  try {
    if (a.size() >= 3 && a[0] == "read") {
      return read(a[1], static_cast<std::uint64_t>(num(2, 0)), num(3, -1), num(4, 0), num(5, 0));
    }
    if (a.size() >= 3 && a[0] == "typed") { return typed(a[1], static_cast<std::uint64_t>(num(2, 0))); }
    if (a.size() >= 3 && a[0] == "attrib") { return attrib(a[1], static_cast<std::uint64_t>(num(2, 0)), num(3, 0), num(4, 0)); }
    if (a.size() >= 3 && a[0] == "stall") {
      fk::shm_reader r{a[1], 10s};
      auto e = r.poll(1, 10s);
      say(e.empty() ? "nothing" : "stalled");
      std::this_thread::sleep_for(std::chrono::milliseconds(num(2, 0)));
      try {
        (void)r.poll(1, 0us);
        say("still attached");
      } catch (const fk::reader_detached_error& x) {
        say(std::string{"detached "} + x.what());
      }
      sleep_forever();
    }
    if (a.size() >= 2 && a[0] == "hold") {
      fk::shm_reader r{a[1], 10s};
      say("attached");
      sleep_forever();
    }
    if (a.size() >= 3 && a[0] == "produce") { return produce(a[1], static_cast<std::uint64_t>(num(2, 0))); }
  } catch (const fk::stream_busy_error& e) {
    say(std::string{"error stream_busy_error "} + e.what());
    return 3;
  } catch (const fk::producer_gone_error& e) {
    say(std::string{"error producer_gone_error "} + e.what());
    return 3;
  } catch (const std::exception& e) {
    say(std::string{"error exception "} + e.what());
    return 3;
  }
  std::fprintf(stderr, "usage: ferry_shm_child read|typed|attrib|stall|hold|produce <name> ...\n");
  return 2;
}
