// SPDX-License-Identifier: Apache-2.0
// What a reader process reports of one entry's attribution (shm_child.cpp "attrib", shm_attribution_test.cpp):
// one line of key=value fields, and the helpers both sides compute it with (an FNV-1a digest, hex), so the test
// compares what the reader process saw with what it gave begin_forward.
#pragma once

#include <ferry/sink.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <sstream>
#include <string>

namespace ferry::test {

[[nodiscard]] inline std::uint64_t fnv1a(std::span<const std::byte> b)
{
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const std::byte x : b) { h = (h ^ static_cast<std::uint8_t>(x)) * 0x100000001b3ULL; }
  return h;
}
[[nodiscard]] inline std::string hex(std::span<const std::byte> b)
{
  static const char* d = "0123456789abcdef";
  std::string s;
  for (const std::byte x : b) {
    s += d[static_cast<std::uint8_t>(x) >> 4];
    s += d[static_cast<std::uint8_t>(x) & 15];
  }
  return s.empty() ? "-" : s;
}

/// The line of entry `e`: index hook forward tag status size reserved row_bytes rows attribution, then (present)
/// meta_tag selected requests ("request:first_row:rows,...") user (hex) rows_of ("request:digest,...",
/// row entries) whole_refused (rows_of of a whole entry: logic_error) unknown_refused (rows_of(2^63): logic_error),
/// (overflow) overflow ("record_bytes:capacity" of the attribution_overflow_error that requests() threw).
/// `what`: the message of what bytes() (an entry without bytes) or the attribution accessors threw.
[[nodiscard]] inline std::string shm_attr_line(const ferry::sink::shm_entry& e, std::string& what)
{
  namespace fk = ferry::sink;
  std::ostringstream o;
  o << "attr index=" << e.index() << " hook=" << e.hook().value << " forward=" << e.forward_index() << " tag=" << e.tag()
    << " status=" << static_cast<int>(e.status()) << " size=" << e.size() << " reserved=" << e.reserved_bytes()
    << " row_bytes=" << e.row_bytes() << " rows=" << e.rows() << " attribution="
    << (e.attribution() == fk::shm_attribution::present    ? "present"
        : e.attribution() == fk::shm_attribution::overflow ? "overflow"
                                                            : "none");
  if (!e.ok()) {
    try {
      (void)e.bytes();
    } catch (const std::exception& x) {
      what = x.what();
    }
  }
  if (e.attribution() == fk::shm_attribution::overflow) {
    try {
      (void)e.requests();
      o << " overflow=not-thrown";
    } catch (const fk::attribution_overflow_error& x) {
      o << " overflow=" << x.record_bytes() << ":" << x.capacity();
      what = x.what();
    }
    try {
      if (e.row_bytes() != 0 && e.ok()) { (void)e.rows_of(0); }
    } catch (const fk::attribution_overflow_error&) {
      o << " rows_of_overflow=1";
    }
    return o.str();
  }
  const ferry::d2h::forward_meta* m = e.meta();
  o << " meta=" << (m != nullptr ? 1 : 0);
  if (m == nullptr) { return o.str(); }
  o << " meta_tag=" << (m->tag ? std::to_string(*m->tag) : "-")
    << " selected=" << (m->selected ? std::to_string(*m->selected) : "-") << " requests=";
  for (std::size_t i = 0; i < m->requests.size(); ++i) {
    o << (i ? "," : "") << m->requests[i].request << ":" << m->requests[i].first_row << ":" << m->requests[i].rows;
  }
  if (m->requests.empty()) { o << "-"; }
  o << " user=" << hex(e.user());
  if (!e.ok()) { return o.str(); }
  const auto refused = [&](std::uint64_t request, const char* needle) {
    try {
      (void)e.rows_of(request);
    } catch (const ferry::logic_error& x) {
      return std::string{x.what()}.find(needle) != std::string::npos;
    }
    return false;
  };
  if (e.row_bytes() == 0) {
    o << " whole_refused=" << (m->requests.empty() || refused(m->requests[0].request, "captured whole") ? 1 : 0);
    return o.str();
  }
  o << " rows_of=";
  for (std::size_t i = 0; i < m->requests.size(); ++i) {
    const auto rows = e.rows_of(m->requests[i].request);
    o << (i ? "," : "") << m->requests[i].request << ":" << fnv1a(rows);
  }
  if (m->requests.empty()) { o << "-"; }
  o << " unknown_refused=" << (refused(std::uint64_t{1} << 63, "got request 9223372036854775808") ? 1 : 0);
  return o.str();
}

/// The fields of an "attr" line.
[[nodiscard]] inline std::map<std::string, std::string> attr_fields(const std::string& line)
{
  std::map<std::string, std::string> f;
  std::istringstream in{line};
  std::string w;
  while (in >> w) {
    if (const auto eq = w.find('='); eq != std::string::npos) { f[w.substr(0, eq)] = w.substr(eq + 1); }
  }
  return f;
}

}  // namespace ferry::test
