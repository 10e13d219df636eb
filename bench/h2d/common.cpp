// SPDX-License-Identifier: Apache-2.0
// Shared setup of the H2D benchmarks: the cases, the median, the JSON helpers, the mismatch flag (common.hpp).
#include "common.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ferry::bench {

std::vector<member> decode256()
{
  using u = fh::count_unit;
  return {
    {"input_ids", u::elements, 4, 0, 256},     {"positions", u::elements, 8, 0, 256},
    {"seq_lens", u::elements, 4, 0, 256},      {"slot_mapping", u::elements, 8, 0, 256},
    {"block_tables", u::rows, 4, 256, 256},    {"query_start_loc", u::elements, 4, 0, 257},
    {"temperature", u::elements, 4, 0, 256},   {"top_p", u::elements, 4, 0, 256},
    {"top_k", u::elements, 4, 0, 256},         {"min_p", u::elements, 4, 0, 256},
    {"seeds", u::elements, 8, 0, 256},         {"logits_indices", u::elements, 4, 0, 256},
  };
}

std::vector<member> uniform(std::size_t n, std::size_t bytes)
{
  std::vector<member> v;
  for (std::size_t i = 0; i < n; ++i) { v.push_back({fmt::format("m{}", i), fh::count_unit::bytes, 1, 0, bytes}); }
  return v;
}

std::size_t total_bytes(const std::vector<member>& members)
{
  std::size_t bytes = 0;
  for (const auto& m : members) { bytes += m.bytes(); }
  return bytes;
}

std::vector<named_case> anchor_cases()
{
  return {{"decode256", decode256()}, {"tiny4", uniform(4, 64)}, {"small32", uniform(32, 256)}, {"small64", uniform(64, 512)}};
}

double median(std::vector<double> v)
{
  if (v.empty()) { return -1.0; }
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::string json_num(double v) { return v < 0 ? "null" : fmt::format("{:.3f}", v); }

std::string json_escape(std::string s)
{
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') { o.push_back('\\'); }
    if (static_cast<unsigned char>(c) >= 0x20) { o.push_back(c); }
  }
  return o;
}

namespace {
bool g_mismatch = false;
}  // namespace

void note_mismatch() { g_mismatch = true; }
bool mismatch_seen() { return g_mismatch; }

}  // namespace ferry::bench
