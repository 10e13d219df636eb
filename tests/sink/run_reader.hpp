// SPDX-License-Identifier: Apache-2.0
// The sink tests' independent reader of what a safetensors sink wrote: a small JSON parser (the whole of
// RFC 8259 but for number forms the sink never writes), a shard reader (8-byte little-endian header size,
// the JSON header, the data section) and a run reader (index.json and every shard it names), each checking
// the format's rules and failing the test with the file and the rule when one is broken.
#pragma once

#include <gtest/gtest.h>

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

struct json;
using json_array = std::vector<json>;
using json_object = std::vector<std::pair<std::string, json>>;  // in file order
struct json {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<json_array>, std::shared_ptr<json_object>> v;
  std::uint64_t u{0};  // a non-negative integer's exact value
  [[nodiscard]] const json& operator[](const std::string& k) const
  {
    for (const auto& [key, val] : obj()) {
      if (key == k) { return val; }
    }
    throw std::runtime_error("json: no key " + k);
  }
  [[nodiscard]] bool has(const std::string& k) const
  {
    for (const auto& kv : obj()) {
      if (kv.first == k) { return true; }
    }
    return false;
  }
  [[nodiscard]] const json_object& obj() const { return *std::get<std::shared_ptr<json_object>>(v); }
  [[nodiscard]] const json_array& arr() const { return *std::get<std::shared_ptr<json_array>>(v); }
  [[nodiscard]] const std::string& str() const { return std::get<std::string>(v); }
  [[nodiscard]] bool boolean() const { return std::get<bool>(v); }
  [[nodiscard]] std::vector<std::uint64_t> uints() const
  {
    std::vector<std::uint64_t> r;
    for (const auto& e : arr()) { r.push_back(e.u); }
    return r;
  }
};

class parser {
 public:
  explicit parser(std::string_view s) : s_{s} {}
  json parse()
  {
    json j = value();
    ws();
    if (i_ != s_.size()) { fail("trailing bytes"); }
    return j;
  }

 private:
  [[noreturn]] void fail(const std::string& what) { throw std::runtime_error("json: " + what + " at byte " + std::to_string(i_)); }
  void ws()
  {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) { ++i_; }
  }
  char peek()
  {
    ws();
    if (i_ >= s_.size()) { fail("unexpected end"); }
    return s_[i_];
  }
  void expect(char c)
  {
    if (peek() != c) { fail(std::string("expected '") + c + "'"); }
    ++i_;
  }
  std::string string()
  {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) { fail("control character in a string"); }
      if (c == '\\') {
        if (i_ >= s_.size()) { fail("unfinished escape"); }
        c = s_[i_++];
        if (c == 'u') {
          if (i_ + 4 > s_.size()) { fail("short \\u escape"); }
          const unsigned cp = static_cast<unsigned>(std::stoul(std::string(s_.substr(i_, 4)), nullptr, 16));
          i_ += 4;
          if (cp >= 0x80) { fail("the sink escapes only control characters"); }
          out += static_cast<char>(cp);
          continue;
        }
        const std::string from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
        const auto k = from.find(c);
        if (k == std::string::npos) { fail("bad escape"); }
        out += to[k];
        continue;
      }
      out += c;
    }
    expect('"');
    return out;
  }
  json value()
  {
    const char c = peek();
    json j;
    if (c == '{') {
      ++i_;
      auto o = std::make_shared<json_object>();
      if (peek() != '}') {
        for (;;) {
          std::string k = string();
          expect(':');
          o->emplace_back(std::move(k), value());
          if (peek() == ',') {
            ++i_;
            continue;
          }
          break;
        }
      }
      expect('}');
      j.v = o;
    } else if (c == '[') {
      ++i_;
      auto a = std::make_shared<json_array>();
      if (peek() != ']') {
        for (;;) {
          a->push_back(value());
          if (peek() == ',') {
            ++i_;
            continue;
          }
          break;
        }
      }
      expect(']');
      j.v = a;
    } else if (c == '"') {
      j.v = string();
    } else if (s_.substr(i_, 4) == "true" || s_.substr(i_, 5) == "false" || s_.substr(i_, 4) == "null") {
      const bool t = s_[i_] == 't';
      const bool n = s_[i_] == 'n';
      i_ += t || n ? 4 : 5;
      if (n) { j.v = nullptr; } else { j.v = t; }
    } else if (c >= '0' && c <= '9') {
      std::uint64_t u = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') { u = u * 10 + static_cast<std::uint64_t>(s_[i_++] - '0'); }
      j.u = u;
      j.v = static_cast<double>(u);
    } else {
      fail(std::string("unexpected '") + c + "'");
    }
    return j;
  }
  std::string_view s_;
  std::size_t i_{0};
};

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
  std::vector<tensor> tensors;                   // in shard order, then data order
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
  }
  if (named != weight_map.size()) { throw std::runtime_error("index.json: weight_map names tensors of no shard"); }
  if (total != meta["total_size"].u) { throw std::runtime_error("index.json: total_size"); }
  return r;
}

}  // namespace ferry::test::sinkread
