// SPDX-License-Identifier: Apache-2.0
// The read-back of a safetensors run (ferry_bench_sinks): index.json (marked complete, no error, its shard list's
// tensor counts and bytes, total_size and weight_map against the shards), then every shard it names (the 8-byte
// header size, the JSON header: every tensor's name "{tag}/{hook}", dtype, shape [tokens, *row] and data_offsets)
// and every byte of every tensor against pattern_word(tag * hooks + hook, i), the shards mapped read-only and the
// tensors checked by `threads` threads. A forward is whole when its tag has exactly one tensor of every hook.
// No temporary file may be left. JSON: the parser of the sink tests (ferry/testing/json_read.hpp).
#include "sinks.hpp"

#include <ferry/testing/json_read.hpp>
#include <ferry/testing/pattern.hpp>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ferry::bench::sinks {

namespace {

using ferry::testing::json;
using ferry::testing::parser;

struct hook_info {
  std::uint32_t id;
  std::string dtype;
  std::vector<std::uint64_t> shape;  ///< [tokens, *row_shape]
};

/// A shard mapped read-only (unmapped and closed at destruction).
struct mapped_file {
  int fd{-1};
  void* p{MAP_FAILED};
  std::uint64_t size{0};
  ~mapped_file()
  {
    if (p != MAP_FAILED) { ::munmap(p, size); }
    if (fd >= 0) { ::close(fd); }
  }
};

struct task {
  const std::byte* p;
  std::uint64_t n, key;
  const std::string* name;
};

std::string read_text(const fs::path& p)
{
  std::ifstream f{p, std::ios::binary};
  if (!f) { throw std::runtime_error("cannot open " + p.string()); }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

run_check check_run(const fs::path& dir, const forward_shape& shape, int threads)
{
  run_check r;
  const auto t0 = clk::now();
  const auto problem = [&](const std::string& what) {
    if (r.problems++ == 0) { r.first_problem = what; }
  };
  std::map<std::string, hook_info> hooks;
  const fd::hook_schema schema = shape.schema();  // alive through the loop (not a temporary of its range)
  for (const auto& h : schema.hooks()) {
    std::vector<std::uint64_t> s{shape.tokens};
    s.insert(s.end(), h.row_shape.begin(), h.row_shape.end());
    hooks[h.name] = {h.id.value, std::string{fd::dtype_name(h.type)}, s};
  }
  json index;
  try {
    index = parser{read_text(dir / "index.json")}.parse();
  } catch (const std::exception& e) {
    problem(std::string{"index.json: "} + e.what());
    return r;
  }
  std::vector<std::unique_ptr<mapped_file>> maps;
  std::vector<task> tasks;
  std::map<std::uint64_t, std::uint64_t> per_tag;
  std::unordered_set<std::uint64_t> seen;
  std::vector<json> headers;  // shared objects: a tensor's name stays where it is when the vector grows
  std::uint64_t tensors_total = 0;
  try {
    const json& meta = index["metadata"];
    if (!meta["complete"].boolean()) { problem("index.json: the run is not marked complete"); }
    if (meta.has("error")) { problem("index.json: the run recorded an error: " + meta["error"].str()); }
    for (const auto& sh : meta["shards"].arr()) {
      const std::string file = sh["file"].str();
      auto m = std::make_unique<mapped_file>();
      struct stat st {};
      m->fd = ::open((dir / file).c_str(), O_RDONLY | O_CLOEXEC);
      if (m->fd < 0 || ::fstat(m->fd, &st) != 0 || st.st_size < 8) {
        problem(file + ": cannot open or shorter than 8 bytes (" + std::strerror(errno) + ")");
        continue;
      }
      m->size = static_cast<std::uint64_t>(st.st_size);
      m->p = ::mmap(nullptr, m->size, PROT_READ, MAP_SHARED, m->fd, 0);
      if (m->p == MAP_FAILED) {
        problem(file + ": mmap: " + std::strerror(errno));
        continue;
      }
      (void)::madvise(m->p, m->size, MADV_SEQUENTIAL);
      const auto* base = static_cast<const std::byte*>(m->p);
      std::uint64_t n = 0;
      std::memcpy(&n, base, 8);  // little-endian (x86-64, aarch64)
      if (n > m->size - 8) {
        problem(file + ": header size past the end of the file");
        continue;
      }
      ++r.shards;
      r.file_bytes += m->size;
      headers.push_back(parser{std::string_view{reinterpret_cast<const char*>(base) + 8, n}}.parse());
      const json& h = headers.back();  // its names outlive the loop (the tasks point at them)
      const std::byte* data = base + 8 + n;
      const std::uint64_t data_len = m->size - 8 - n;
      std::uint64_t tensors = 0, bytes = 0;
      for (const auto& [name, v] : h.obj()) {
        if (name == "__metadata__") { continue; }
        ++tensors;
        const auto slash = name.find('/');
        const auto it = slash == std::string::npos ? hooks.end() : hooks.find(name.substr(slash + 1));
        const bool digits = slash != std::string::npos && slash > 0 &&
                            name.find_first_not_of("0123456789") == slash;
        const auto o = v["data_offsets"].uints();
        const bool fits = it != hooks.end() && digits && v["dtype"].str() == it->second.dtype &&
                          v["shape"].uints() == it->second.shape && o.size() == 2 && o[0] <= o[1] &&
                          o[1] <= data_len && o[1] - o[0] == shape.bytes[it->second.id];
        const std::uint64_t tag = digits ? std::stoull(name.substr(0, slash)) : 0;
        if (!fits || !seen.insert(shape.key(tag, it->second.id)).second) {
          ++r.entries_checked;
          ++r.entries_bad;
          problem(file + ": tensor " + name + ": a name, dtype, shape or size other than captured, or a repeat");
          continue;
        }
        tasks.push_back({data + o[0], o[1] - o[0], shape.key(tag, it->second.id), &name});
        ++per_tag[tag];
        bytes += o[1] - o[0];
      }
      if (tensors != sh["tensors"].u || bytes != sh["bytes"].u) {
        problem(file + ": index.json's tensor count or bytes differ from the shard's");
      }
      tensors_total += tensors;
      r.data_bytes += bytes;
      maps.push_back(std::move(m));
    }
    if (index["weight_map"].obj().size() != tensors_total) { problem("index.json: weight_map names other tensors"); }
    if (meta["total_size"].u != r.data_bytes) { problem("index.json: total_size differs from the shards' data"); }
  } catch (const std::exception& e) {
    problem(std::string{"index.json or a shard header: "} + e.what());
  }
  for (const auto& e : fs::directory_iterator{dir}) {
    const std::string n = e.path().filename().string();
    if (n.starts_with('.') && n.ends_with(".tmp")) { problem("a temporary file was left: " + n); }
  }
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> bad{0};
  std::mutex mu;
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(threads, 1); ++t) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < tasks.size();) {
        const task& k = tasks[i];
        if (ferry::testing::first_pattern_mismatch(k.p, k.n, k.key) != k.n) {
          bad.fetch_add(1);
          std::lock_guard lock{mu};
          problem("tensor " + *k.name + ": bytes other than captured");
        }
      }
    });
  }
  for (auto& t : pool) { t.join(); }
  r.entries_checked += tasks.size();
  r.entries_bad += bad.load();
  for (const auto& [tag, n] : per_tag) {
    r.tags.insert(tag);
    if (n != shape.hooks) { ++r.forwards_torn; }
  }
  r.forwards = per_tag.size();
  r.seconds = std::chrono::duration<double>(clk::now() - t0).count();
  return r;
}

}  // namespace ferry::bench::sinks
