// SPDX-License-Identifier: Apache-2.0
// The file operations of the sinks (POSIX): positioned writes and reads, truncation, fsync of a file and of
// its directory, rename, a range copy between files (copy_file_range, else read/write), and the reservation of a
// file's first bytes (fallocate). Every failure is an io_error naming the operation, the file and the errno.
#pragma once

#include <ferry/sink/errors.hpp>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/magic.h>  // TMPFS_MAGIC
#include <sys/vfs.h>      // fstatfs
#endif

namespace ferry::sink::detail {

namespace fs = std::filesystem;

/// An open file (move-only); closed by the destructor (errors ignored there: close() reports them).
class file {
 public:
  file() = default;
  /// Creates (or truncates) `p` for reading and writing.
  static file create(const fs::path& p)
  {
    file f;
    f.path_ = p;
    f.fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd_ < 0) {
      const int e = errno;
      FERRY_FAIL_IO(io_error, p, e, "sink: creating {}: expected a writable file", p.string());
    }
    f.serial_ = on_tmpfs(f.fd_);
    return f;
  }
  /// `p`, an existing file, opened again for writing with O_DIRECT (write_pipeline's aligned writes); a file
  /// that is not open where the filesystem or the platform has no O_DIRECT (EINVAL, EOPNOTSUPP), and on tmpfs, which
  /// takes O_DIRECT since Linux 6.6 but copies into its page cache either way: buffered there, a large entry is
  /// written from its staging (shard_file::append's lending) rather than copied into a write buffer first (the
  /// measurements: docs/perf/journal.md).
  static file open_direct(const fs::path& p)
  {
    file f;
#if defined(O_DIRECT)
    f.fd_ = ::open(p.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (f.fd_ < 0) {
      const int e = errno;
      if (e == EINVAL || e == EOPNOTSUPP) { return file{}; }
      FERRY_FAIL_IO(io_error, p, e, "sink: opening {} for direct writes: expected a writable file", p.string());
    }
    if (on_tmpfs(f.fd_)) { return file{}; }  // f's destructor closes it
    f.path_ = p;
#else
    (void)p;
#endif
    return f;
  }
  file(file&& o) noexcept
      : fd_{std::exchange(o.fd_, -1)}, path_{std::move(o.path_)}, serial_{std::exchange(o.serial_, false)}
  {
  }
  file& operator=(file&& o) noexcept
  {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
      path_ = std::move(o.path_);
      serial_ = std::exchange(o.serial_, false);
    }
    return *this;
  }
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() { reset(); }

  [[nodiscard]] bool is_open() const noexcept { return fd_ >= 0; }
  /// Whether its writes go best one at a time (create()'s file on tmpfs, where a write is a memory copy under the
  /// file's inode lock: write_pipeline keeps one write to such files in flight, over all of them; the sink's two
  /// files at once, at a shard's rollover, were never faster on the device, though files written at once all along
  /// scale: bench/device/probes/tmpfs_probe.py).
  [[nodiscard]] bool serial_writes() const noexcept { return serial_; }
  [[nodiscard]] const fs::path& path() const noexcept { return path_; }
  /// The file was renamed to `p` (the descriptor stays valid; messages name the new path).
  void renamed(fs::path p) { path_ = std::move(p); }

  /// Writes `n` bytes at `off` (all of them: short writes and EINTR are retried).
  void write_at(const void* p, std::uint64_t n, std::uint64_t off) const
  {
    const auto* b = static_cast<const char*>(p);
    std::uint64_t done = 0;
    while (done < n) {
      const ssize_t w = ::pwrite(fd_, b + done, static_cast<std::size_t>(n - done), static_cast<off_t>(off + done));
      if (w < 0 && errno == EINTR) { continue; }
      if (w <= 0) {
        const int e = w < 0 ? errno : EIO;
        FERRY_FAIL_IO(io_error, path_, e, "sink: writing {}: expected {} bytes written at offset {}, {} written",
                      path_.string(), n, off, done);
      }
      done += static_cast<std::uint64_t>(w);
    }
  }
  /// Reads `n` bytes at `off`; io_error (EIO) when the file ends first.
  void read_at(void* p, std::uint64_t n, std::uint64_t off) const
  {
    auto* b = static_cast<char*>(p);
    std::uint64_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, b + done, static_cast<std::size_t>(n - done), static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) { continue; }
      if (r <= 0) {
        const int e = r < 0 ? errno : EIO;
        FERRY_FAIL_IO(io_error, path_, e, "sink: reading {}: expected {} bytes at offset {}, read {}", path_.string(),
                      n, off, done);
      }
      done += static_cast<std::uint64_t>(r);
    }
  }
  void truncate(std::uint64_t n) const
  {
    if (::ftruncate(fd_, static_cast<off_t>(n)) != 0) {
      const int e = errno;
      FERRY_FAIL_IO(io_error, path_, e, "sink: truncating {} to {} bytes", path_.string(), n);
    }
  }
  /// Allocates the file's first `n` bytes on the medium now (fallocate), so that writes within them later do not
  /// need room the disk may no longer have. False where the filesystem refuses it (full, or no fallocate).
  [[nodiscard]] bool reserve(std::uint64_t n) const noexcept
  {
#if defined(__linux__)
    return ::fallocate(fd_, 0, 0, static_cast<off_t>(n)) == 0;
#else
    (void)n;
    return false;
#endif
  }
  void sync() const
  {
    if (::fsync(fd_) != 0) {
      const int e = errno;
      FERRY_FAIL_IO(io_error, path_, e, "sink: fsync of {}", path_.string());
    }
  }
  /// Copies `n` bytes at `off_in` of this file to `off_out` of `out`.
  void copy_to(const file& out, std::uint64_t off_in, std::uint64_t off_out, std::uint64_t n) const
  {
#if defined(__linux__)
    auto in_pos = static_cast<loff_t>(off_in);
    auto out_pos = static_cast<loff_t>(off_out);
    while (n > 0) {
      const ssize_t c = ::copy_file_range(fd_, &in_pos, out.fd_, &out_pos, static_cast<std::size_t>(n), 0);
      if (c < 0 && errno == EINTR) { continue; }
      if (c <= 0) { break; }  // unsupported here (EXDEV, ENOSYS, EINVAL) or a short file: the loop below says which
      n -= static_cast<std::uint64_t>(c);
    }
    off_in = static_cast<std::uint64_t>(in_pos);
    off_out = static_cast<std::uint64_t>(out_pos);
#endif
    std::vector<char> buf(static_cast<std::size_t>(n < (1U << 20) ? n : (1U << 20)));
    while (n > 0) {
      const std::uint64_t k = n < buf.size() ? n : buf.size();
      read_at(buf.data(), k, off_in);
      out.write_at(buf.data(), k, off_out);
      off_in += k;
      off_out += k;
      n -= k;
    }
  }
  /// Closes the file, reporting a deferred write error (NFS, quotas).
  void close()
  {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) {
      const int e = errno;
      FERRY_FAIL_IO(io_error, path_, e, "sink: closing {}", path_.string());
    }
  }

  /// Whether directory `dir` is on tmpfs, whose files take one write at a time (Linux; elsewhere false).
  [[nodiscard]] static bool dir_on_tmpfs([[maybe_unused]] const fs::path& dir) noexcept
  {
#if defined(__linux__)
    struct statfs st {};
    return ::statfs(dir.c_str(), &st) == 0 && st.f_type == TMPFS_MAGIC;
#else
    return false;
#endif
  }

 private:
  void reset() noexcept
  {
    if (fd_ >= 0) { (void)::close(fd_); }
    fd_ = -1;
  }
  /// Whether descriptor `fd` is of a file on tmpfs (Linux; elsewhere false).
  static bool on_tmpfs([[maybe_unused]] int fd) noexcept
  {
#if defined(__linux__)
    struct statfs st {};
    return ::fstatfs(fd, &st) == 0 && st.f_type == TMPFS_MAGIC;
#else
    return false;
#endif
  }

  int fd_{-1};
  fs::path path_;
  bool serial_{false};
};

/// fsync of directory `dir` (makes a rename in it durable).
inline void sync_dir(const fs::path& dir)
{
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int e = errno;
    if (fd >= 0) { (void)::close(fd); }
    FERRY_FAIL_IO(io_error, dir, e, "sink: fsync of directory {}", dir.string());
  }
  (void)::close(fd);
}

/// Renames `from` to `to` (atomically replacing `to`).
inline void rename_file(const fs::path& from, const fs::path& to)
{
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int e = errno;
    FERRY_FAIL_IO(io_error, to, e, "sink: renaming {} to {}", from.string(), to.string());
  }
}

/// Removes `p` if it exists; never throws (a cleanup on an error path).
inline void remove_quietly(const fs::path& p) noexcept { (void)::unlink(p.c_str()); }

}  // namespace ferry::sink::detail
