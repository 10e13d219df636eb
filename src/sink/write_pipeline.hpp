// SPDX-License-Identifier: Apache-2.0
// The safetensors sink's write path off its writer thread: a fixed set of page-aligned buffers and I/O threads
// that write full buffers to their files (taken in the order given; `threads` writes in flight at once, which a
// disk queue serves faster than one; but one at a time to each file whose writes are memory copies under its inode's
// lock, tmpfs's: file::serial_writes; two such files take two at once), so the writer copies the next entries (and
// their CRC-32) while the disk takes
// the last ones. A write goes through the O_DIRECT descriptor of its file where
// there is one (the disk at its sequential rate, the page cache neither filled nor flushed), else the buffered
// one; a filesystem that opens O_DIRECT but refuses its first write (EINVAL) gets buffered writes from then on.
// The first error of a write (ENOSPC, EIO) is kept and thrown by the writer's next take(), write() or drain():
// the run ends there, as a failed synchronous write would end it. Each write counts against its file's `writes`
// (one per data_stream), so that drain(w) waits for that file's writes only: a shard is finished (header, sync,
// rename) on another thread while the writer fills the next one. Memory: chunks x chunk_bytes, allocated on
// first use. A lent write (write_lent) goes from the caller's memory, kept alive by its owner until the write ended
// (or was dropped after an error): the owner is released on the I/O thread, without the pipeline's lock; at most
// `chunks` lent writes are in flight. A lent write may ask for its bytes' CRC-32: a job of its own, which any I/O
// thread takes (a serial file's write running or not), so the writer thread neither copies nor reads lent bytes.
#pragma once

#include <ferry/detail/align.hpp>
#include <ferry/error.hpp>
#include "crc32.hpp"
#include "posix_file.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>
#include <vector>

namespace ferry::sink::detail {

/// Where a pipeline's writer spends its time (safetensors_stats::writer_copy_seconds, writer_wait_seconds,
/// writer_idle_seconds, writer_publish_seconds): copying entries into buffers with their CRC-32, waiting for a buffer
/// the I/O threads have not given back (the medium is the limit), waiting for an entry (the writer keeps up), and
/// rolling a shard over (its last writes waited for, a forward moved on, its header, sync and rename).
struct pipeline_counters {
  std::atomic<std::uint64_t> copy_ns{0};
  std::atomic<std::uint64_t> wait_ns{0};
  std::atomic<std::uint64_t> idle_ns{0};
  std::atomic<std::uint64_t> publish_ns{0};
  /// One of them in seconds (the stats' *_seconds).
  [[nodiscard]] static double seconds(const std::atomic<std::uint64_t>& ns) noexcept
  {
    return static_cast<double>(ns.load(std::memory_order_relaxed)) * 1e-9;
  }
};

class write_pipeline {
 public:
  /// The writes of one file queued or running (guarded by the pipeline's lock): what drain(w) waits for.
  struct writes {
    std::size_t outstanding{0};
    bool failed{false};  ///< one of them failed, or was dropped after another file's failure
    std::size_t running{0};       ///< on an I/O thread now
    std::size_t peak_running{0};  ///< the most at once so far
  };

  /// The alignment of buffers, of direct writes' offsets and of their lengths (a multiple of every logical
  /// block size in use: 512 and 4096).
  static constexpr std::size_t align = 4096;

  /// The one rule of a pipeline's shape (safetensors_tuning, write_tuning): `threads` in [1, 64], `chunks` in
  /// (threads, 256] and `chunk_bytes` in [4 KiB, 1 GiB]; logic_error naming `who` otherwise.
  static void check_shape(std::string_view who, std::size_t threads, std::size_t chunks, std::size_t chunk_bytes)
  {
    FERRY_EXPECTS(threads >= 1 && threads <= 64 && chunks > threads && chunks <= 256 && chunk_bytes >= align &&
                      chunk_bytes <= (std::size_t{1} << 30),
                  ferry::logic_error,
                  "{}: expected tuning io_threads in [1, 64], write_buffers in (io_threads, 256] and write_bytes in "
                  "[4 KiB, 1 GiB], got {}, {} and {}", who, threads, chunks, chunk_bytes);
  }

  explicit write_pipeline(std::size_t chunk_bytes = std::size_t{16} << 20, std::size_t chunks = 6,
                          std::size_t threads = 2, pipeline_counters* counters = nullptr)
      : chunk_{static_cast<std::size_t>(ferry::detail::align_up(chunk_bytes, align))}, bufs_(chunks < 2 ? 2 : chunks),
        counters_{counters != nullptr ? counters : &own_}
  {
    for (std::size_t i = 0; i < (threads < 1 ? 1 : threads); ++i) { threads_.emplace_back([this] { run(); }); }
  }
  write_pipeline(const write_pipeline&) = delete;
  write_pipeline& operator=(const write_pipeline&) = delete;
  /// Lets the writes in flight end (their errors are dropped: the writer saw the run end or ended it), then
  /// stops the I/O threads.
  ~write_pipeline()
  {
    {
      std::unique_lock lk{mu_};
      idle_.wait(lk, [&] { return q_.empty() && busy_ == 0; });
      stop_ = true;
    }
    work_.notify_all();
    for (auto& t : threads_) { t.join(); }
  }

  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return chunk_; }
  [[nodiscard]] std::size_t chunks() const noexcept { return bufs_.size(); }
  /// The most writes to serial files (tmpfs) that ran at once so far, over all of them (at most one a file).
  [[nodiscard]] std::size_t peak_serial_running()
  {
    const std::lock_guard lk{mu_};
    return serial_peak_;
  }
  [[nodiscard]] pipeline_counters& counters() noexcept { return *counters_; }

  /// A buffer of chunk_bytes() that no write uses (waits for one). Throws the kept error.
  [[nodiscard]] std::byte* take()
  {
    std::unique_lock lk{mu_};
    for (;;) {
      if (error_) { std::rethrow_exception(error_); }
      for (auto& b : bufs_) {
        if (!b.taken) {
          if (!b.mem) { b.mem.reset(static_cast<std::byte*>(::operator new(chunk_, std::align_val_t{align}))); }
          b.taken = true;
          return b.mem.get();
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      idle_.wait(lk);
      count_wait(t0);
    }
  }
  /// Returns a buffer from take() unwritten.
  void give_back(std::byte* p) noexcept
  {
    {
      std::lock_guard lk{mu_};
      slot(p).taken = false;
    }
    idle_.notify_all();
  }

  /// Queues the write of `n` bytes of buffer `p` (from take(); free again once written) at `off` of `direct`
  /// (an O_DIRECT descriptor: `p`, `n` and `off` aligned) or, where `direct` is not open, of `buffered`. Both
  /// stay open until drain() returns. Throws the kept error.
  /// The write counts against `w` until it ended (or was dropped after an error).
  void write(std::byte* p, std::size_t n, const file& direct, const file& buffered, std::uint64_t off, writes& w)
  {
    {
      std::lock_guard lk{mu_};
      if (error_) { std::rethrow_exception(error_); }
      q_.push_back(job{p, n, &direct, &buffered, off, &w});
      ++w.outstanding;
    }
    work_.notify_one();
  }
  /// Queues the write of `n` bytes at `p`, memory the caller lends until the write ended: `owner` keeps it alive
  /// and is released then (on an I/O thread, without the pipeline's lock), or when the write is dropped after an
  /// error. Buffered files only (`buffered`; any offset and length). Waits while `chunks` lent writes are in
  /// flight. Throws the kept error (the owner is then released by the caller's scope). `crc` (may be null): where
  /// an I/O thread stores crc32(p, n), before `w`'s writes are drained (a job of its own, counted in `w`).
  void write_lent(const std::byte* p, std::size_t n, const file& buffered, std::uint64_t off, writes& w,
                  std::shared_ptr<void> owner, std::uint32_t* crc = nullptr)
  {
    {
      std::unique_lock lk{mu_};
      if (lent_ >= bufs_.size()) {
        const auto t0 = std::chrono::steady_clock::now();
        idle_.wait(lk, [&] { return error_ || lent_ < bufs_.size(); });
        count_wait(t0);
      }
      if (error_) { std::rethrow_exception(error_); }
      if (crc != nullptr) {  // first: a free thread reads the bytes while another writes the file's last ones
        q_.push_back(job{const_cast<std::byte*>(p), n, &buffered, &buffered, off, &w, owner, true, crc});
        ++w.outstanding;
      }
      q_.push_back(job{const_cast<std::byte*>(p), n, &buffered, &buffered, off, &w, std::move(owner), true});
      ++w.outstanding;
      ++lent_;
    }
    if (crc != nullptr) { work_.notify_all(); } else { work_.notify_one(); }
  }
  /// The same write, now, on the calling thread (the caller holds `p`). Its error is thrown and kept, as an I/O
  /// thread's is: the run ends there for every file of the pipeline (a file's tail written at its close fails as
  /// its full buffers would).
  void write_now(const std::byte* p, std::size_t n, const file& direct, const file& buffered, std::uint64_t off)
  {
    try {
      put(job{const_cast<std::byte*>(p), n, &direct, &buffered, off, nullptr});
    } catch (...) {
      {
        std::lock_guard lk{mu_};
        if (!error_) { error_ = std::current_exception(); }
      }
      idle_.notify_all();
      throw;
    }
  }

  /// Waits until none of `w`'s writes is queued or running (another file's may be). Throws the kept error if
  /// one of them did not reach the file; a file whose writes all did is complete whatever failed after them.
  void drain(const writes& w)
  {
    std::unique_lock lk{mu_};
    idle_.wait(lk, [&] { return w.outstanding == 0; });
    if (w.failed) { std::rethrow_exception(error_); }
  }
  /// drain(w) that never throws (a shard given up).
  void drain_quietly(const writes& w) noexcept
  {
    std::unique_lock lk{mu_};
    idle_.wait(lk, [&] { return w.outstanding == 0; });
  }

 private:
  struct buffer {
    struct free_aligned {
      void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{align}); }
    };
    std::unique_ptr<std::byte, free_aligned> mem;
    bool taken{false};
  };
  struct job {
    std::byte* p;
    std::size_t n;
    const file* direct;
    const file* buffered;
    std::uint64_t off;
    writes* w;  ///< null: write_now's, not counted
    std::shared_ptr<void> owner{};  ///< a lent write's (write_lent) memory
    bool lent{false};               ///< write_lent's: `p` is not one of the buffers
    std::uint32_t* crc{nullptr};    ///< not null: not a write but crc32(p, n) stored there (write_lent's)
  };

  /// The writer's wait since `t0` (for a buffer, or for room for a lent write): writer_wait_seconds.
  void count_wait(std::chrono::steady_clock::time_point t0) noexcept
  {
    counters_->wait_ns.fetch_add(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - t0).count()),
                                 std::memory_order_relaxed);
  }

  buffer& slot(const std::byte* p)
  {
    for (auto& b : bufs_) {
      if (b.mem.get() == p) { return b; }
    }
    std::abort();  // not one of ours: a bug in the caller, and the bytes would go nowhere
  }

  /// One write, through the direct descriptor unless there is none or it was refused.
  void put(const job& j)
  {
    if (j.direct != j.buffered && j.direct->is_open() && !direct_refused_.load(std::memory_order_relaxed)) {
      try {
        j.direct->write_at(j.p, j.n, j.off);
        return;
      } catch (const io_error& e) {
        if (e.code() != EINVAL) { throw; }
        direct_refused_.store(true, std::memory_order_relaxed);  // O_DIRECT opened but not served here
      }
    }
    j.buffered->write_at(j.p, j.n, j.off);
  }

  /// Whether `j` goes to a file whose writes are serial (file::serial_writes: tmpfs) through its buffered descriptor.
  [[nodiscard]] bool serial(const job& j) const noexcept
  {
    const bool direct =
      j.direct != j.buffered && j.direct->is_open() && !direct_refused_.load(std::memory_order_relaxed);
    return !direct && j.buffered->serial_writes();
  }
  /// The first queued job an I/O thread may take: any, but a serial file's write while a write of that file runs.
  [[nodiscard]] std::deque<job>::iterator runnable()
  {
    return std::find_if(q_.begin(), q_.end(),
                        [&](const job& j) { return j.crc != nullptr || j.w->running == 0 || !serial(j); });
  }

  void run()
  {
    std::unique_lock lk{mu_};
    for (;;) {
      auto next = q_.end();
      work_.wait(lk, [&] {
        next = runnable();
        return stop_ || next != q_.end();
      });
      if (next == q_.end()) { return; }  // stop_: the destructor waited for an empty queue
      job j = std::move(*next);
      q_.erase(next);
      const bool is_write = j.crc == nullptr;
      const bool serial_write = is_write && serial(j);
      serial_running_ += serial_write ? 1 : 0;
      serial_peak_ = std::max(serial_peak_, serial_running_);
      ++busy_;
      j.w->running += is_write ? 1 : 0;
      j.w->peak_running = std::max(j.w->peak_running, j.w->running);
      lk.unlock();
      std::exception_ptr e;
      try {
        if (is_write) {
          put(j);
        } else {
          *j.crc = crc32(j.p, j.n);
        }
      } catch (...) {
        e = std::current_exception();
      }
      const bool lent_write = j.lent && is_write;
      const bool own_buffer = !j.lent;
      j.owner.reset();  // the lent memory goes back: written, or failed
      std::vector<std::shared_ptr<void>> dropped;  // the owners of lent writes dropped after an error
      lk.lock();
      serial_running_ -= serial_write ? 1 : 0;
      --busy_;
      j.w->running -= is_write ? 1 : 0;
      --j.w->outstanding;
      if (e) {
        j.w->failed = true;
        if (!error_) { error_ = e; }
      }
      if (error_) {  // the run ends: what is queued after a failed write is not written
        for (job& d : q_) {
          --d.w->outstanding;
          d.w->failed = true;
          if (d.lent) {
            lent_ -= d.crc == nullptr ? 1 : 0;
            dropped.push_back(std::move(d.owner));
          }
        }
        q_.clear();
      }
      if (lent_write) { --lent_; }
      if (own_buffer) { slot(j.p).taken = false; }
      idle_.notify_all();
      if (!q_.empty()) { work_.notify_all(); }  // a serial file's next write may run now
      if (!dropped.empty()) {
        lk.unlock();
        dropped.clear();
        lk.lock();
      }
    }
  }

  std::size_t chunk_;
  std::vector<buffer> bufs_;
  pipeline_counters own_;
  pipeline_counters* counters_;
  std::mutex mu_;
  std::condition_variable work_;  // the I/O thread: a job or stop
  std::condition_variable idle_;  // the writer: a buffer free, the queue empty, or an error
  std::deque<job> q_;
  std::size_t busy_{0};  // writes running
  std::size_t serial_running_{0};  // of them, to serial files (at most one a file)
  std::size_t serial_peak_{0};
  std::size_t lent_{0};  // lent writes queued or running
  bool stop_{false};
  std::exception_ptr error_;
  std::atomic<bool> direct_refused_{false};
  std::vector<std::thread> threads_;
};

}  // namespace ferry::sink::detail
