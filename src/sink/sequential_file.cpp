// SPDX-License-Identifier: Apache-2.0
// sink::sequential_file (sink/sequential_file.hpp): one data_stream over a file, through its file_writer's
// write_pipeline, as a shard's data section is written (shard_file.hpp), from offset 0; sink::file_writer: a shared
// write_pipeline (the safetensors sink's shards share one the same way).
#include <ferry/sink/sequential_file.hpp>

#include "data_stream.hpp"
#include "posix_file.hpp"
#include "write_pipeline.hpp"

#include <ferry/error.hpp>

#include <memory>
#include <mutex>
#include <utility>

namespace ferry::sink {

namespace detail {

/// A file_writer: the pipeline its files write through, and how many of them are open. Each open file may hold one
/// buffer it is filling; with at most chunks - 1 files open one buffer is always free or on its way back from an
/// I/O thread, so a take() never waits for a buffer that only another file's close would give back (a hang).
struct file_writer_state {
  explicit file_writer_state(const write_tuning& t) : pipe{checked(t).write_bytes, t.write_buffers, t.io_threads} {}
  static const write_tuning& checked(const write_tuning& t)
  {
    write_pipeline::check_shape("file_writer", t.io_threads, t.write_buffers, t.write_bytes);
    return t;
  }
  write_pipeline pipe;
  std::mutex mu;
  std::size_t open{0};
  [[nodiscard]] std::size_t max_open() const noexcept { return pipe.chunks() - 1; }
};

/// One open file of a writer, from before its file is created until it is closed or destroyed.
class open_slot {
 public:
  open_slot(file_writer_state& w, const fs::path& p) : w_{w}
  {
    std::lock_guard lk{w.mu};
    FERRY_EXPECTS(w.open < w.max_open(), ferry::logic_error,
                  "sequential_file {}: expected at most {} open files of one file_writer, got {} open (close one "
                  "first)", p.string(), w.max_open(), w.open);
    ++w.open;
  }
  open_slot(const open_slot&) = delete;
  open_slot& operator=(const open_slot&) = delete;
  ~open_slot() { end(); }
  void end() noexcept
  {
    if (ended_) { return; }
    ended_ = true;
    std::lock_guard lk{w_.mu};
    --w_.open;
  }

 private:
  file_writer_state& w_;
  bool ended_{false};
};

struct sequential_file_impl {
  sequential_file_impl(const fs::path& p, bool durable, std::shared_ptr<file_writer_state> writer)
      : w{std::move(writer)}, slot{*w, p}, path{p}, durable{durable}, f{file::create(p)},
        d{durable ? file::open_direct(p) : file{}}, s{f, d, 0, &w->pipe}
  {
  }
  // Destroyed in reverse: the stream's writes end (release: its own, not the other files') before the files close,
  // then the writer's slot is given back and the writer let go.
  std::shared_ptr<file_writer_state> w;
  open_slot slot;
  fs::path path;
  bool durable;
  file f;
  file d;
  data_stream s;
  std::uint64_t size{0};
  bool closed{false};
  std::mutex mu;  // one write or close at a time (the Python binding releases the GIL around them)
};

}  // namespace detail

namespace {
sequential_file_times times_of(detail::file_writer_state& w) noexcept
{
  auto& ct = w.pipe.counters();
  return {detail::pipeline_counters::seconds(ct.copy_ns), detail::pipeline_counters::seconds(ct.wait_ns)};
}
}  // namespace

file_writer::file_writer(const write_tuning& tuning) : w_{std::make_shared<detail::file_writer_state>(tuning)} {}
sequential_file_times file_writer::times() const noexcept { return times_of(*w_); }
std::size_t file_writer::max_open() const noexcept { return w_->max_open(); }

sequential_file::sequential_file(const std::filesystem::path& path, bool durable)
    : sequential_file(path, durable, file_writer{})
{
}
sequential_file::sequential_file(const std::filesystem::path& path, bool durable, const file_writer& writer)
    : impl_{std::make_unique<detail::sequential_file_impl>(path, durable, writer.w_)}
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
  m.slot.end();  // its writer may open another file
}

std::uint64_t sequential_file::size() const noexcept { return impl_->size; }
bool sequential_file::closed() const noexcept { return impl_->closed; }
const std::filesystem::path& sequential_file::path() const noexcept { return impl_->path; }
sequential_file_times sequential_file::times() const noexcept { return times_of(*impl_->w); }

}  // namespace ferry::sink
