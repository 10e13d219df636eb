// SPDX-License-Identifier: Apache-2.0
// A small JSON reader for what ferry's sinks write (index.json, a safetensors shard's header): the whole of RFC 8259
// but for number forms the sinks never write (only non-negative integers; `u` holds one's exact value) and \u
// escapes above 0x7f. Throws std::runtime_error naming the byte where the text breaks the grammar. Used by the sink
// tests (tests/sink/run_reader.hpp) and the sink benchmark's read-back (bench/sink/shard_check.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace ferry::testing {

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

}  // namespace ferry::testing
