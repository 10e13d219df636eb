// SPDX-License-Identifier: Apache-2.0
// The sink tests' independent reader of what a safetensors sink wrote: a small JSON parser (the whole of
// RFC 8259 but for number forms the sink never writes), a shard reader (8-byte little-endian header size,
// the JSON header, the data section) and a run reader (index.json and every shard it names), each checking
// the format's rules and failing the test with the file and the rule when one is broken.
#pragma once

#include <ferry/testing/json_read.hpp>
#include "src/sink/crc32.hpp"  // the sink's own CRC-32 (src/sink, compiled into ferry::core)

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace ferry::test::sinkread {

namespace fs = std::filesystem;

using ferry::testing::json;
using ferry::testing::json_array;
using ferry::testing::json_object;
using ferry::testing::parser;

inline std::string read_file(const fs::path& p)
{
  std::ifstream f{p, std::ios::binary};
  if (!f) { throw std::runtime_error("cannot open " + p.string()); }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct tensor {
  std::string name, dtype, file;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint8_t> bytes;
};

/// One shard, checked: header size within the file, JSON, every tensor's data_offsets consecutive from 0
/// covering the data section exactly, shape x dtype = its bytes. Tensors in data order.
struct shard {
  std::map<std::string, std::string> metadata;
  std::vector<tensor> tensors;
  std::uint64_t header_bytes{0};
};

inline std::uint64_t dtype_size(const std::string& d)
{
  static const std::map<std::string, std::uint64_t> m{{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1},
                                                      {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
                                                      {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}};
  const auto it = m.find(d);
  if (it == m.end()) { throw std::runtime_error("unknown dtype " + d); }
  return it->second;
}

inline shard read_shard(const fs::path& p)
{
  const std::string b = read_file(p);
  const auto bad = [&](const std::string& w) { return std::runtime_error(p.string() + ": " + w); };
  if (b.size() < 8) { throw bad("shorter than 8 bytes"); }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) { n = n << 8 | static_cast<unsigned char>(b[static_cast<std::size_t>(i)]); }
  if (n > b.size() - 8) { throw bad("header size past the end"); }
  if ((8 + n) % 8 != 0) { throw bad("data section not 8-byte aligned"); }
  json h;
  try {
    h = parser{std::string_view{b}.substr(8, n)}.parse();
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
  shard s;
  s.header_bytes = n;
  const std::uint64_t data = b.size() - 8 - n;
  std::vector<tensor> t;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> offs;
  for (const auto& [k, v] : h.obj()) {
    if (k == "__metadata__") {
      for (const auto& [mk, mv] : v.obj()) { s.metadata[mk] = mv.str(); }
      continue;
    }
    tensor x{k, v["dtype"].str(), p.filename().string(), v["shape"].uints(), {}};
    const auto o = v["data_offsets"].uints();
    if (o.size() != 2 || o[0] > o[1] || o[1] > data) { throw bad("bad data_offsets of " + k); }
    std::uint64_t elems = 1;
    for (const auto d : x.shape) { elems *= d; }
    if (elems * dtype_size(x.dtype) != o[1] - o[0]) { throw bad("shape x dtype != bytes of " + k); }
    x.bytes.assign(b.begin() + static_cast<std::ptrdiff_t>(8 + n + o[0]), b.begin() + static_cast<std::ptrdiff_t>(8 + n + o[1]));
    t.push_back(std::move(x));
    offs.push_back({o[0], o[1]});
  }
  std::vector<std::size_t> order(t.size());
  for (std::size_t i = 0; i < order.size(); ++i) { order[i] = i; }
  std::sort(order.begin(), order.end(), [&](auto a, auto c) { return offs[a] < offs[c]; });
  std::uint64_t at = 0;
  for (const auto i : order) {
    if (offs[i].first != at) { throw bad("a hole or an overlap in the data section"); }
    at = offs[i].second;
    s.tensors.push_back(std::move(t[i]));
  }
  if (at != data) { throw bad("data section longer than its tensors"); }
  return s;
}

/// A run: index.json and every shard it names, checked against each other (weight_map names exactly the
/// shards' tensors; the shard list's tensor counts, bytes and tags match the shards; total_size).
struct run {
  json index;
  std::vector<std::string> files;
  std::vector<std::vector<std::uint64_t>> tags;  // per shard
  std::vector<tensor> tensors;                   // in forward order (index.json's "order"), then data order
  std::vector<std::uint64_t> forward_tags;       // every shard's tags, in forward order
};

inline run read_run(const fs::path& dir)
{
  run r;
  r.index = parser{read_file(dir / "index.json")}.parse();
  const auto& meta = r.index["metadata"];
  const auto& wm = r.index["weight_map"];
  std::map<std::string, std::string> weight_map;
  for (const auto& [k, v] : wm.obj()) {
    if (!weight_map.emplace(k, v.str()).second) { throw std::runtime_error("index.json: " + k + " twice"); }
  }
  std::uint64_t total = 0;
  std::size_t named = 0;
  std::map<std::uint64_t, std::uint64_t> seq;       // tag -> the forward's ordinal
  std::map<std::uint64_t, std::uint64_t> by_order;  // the forward's ordinal -> tag
  for (const auto& sh : meta["shards"].arr()) {
    const std::string f = sh["file"].str();
    shard s = read_shard(dir / f);
    if (s.tensors.size() != sh["tensors"].u) { throw std::runtime_error("index.json: tensor count of " + f); }
    std::uint64_t bytes = 0;
    for (auto& t : s.tensors) {
      bytes += t.bytes.size();
      const auto it = weight_map.find(t.name);
      if (it == weight_map.end() || it->second != f) { throw std::runtime_error("index.json: weight_map of " + t.name); }
      ++named;
      r.tensors.push_back(std::move(t));
    }
    if (bytes != sh["bytes"].u) { throw std::runtime_error("index.json: bytes of " + f); }
    total += bytes;
    r.files.push_back(f);
    r.tags.push_back(sh["tags"].uints());
    const auto order = sh["order"].uints();
    if (order.size() != r.tags.back().size()) { throw std::runtime_error("index.json: order of " + f); }
    for (std::size_t i = 0; i < order.size(); ++i) {
      seq[r.tags.back()[i]] = order[i];
      by_order[order[i]] = r.tags.back()[i];
    }
  }
  if (named != weight_map.size()) { throw std::runtime_error("index.json: weight_map names tensors of no shard"); }
  if (total != meta["total_size"].u) { throw std::runtime_error("index.json: total_size"); }
  // shards written at once hold interleaved forwards: the run in forward order
  const auto seq_of = [&](const tensor& t) { return seq.at(std::stoull(t.name.substr(0, t.name.find('/')))); };
  std::stable_sort(r.tensors.begin(), r.tensors.end(),
                   [&](const tensor& a, const tensor& b) { return seq_of(a) < seq_of(b); });
  for (const auto& [ordinal, tag] : by_order) { r.forward_tags.push_back(tag); }
  return r;
}

/// The shard's "ferry.forwards" ([[tag, begin, end, crc32, tensors], ...]) against its data section, by the sink's own
/// CRC-32 over each forward's bytes whole (the sink joins pieces computed apart: lent entries').
inline void expect_forward_crcs(const fs::path& p)
{
  const std::string b = read_file(p);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) { n = n << 8 | static_cast<unsigned char>(b[static_cast<std::size_t>(i)]); }
  const auto shard = read_shard(p);
  const auto fwd = parser{shard.metadata.at("ferry.forwards")}.parse();
  std::uint64_t at = 0;
  for (const auto& f : fwd.arr()) {
    const auto v = f.uints();
    ASSERT_EQ(v.size(), 5U);
    EXPECT_EQ(v[1], at) << p << ": forwards are consecutive";
    at = v[2];
    EXPECT_EQ(ferry::sink::detail::crc32(b.data() + 8 + n + v[1], v[2] - v[1]), v[3]) << p << " tag " << v[0];
  }
  EXPECT_EQ(at, b.size() - 8 - n) << p;
  EXPECT_EQ(shard.metadata.at("format"), "pt");
  EXPECT_EQ(shard.metadata.at("ferry.format"), "ferry.shards");
}

}  // namespace ferry::test::sinkread
