// SPDX-License-Identifier: Apache-2.0
// One safetensors shard being written (sink/safetensors.hpp): a temporary file `.shard-NNNNN.safetensors.tmp`
// whose data section starts at a reserved offset (the header is written last, when every tensor is known),
// the tensors of its committed forwards and of the forward still open (pending: dropped by rollback(), or
// moved whole into the next shard by move_pending()), and per forward its byte range and CRC-32: the writer's over
// the bytes it copies, an I/O thread's over each lent entry (data_stream::append_lent), joined by crc32_combine once
// the shard's writes are drained (resolve_crcs(), before its header is made). publish()
// writes the header (padded with spaces, which the format allows; the data is copied once to a new offset
// when the reservation was too small or far too large), truncates, optionally fsyncs, renames the file to
// `shard-NNNNN.safetensors` and fsyncs the directory. A shard never published removes its temporary file.
// The data goes through a data_stream: with the sink's write_pipeline (I/O threads; O_DIRECT when asked and
// the filesystem takes it: the data section then starts at a 4 KiB boundary), else a pwrite per tensor.
#pragma once

#include <ferry/d2h/dtype.hpp>
#include <ferry/detail/align.hpp>
#include <ferry/detail/format.hpp>
#include "crc32.hpp"
#include "data_stream.hpp"
#include "json.hpp"
#include "posix_file.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ferry::sink::detail {

/// A tensor of a shard: offsets relative to the start of the data section (safetensors' data_offsets).
struct tensor_record {
  std::string name;
  d2h::dtype type{};
  std::vector<std::uint64_t> shape;
  std::uint64_t begin{0};
  std::uint64_t end{0};
};

/// Consecutive bytes of a forward whose CRC-32 was computed apart: `*crc` over `bytes` (set by the writer for copied
/// bytes, by an I/O thread for a lent entry's).
struct crc_piece {
  const std::uint32_t* crc;
  std::uint64_t bytes;
};

/// A forward of a shard: its tag, its data range, the CRC-32 of those bytes (valid after shard_file::resolve_crcs():
/// its pieces' joined), its tensor count and its ordinal in the run (index.json's "order": readers merge the shards
/// written at once in forward order).
struct forward_record {
  std::uint64_t tag{0};
  std::uint64_t begin{0};
  std::uint64_t end{0};
  std::uint32_t crc{0};
  std::uint64_t tensors{0};
  std::uint64_t seq{0};
  std::vector<crc_piece> pieces{};
};

/// `,"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}` (the leading comma included).
inline void append_record(std::string& out, const tensor_record& t)
{
  json::append_key(out, t.name);
  out += "{\"dtype\":\"";
  out += d2h::dtype_name(t.type);
  out += "\",\"shape\":";
  json::append_array(out, t.shape);
  out += ",\"data_offsets\":";
  json::append_array(out, {t.begin, t.end});
  out += '}';
}
[[nodiscard]] inline std::uint64_t record_bytes(const tensor_record& t)
{
  std::string s;
  append_record(s, t);
  return s.size();
}

/// "shard-00007.safetensors".
[[nodiscard]] inline std::string shard_name(std::uint64_t number)
{
  return ferry::detail::format("shard-{:05}.safetensors", number);
}

class shard_file {
 public:
  /// Creates `dir/.shard-NNNNN.safetensors.tmp`; the data starts at `reserve` (rounded up to 8: aligned data;
  /// to 4 KiB with a pipeline). `pipe` outlives the shard; null: synchronous writes on the calling thread (the
  /// unit tests' mode, the reference the pipeline is tested against; shard_writer always gives its pipeline);
  /// `direct`: its data written with O_DIRECT where the filesystem allows.
  shard_file(fs::path dir, std::uint64_t number, std::uint64_t reserve, write_pipeline* pipe = nullptr,
             bool direct = false)
      : dir_{std::move(dir)},
        number_{number},
        name_{shard_name(number)},
        tmp_{dir_ / ("." + name_ + ".tmp")},
        data_start_{
            ferry::detail::align_up(std::max<std::uint64_t>(reserve, 64), pipe != nullptr ? write_pipeline::align : 8)},
        f_{file::create(tmp_)},
        d_{direct && pipe != nullptr ? file::open_direct(tmp_) : file{}},
        s_{f_, d_, data_start_, pipe}
  {
    // The header's room taken now (best effort): a disk that the next shard fills while this one is finished on
    // another thread still takes its header.
    (void)f_.reserve(data_start_);
  }
  shard_file(const shard_file&) = delete;
  shard_file& operator=(const shard_file&) = delete;
  ~shard_file()
  {
    if (!published_) {
      s_.release();  // no write of ours in flight before the descriptors close
      d_ = file{};
      f_ = file{};
      remove_quietly(tmp_);
    }
  }

  [[nodiscard]] std::uint64_t number() const noexcept { return number_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::uint64_t committed_bytes() const noexcept { return committed_; }
  [[nodiscard]] std::uint64_t pending_bytes() const noexcept { return pending_; }
  /// JSON bytes of every tensor record (committed and pending): the header's size but for its metadata.
  [[nodiscard]] std::uint64_t record_json_bytes() const noexcept { return records_; }
  [[nodiscard]] const std::vector<tensor_record>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const std::vector<forward_record>& forwards() const noexcept { return forwards_; }
  [[nodiscard]] std::uint64_t committed_tensors() const noexcept { return committed_tensors_; }
  /// Whether append() may lend large entries (a pipeline, no O_DIRECT: data_stream::lends).
  [[nodiscard]] bool lends() const noexcept { return s_.lends(); }
  /// finish() renamed it: complete under its final name.
  [[nodiscard]] bool published() const noexcept { return published_; }

  /// Writes one tensor of the open forward after everything written so far. `owner` (may be null) keeps `bytes`
  /// alive: at least `lend_min` of them (not 0) go to the pipeline from there, uncopied, where the file takes
  /// unaligned writes (data_stream::lends); otherwise they are copied before append() returns. True: lent.
  bool append(std::string name, d2h::dtype type, std::vector<std::uint64_t> shape, std::span<const std::byte> bytes,
              std::shared_ptr<void> owner = {}, std::size_t lend_min = 0)
  {
    const std::uint64_t off = committed_ + pending_;
    const bool lend = owner != nullptr && lend_min != 0 && bytes.size() >= lend_min && s_.lends();
    if (lend) {
      end_copied_piece();
      std::uint32_t& crc = crcs_.emplace_back(0);  // an I/O thread's (a deque's elements stay where they are)
      pieces_.push_back({&crc, bytes.size()});
      s_.append_lent(bytes.data(), bytes.size(), &crc, std::move(owner));
    } else {
      s_.append(bytes.data(), bytes.size(), crc_);
      copied_ += bytes.size();
    }
    tensors_.push_back(tensor_record{std::move(name), type, std::move(shape), off, off + bytes.size()});
    records_ += record_bytes(tensors_.back());
    pending_ += bytes.size();
    return lend;
  }
  /// The open forward (the run's forward `seq`) is complete: it becomes part of the shard.
  void commit(std::uint64_t tag, std::uint64_t seq = 0)
  {
    end_copied_piece();
    forwards_.push_back(
        {tag, committed_, committed_ + pending_, 0, tensors_.size() - committed_tensors_, seq, std::move(pieces_)});
    pieces_.clear();
    committed_ += pending_;
    committed_tensors_ = tensors_.size();
    pending_ = 0;
  }
  /// Waits for the shard's writes (and its lent entries' CRCs), then sets each forward's CRC from its pieces.
  /// Throws the kept error of a failed write.
  void resolve_crcs()
  {
    s_.drain();
    for (auto& f : forwards_) {
      if (f.pieces.empty()) { continue; }
      f.crc = joined(f.pieces);
      f.pieces.clear();
    }
  }
  /// Forgets the open forward (its bytes are overwritten by the next one, or cut by publish()).
  void rollback()
  {
    for (std::size_t i = committed_tensors_; i < tensors_.size(); ++i) { records_ -= record_bytes(tensors_[i]); }
    tensors_.resize(committed_tensors_);
    s_.seek(committed_);
    pending_ = 0;
    crc_ = 0;
    copied_ = 0;
    pieces_.clear();
  }
  /// Moves the open forward (bytes and tensors) into `next`, a shard holding nothing yet.
  void move_pending(shard_file& next)
  {
    s_.flush();
    f_.copy_to(next.f_, data_start_ + committed_, next.data_start_, pending_);
    next.s_.reposition(pending_);
    s_.seek(committed_);
    for (std::size_t i = committed_tensors_; i < tensors_.size(); ++i) {
      tensor_record t = std::move(tensors_[i]);
      records_ -= record_bytes(t);
      t.begin -= committed_;
      t.end -= committed_;
      next.records_ += record_bytes(t);
      next.tensors_.push_back(std::move(t));
    }
    next.pending_ = pending_;
    end_copied_piece();  // after the flush every piece's CRC is in: one value, held by `next`
    next.pieces_ = {{&next.crcs_.emplace_back(joined(pieces_)), pending_}};
    tensors_.resize(committed_tensors_);
    pending_ = 0;
    pieces_.clear();
  }

  /// seal() then finish(): the shard published on the calling thread.
  std::uint64_t publish(const std::string& metadata, bool durable, std::uint64_t& relocations)
  {
    seal();
    return finish(metadata, durable, relocations);
  }

  /// The committed forwards are the shard (the open one, if any, is dropped), and its last bytes are on their way
  /// to the file; nothing is appended after it. The writer's part of publishing: it then hands the shard to the
  /// thread that finishes it (shard_writer's finisher) and fills the next one meanwhile.
  void seal()
  {
    rollback();
    s_.seal();
  }

  /// After seal(), on any one thread: waits for the shard's own writes, then writes the header
  /// `{"__metadata__":<metadata>, <tensors>}`, truncates, syncs (`durable`), renames and syncs the directory
  /// (`durable`). Adds 1 to `relocations` when the data had to move (reservation too small, or more than
  /// max(64 KiB, data / 8) of padding). Returns the data bytes.
  std::uint64_t finish(const std::string& metadata, bool durable, std::uint64_t& relocations)
  {
    s_.flush();
    s_.release();
    d_ = file{};
    std::string h = "{\"__metadata__\":" + metadata;
    for (const auto& t : tensors_) { append_record(h, t); }
    h += '}';
    const std::uint64_t need = ferry::detail::align_up(8 + h.size(), 8);
    const std::uint64_t slack = data_start_ >= need ? data_start_ - need : 0;
    if (need > data_start_ || slack > std::max<std::uint64_t>(std::uint64_t{64} << 10, committed_ / 8)) {
      relocate(need);
      ++relocations;
    }
    h.resize(data_start_ - 8, ' ');
    std::array<unsigned char, 8> len{};
    for (std::size_t i = 0; i < 8; ++i) { len[i] = static_cast<unsigned char>(h.size() >> (8 * i)); }
    f_.write_at(len.data(), len.size(), 0);
    f_.write_at(h.data(), h.size(), 8);
    f_.truncate(data_start_ + committed_);
    if (durable) { f_.sync(); }
    f_.close();
    rename_file(tmp_, dir_ / name_);
    published_ = true;
    if (durable) { sync_dir(dir_); }
    return committed_;
  }

 private:
  /// Copies the committed data to a new temporary file whose data starts at `start`, which replaces the old one.
  void relocate(std::uint64_t start)
  {
    const fs::path moved = dir_ / ("." + name_ + ".moved.tmp");
    try {
      file g = file::create(moved);
      f_.copy_to(g, data_start_, start, committed_);
      rename_file(moved, tmp_);  // g's descriptor stays valid; the old file is unlinked by the rename
      g.renamed(tmp_);
      f_ = std::move(g);
      data_start_ = start;
    } catch (...) {
      remove_quietly(moved);
      throw;
    }
  }

  /// The bytes copied since the last lent entry become a piece of the open forward (none: nothing copied).
  void end_copied_piece()
  {
    if (copied_ == 0) { return; }
    pieces_.push_back({&crcs_.emplace_back(crc_), copied_});
    crc_ = 0;
    copied_ = 0;
  }
  [[nodiscard]] static std::uint32_t joined(const std::vector<crc_piece>& pieces) noexcept
  {
    std::uint32_t c = 0;
    for (const auto& p : pieces) { c = crc32_combine(c, *p.crc, p.bytes); }
    return c;
  }

  fs::path dir_;
  std::uint64_t number_;
  std::string name_;
  fs::path tmp_;
  std::uint64_t data_start_;
  file f_;
  file d_;  ///< the O_DIRECT descriptor of the temporary (not open: buffered writes only)
  data_stream s_;
  std::vector<tensor_record> tensors_;
  std::vector<forward_record> forwards_;
  std::uint64_t committed_tensors_{0};
  std::uint64_t committed_{0};
  std::uint64_t pending_{0};
  std::uint64_t records_{0};
  std::uint32_t crc_{0};      ///< over the bytes copied since the open forward's last lent entry
  std::uint64_t copied_{0};   ///< those bytes
  std::vector<crc_piece> pieces_;   ///< the open forward's pieces so far
  std::deque<std::uint32_t> crcs_;  ///< the pieces' CRCs (lent entries': filled by I/O threads until drained)
  bool published_{false};
};

}  // namespace ferry::sink::detail
