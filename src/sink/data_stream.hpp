// SPDX-License-Identifier: Apache-2.0
// The data section of a shard being written (shard_file): bytes appended at a position that moves forward, or
// back to an earlier point (a forward rolled back), each byte taken into the CRC-32 as it is copied (unless the
// caller keeps none: sequential_file's formats carry their own checks). With a
// write_pipeline the bytes are copied into the pipeline's buffer and a full buffer goes to its I/O threads (O_DIRECT
// where the file has such a descriptor: `base` and every write then aligned); without one each append is a
// pwrite on the calling thread. Where the file takes unaligned writes (no O_DIRECT descriptor: lends()) a large
// piece may be lent instead (append_lent): the pipeline writes it from the caller's memory, which its owner keeps
// alive until then, and no copy is made. flush() puts every byte before the position into the file and waits for it;
// the file's bytes are read back only after it (a move, a relocation) or by reposition().
#pragma once

#include "crc32.hpp"
#include "write_pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace ferry::sink::detail {

class data_stream {
 public:
  /// Data byte 0 is at `base` of the file (`direct`: its O_DIRECT descriptor, or one not open; `buffered`: the
  /// descriptor for everything else). `p` null: synchronous pwrite per append.
  data_stream(const file& buffered, const file& direct, std::uint64_t base, write_pipeline* p)
    : f_{buffered}, d_{direct}, base_{base}, p_{p}
  {
  }
  data_stream(const data_stream&) = delete;
  data_stream& operator=(const data_stream&) = delete;
  ~data_stream() { release(); }

  [[nodiscard]] std::uint64_t position() const noexcept { return off_ + fill_; }

  /// Appends `n` bytes; `crc` continues over them.
  void append(const std::byte* src, std::size_t n, std::uint32_t& crc) { append_impl(src, n, &crc); }
  /// Appends `n` bytes without a CRC (a format that keeps its own checks: sequential_file).
  void append(const std::byte* src, std::size_t n) { append_impl(src, n, nullptr); }

  /// Whether append_lent() may be used: a pipeline, and no O_DIRECT descriptor (lent memory is neither aligned nor
  /// a whole number of blocks).
  [[nodiscard]] bool lends() const noexcept { return p_ != nullptr && !d_.is_open(); }

  /// Appends `n` bytes at `src` without copying them (lends()): the bytes in the buffer before them go first, as a
  /// write of their own, then `src` is lent to the pipeline until written (`owner` keeps it alive). `crc` (may be
  /// null) receives crc32(src, n) from an I/O thread before flush() returns: the writer thread does not read them.
  void append_lent(const std::byte* src, std::size_t n, std::uint32_t* crc, std::shared_ptr<void> owner)
  {
    if (buf_ != nullptr && fill_ != 0) {
      p_->write(std::exchange(buf_, nullptr), fill_, d_, f_, base_ + off_, w_);
      off_ += fill_;
      fill_ = 0;
    }
    p_->write_lent(src, n, f_, base_ + off_, w_, std::move(owner), crc);
    off_ += n;
  }

  /// Moves the position back to `pos` (<= position()): later appends overwrite from there.
  void seek(std::uint64_t pos)
  {
    if (pos >= off_) {
      fill_ = static_cast<std::size_t>(pos - off_);
      return;
    }
    reposition(pos);
  }

 private:
  void append_impl(const std::byte* src, std::size_t n, std::uint32_t* crc)
  {
    if (p_ == nullptr) {
      f_.write_at(src, n, base_ + off_);
      if (crc != nullptr) { *crc = crc32(src, n, *crc); }
      off_ += n;
      return;
    }
    constexpr std::size_t piece = std::size_t{64} << 10;  // copied, then its CRC-32 while in the cache
    pipeline_counters& ct = p_->counters();
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t waited = ct.wait_ns.load(std::memory_order_relaxed);  // take()'s waits are not copying
    while (n > 0) {
      if (buf_ == nullptr) { buf_ = p_->take(); }
      const std::size_t k = std::min({n, p_->chunk_bytes() - fill_, piece});
      std::memcpy(buf_ + fill_, src, k);
      if (crc != nullptr) { *crc = crc32(buf_ + fill_, k, *crc); }
      fill_ += k;
      src += k;
      n -= k;
      if (fill_ == p_->chunk_bytes()) {
        std::byte* full = std::exchange(buf_, nullptr);
        p_->write(full, fill_, d_, f_, base_ + off_, w_);
        off_ += fill_;
        fill_ = 0;
      }
    }
    const auto spent = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    ct.copy_ns.fetch_add(spent - std::min(spent, ct.wait_ns.load(std::memory_order_relaxed) - waited),
                         std::memory_order_relaxed);
  }

 public:

  /// The position becomes `pos`, whose bytes before it are already in the file (written before a drain, or
  /// copied there): the partial block before `pos` is read back so that aligned writes rewrite it whole.
  void reposition(std::uint64_t pos)
  {
    if (p_ == nullptr) {
      off_ = pos;
      return;
    }
    p_->drain(w_);
    if (buf_ == nullptr) { buf_ = p_->take(); }
    off_ = pos / write_pipeline::align * write_pipeline::align;
    fill_ = static_cast<std::size_t>(pos - off_);
    if (fill_ != 0) { f_.read_at(buf_, fill_, base_ + off_); }
  }

  /// Sends every byte before position() on its way without waiting (no append follows: the shard is handed to
  /// the thread that finishes it, whose flush() then waits): the aligned part of the buffer as a pipeline write,
  /// the last partial block kept for flush().
  void seal()
  {
    if (p_ == nullptr || buf_ == nullptr) { return; }
    const std::size_t whole = fill_ / write_pipeline::align * write_pipeline::align;
    tail_.assign(buf_ + whole, buf_ + fill_);
    tail_at_ = off_ + whole;
    std::byte* b = std::exchange(buf_, nullptr);
    const std::uint64_t at = base_ + off_;
    off_ = tail_at_;
    fill_ = 0;  // position() is tail_at_ until flush() wrote the tail
    if (whole == 0) {
      p_->give_back(b);
    } else {
      p_->write(b, whole, d_, f_, at, w_);
    }
  }

  /// Every byte before position() is in the file (the aligned part through the direct descriptor, the last
  /// partial block through the buffered one), and no write is in flight.
  void flush()
  {
    if (p_ == nullptr) { return; }
    p_->drain(w_);
    if (!tail_.empty()) {  // seal()'s partial block
      f_.write_at(tail_.data(), tail_.size(), base_ + tail_at_);
      off_ = tail_at_ + tail_.size();
      tail_.clear();
    }
    if (fill_ == 0) { return; }
    const std::size_t whole = fill_ / write_pipeline::align * write_pipeline::align;
    if (whole != 0) { p_->write_now(buf_, whole, d_, f_, base_ + off_); }
    if (fill_ > whole) { f_.write_at(buf_ + whole, fill_ - whole, base_ + off_ + whole); }
    std::memmove(buf_, buf_ + whole, fill_ - whole);  // the partial block stays: the next aligned write redoes it
    off_ += whole;
    fill_ -= whole;
  }

  /// Waits until no write (nor a lent piece's CRC) is queued or running: append_lent's CRCs are stored. Throws the
  /// kept error of a failed write.
  void drain()
  {
    if (p_ != nullptr) { p_->drain(w_); }
  }

  /// Waits for the writes in flight, without throwing, and gives the buffer back (a shard published or given up).
  void release() noexcept
  {
    if (p_ == nullptr) { return; }
    p_->drain_quietly(w_);
    if (buf_ != nullptr) { p_->give_back(std::exchange(buf_, nullptr)); }
  }

 private:
  const file& f_;
  const file& d_;
  std::uint64_t base_;
  write_pipeline* p_;
  std::byte* buf_{nullptr};
  std::uint64_t off_{0};   ///< data position of buf_[0] (aligned with a pipeline, unless a lent append moved it)
  std::size_t fill_{0};    ///< bytes of buf_ in use
  write_pipeline::writes w_;  ///< this file's writes in the pipeline
  std::vector<std::byte> tail_;  ///< seal()'s partial block, written by flush() at tail_at_
  std::uint64_t tail_at_{0};
};

}  // namespace ferry::sink::detail
