// SPDX-License-Identifier: Apache-2.0
// The disk's sequential write bandwidth, measured in the run beside the sink on the same filesystem: what
// `dd if=<random> of=<dir>/file bs=16M oflag=direct conv=fsync` measures, run on `files` files at once (as many
// as the sink writes at once: a tmpfs file takes one writer at a time, files scale). Each: 16 MiB writes with O_DIRECT
// (no page cache) from a 4 KiB-aligned buffer of random non-zero words (the first word of every 4 KiB changed
// at each write, so no two blocks are alike), then fsync; the time from the open to the fsync's return. A
// filesystem that refuses O_DIRECT (tmpfs) gets buffered writes and the fsync, and the method says so.
#include "sinks.hpp"

#include <ferry/testing/pattern.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace ferry::bench::sinks {

std::uint64_t free_bytes(const fs::path& dir)
{
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0) { return 0; }
  return static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
}

namespace {

/// One stream: `bytes` (whole 16 MiB blocks) into `file`, then fsync; an error text (empty: none).
std::string one_stream(const fs::path& file, std::uint64_t bytes, std::uint64_t seed, std::string& method)
{
  constexpr std::uint64_t block = 16 * MiB;
  void* mem = std::aligned_alloc(4096, block);
  if (mem == nullptr) { return "no memory for the 16 MiB buffer"; }
  auto* w = static_cast<std::uint64_t*>(mem);
  for (std::uint64_t i = 0; i < block / 8; ++i) { w[i] = ferry::testing::pattern_word(0xD15C + seed, i); }
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  method = "O_DIRECT, 16 MiB writes, then fsync (dd oflag=direct conv=fsync)";
  if (fd < 0 && errno == EINVAL) {
    fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    method = "buffered 16 MiB writes, then fsync (the filesystem refused O_DIRECT)";
  }
  if (fd < 0) {
    std::free(mem);
    return "open " + file.string() + ": " + std::strerror(errno);
  }
  std::string error;
  for (std::uint64_t done = 0; done < bytes && error.empty();) {
    for (std::uint64_t k = 0; k < block / 4096; ++k) { w[k * 512] = ferry::testing::pattern_word(done / block, k); }
    std::uint64_t put = 0;
    while (put < block) {
      const ssize_t n = ::write(fd, static_cast<const char*>(mem) + put, block - put);
      if (n < 0 && errno == EINTR) { continue; }
      if (n <= 0) {
        error = "write " + file.string() + " at " + std::to_string(done + put) + ": " + std::strerror(n < 0 ? errno : EIO);
        break;
      }
      put += static_cast<std::uint64_t>(n);
    }
    done += put;
  }
  if (error.empty() && ::fsync(fd) != 0) { error = "fsync " + file.string() + ": " + std::strerror(errno); }
  ::close(fd);
  std::free(mem);
  return error;
}

}  // namespace

disk_result disk_write(const fs::path& dir, std::uint64_t bytes, std::size_t files)
{
  constexpr std::uint64_t block = 16 * MiB;
  files = std::max<std::size_t>(files, 1);
  disk_result r;
  r.files = files;
  const std::uint64_t each = (bytes / files + block - 1) / block * block;
  r.bytes = each * files;
  std::vector<std::string> errors(files), methods(files);
  std::vector<std::thread> streams;
  const auto t0 = clk::now();
  for (std::size_t k = 0; k < files; ++k) {
    streams.emplace_back([&, k] {
      errors[k] = one_stream(dir / ("ferry-bench-disk-" + std::to_string(k) + ".tmp"), each, k, methods[k]);
    });
  }
  for (auto& t : streams) { t.join(); }
  r.seconds = std::chrono::duration<double>(clk::now() - t0).count();
  for (std::size_t k = 0; k < files; ++k) {
    std::error_code ec;
    fs::remove(dir / ("ferry-bench-disk-" + std::to_string(k) + ".tmp"), ec);
    if (r.error.empty()) { r.error = errors[k]; }
  }
  r.method = methods[0] + (files > 1 ? " on " + std::to_string(files) + " files at once (one thread each)" : "");
  if (r.error.empty()) { r.gbps = static_cast<double>(r.bytes) / r.seconds / 1e9; }
  return r;
}

}  // namespace ferry::bench::sinks
