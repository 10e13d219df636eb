// SPDX-License-Identifier: Apache-2.0
// sink::sequential_file (sink/sequential_file.hpp): one data_stream over a file of its own write_pipeline, as a
// shard's data section is written (shard_file.hpp), from offset 0.
#include <ferry/sink/sequential_file.hpp>

#include "data_stream.hpp"
#include "posix_file.hpp"
#include "write_pipeline.hpp"

#include <ferry/error.hpp>

#include <mutex>
#include <utility>

namespace ferry::sink {

namespace detail {

struct sequential_file_impl {
  sequential_file_impl(const fs::path& p, bool durable)
      : path{p}, durable{durable}, f{file::create(p)}, d{durable ? file::open_direct(p) : file{}}, s{f, d, 0, &pipe}
  {
  }
  // Destroyed in reverse: the stream's writes end (release) before the pipeline stops, both before the files close.
  fs::path path;
  bool durable;
  file f;
  file d;
  write_pipeline pipe;
  data_stream s;
  std::uint64_t size{0};
  bool closed{false};
  std::mutex mu;  // one write or close at a time (the Python binding releases the GIL around them)
};

}  // namespace detail

sequential_file::sequential_file(const std::filesystem::path& path, bool durable)
    : impl_{std::make_unique<detail::sequential_file_impl>(path, durable)}
{
}
sequential_file::~sequential_file() = default;
sequential_file::sequential_file(sequential_file&&) noexcept = default;
sequential_file& sequential_file::operator=(sequential_file&&) noexcept = default;

void sequential_file::write(std::span<const std::byte> bytes)
{
  auto& m = *impl_;
  std::lock_guard lk{m.mu};
  FERRY_EXPECTS(!m.closed, ferry::logic_error,
                "sequential_file {}: write of {} bytes expected an open file, got a closed one", m.path.string(),
                bytes.size());
  m.s.append(bytes.data(), bytes.size());  // no CRC: the format written keeps its own checks
  m.size += bytes.size();
}

void sequential_file::close()
{
  auto& m = *impl_;
  std::lock_guard lk{m.mu};
  if (m.closed) { return; }
  m.s.flush();
  m.s.release();
  m.d = detail::file{};
  if (m.durable) { m.f.sync(); }
  m.closed = true;
  m.f = detail::file{};
}

std::uint64_t sequential_file::size() const noexcept { return impl_->size; }
bool sequential_file::closed() const noexcept { return impl_->closed; }
const std::filesystem::path& sequential_file::path() const noexcept { return impl_->path; }
sequential_file_times sequential_file::times() const noexcept
{
  auto& ct = impl_->pipe.counters();
  return {static_cast<double>(ct.copy_ns.load(std::memory_order_relaxed)) * 1e-9,
          static_cast<double>(ct.wait_ns.load(std::memory_order_relaxed)) * 1e-9};
}

}  // namespace ferry::sink
