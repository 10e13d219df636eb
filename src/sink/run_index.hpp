// SPDX-License-Identifier: Apache-2.0
// The run directory of a shard sink (sink/safetensors.hpp): preparing it (created if missing; another run's
// files refused, or removed with overwrite), and its index.json in the style of Hugging Face's sharded
// checkpoints (model.safetensors.index.json): {"metadata": {...}, "weight_map": {tensor: file}}, rewritten
// whole (temporary name, rename) after every published shard, so the index on disk always names complete
// shards only. The metadata holds the format, ferry's version, the tensor naming rule, the schema, per shard
// its file, bytes, tensor count, tags and their forwards' ordinals in the run ("order": several shards written at
// once hold interleaved forwards), and whether the run was closed (with its first error, if any).
#pragma once

#include <ferry/d2h/hook_schema.hpp>
#include "json.hpp"
#include "posix_file.hpp"
#include "shard_file.hpp"
#include <ferry/version.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace ferry::sink::detail {

inline constexpr std::string_view index_name = "index.json";
inline constexpr std::string_view run_format = "ferry.shards";
inline constexpr std::uint64_t run_format_version = 1;

/// Whether `name` is a file of a run: index.json, shard-<digits>.safetensors, or a temporary of either.
[[nodiscard]] inline bool is_run_file(std::string_view name)
{
  if (name == index_name || name == ".index.json.tmp") { return true; }
  if (name.starts_with('.')) { name.remove_prefix(1); }
  if (!name.starts_with("shard-")) { return false; }
  name.remove_prefix(6);
  std::size_t digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') { ++digits; }
  name.remove_prefix(digits);
  return digits >= 5 && (name == ".safetensors" || name == ".safetensors.tmp" || name == ".safetensors.moved.tmp");
}

/// Creates `dir` if missing; refuses a directory holding a run's files (existing_run_error) unless `overwrite`,
/// which removes them (and only them).
inline void prepare_run_dir(const fs::path& dir, bool overwrite)
{
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) { FERRY_FAIL_IO(io_error, dir, ec.value(), "sink: creating the run directory {}", dir.string()); }
  if (!fs::is_directory(dir, ec)) {
    FERRY_FAIL_IO(io_error, dir, ENOTDIR, "sink: run directory {}: expected a directory", dir.string());
  }
  std::vector<fs::path> found;
  for (fs::directory_iterator it{dir, ec}, end; !ec && it != end; it.increment(ec)) {
    if (is_run_file(it->path().filename().string())) { found.push_back(it->path()); }
  }
  if (ec) { FERRY_FAIL_IO(io_error, dir, ec.value(), "sink: listing the run directory {}", dir.string()); }
  if (!found.empty() && !overwrite) {
    std::string some;
    for (std::size_t i = 0; i < found.size() && i < 3; ++i) {
      some += (i != 0 ? ", " : "") + found[i].filename().string();
    }
    FERRY_FAIL_IO(existing_run_error, dir, EEXIST,
                  "sink: run directory {}: expected no other run's files (or overwrite = true), got {} of them ({}{})",
                  dir.string(), found.size(), some, found.size() > 3 ? ", ..." : "");
  }
  for (const auto& p : found) {
    if (!fs::remove(p, ec) && ec) {
      FERRY_FAIL_IO(io_error, p, ec.value(), "sink: overwrite: removing {}", p.string());
    }
  }
}

class run_index {
 public:
  run_index(fs::path dir, const d2h::hook_schema& schema, bool durable) : dir_{std::move(dir)}, durable_{durable}
  {
    schema_ = "{";
    for (const auto& h : schema.hooks()) {
      json::append_key(schema_, std::to_string(h.id.value), schema_.size() == 1);
      schema_ += "{\"name\":" + json::string(h.name) + ",\"dtype\":\"" + std::string{d2h::dtype_name(h.type)} +
                 "\",\"row_shape\":";
      json::append_array(schema_, h.row_shape);
      if (!h.reduce.empty()) {  // a reduced hook: its reducer and row width (ferry.reduce.decode reads them)
        schema_ += ",\"reduce\":" + json::string(h.reduce) + ",\"width\":" + std::to_string(h.reduce_width);
      }
      if (h.shard.world != 0) {  // a tensor-parallel slice (ferry.tp assembles the ranks' runs)
        const auto& l = h.shard;
        schema_ += ",\"shard\":{\"world\":" + std::to_string(l.world) + ",\"rank\":" + std::to_string(l.rank) +
                   ",\"dim\":" + std::to_string(l.dim) + ",\"offset\":" + std::to_string(l.offset) +
                   ",\"full\":" + std::to_string(l.full) + "}";
      }
      schema_ += '}';
    }
    schema_ += '}';
  }

  /// Records a published shard (its file name, tensors and forwards).
  void add_shard(const std::string& file, const std::vector<tensor_record>& tensors,
                 const std::vector<forward_record>& forwards, std::uint64_t bytes)
  {
    if (!shards_.empty()) { shards_ += ','; }
    shards_ += "{\"file\":" + json::string(file) + ",\"bytes\":" + std::to_string(bytes) +
               ",\"tensors\":" + std::to_string(tensors.size()) + ",\"tags\":[";
    for (std::size_t i = 0; i < forwards.size(); ++i) {
      shards_ += (i != 0 ? "," : "") + std::to_string(forwards[i].tag);
    }
    shards_ += "],\"order\":[";  // each forward's ordinal in the run: shards written at once hold every other one
    for (std::size_t i = 0; i < forwards.size(); ++i) {
      shards_ += (i != 0 ? "," : "") + std::to_string(forwards[i].seq);
    }
    shards_ += "]}";
    const std::string quoted = json::string(file);
    for (const auto& t : tensors) {
      json::append_key(weight_map_, t.name, weight_map_.empty());
      weight_map_ += quoted;
    }
    total_ += bytes;
  }

  /// Records a forward refused for repeating tag `tag` (its entries not written): index.json lists it
  /// ("refused_tags"), so a reader sees the repeat whatever the run's first error is (ferry.tp).
  void refuse_tag(std::uint64_t tag) { refused_ += (refused_.empty() ? "" : ",") + std::to_string(tag); }

  /// Writes index.json (temporary name, rename; fsync with `durable`). `complete`: the run was closed;
  /// `error`: its first error (empty: none). The temporary was reserved by the write before (twice that index's
  /// size and a page), so that while the writer fills the disk with the next shard, the index that lists
  /// the last one still finds its room; after an incomplete index the next one's room is reserved (best effort).
  void write(bool complete, std::string_view error)
  {
    std::string s = "{\"metadata\":{\"format\":";
    json::append_string(s, run_format);
    s += ",\"format_version\":" + std::to_string(run_format_version) +
         ",\"ferry_version\":" + json::string(ferry::version) +
         ",\"tensor_name\":\"{tag}/{hook}\",\"complete\":" + (complete ? "true" : "false") +
         ",\"total_size\":" + std::to_string(total_) + ",\"schema\":" + schema_ + ",\"shards\":[" + shards_ + "]" +
         ",\"refused_tags\":[" + refused_ + "]";
    if (!error.empty()) { s += ",\"error\":" + json::string(error); }
    s += "},\"weight_map\":{" + weight_map_ + "}}\n";
    const fs::path tmp = temporary();
    try {
      if (!spare_.is_open() || room_ < s.size()) {
        spare_ = file::create(tmp);
        room_ = 0;
      }
      spare_.write_at(s.data(), s.size(), 0);
      spare_.truncate(s.size());
      if (durable_) { spare_.sync(); }
      spare_.close();
      rename_file(tmp, dir_ / index_name);
    } catch (...) {
      spare_ = file{};
      remove_quietly(tmp);
      throw;
    }
    if (durable_) { sync_dir(dir_); }
    if (complete) { return; }
    try {  // the next index's room
      spare_ = file::create(tmp);
      room_ = 2 * s.size() + 4096;
      if (!spare_.reserve(room_)) { room_ = 0; }
    } catch (const io_error&) {  // no room for the temporary itself: the next write tries again
      room_ = 0;
    }
  }

  ~run_index()
  {
    if (spare_.is_open()) {  // a run that ended without its complete index: no temporary left behind
      spare_ = file{};
      remove_quietly(temporary());
    }
  }
  run_index(const run_index&) = delete;
  run_index& operator=(const run_index&) = delete;

 private:
  /// .index.json.tmp: each index is written there, then renamed (a reader sees the old index or the new one).
  [[nodiscard]] fs::path temporary() const { return dir_ / ("." + std::string{index_name} + ".tmp"); }

  fs::path dir_;
  bool durable_;
  std::string schema_;
  std::string shards_;
  std::string weight_map_;
  std::string refused_;  // tags of forwards refused as repeats, comma-separated
  std::uint64_t total_{0};
  file spare_;             // .index.json.tmp, open between writes, with room_ bytes reserved
  std::uint64_t room_{0};
};

}  // namespace ferry::sink::detail
