// SPDX-License-Identifier: Apache-2.0
// The shared-memory stream's segment (shm_segment.hpp): creation, opening, the schema's publication, and the
// process checks (a producer's or reader's liveness, told from a recycled pid by its start time).
#include "shm_segment.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ferry::sink::detail::shm {

bool valid_name(const std::string& name) noexcept
{
  if (name.empty() || name.size() > 200 || name[0] == '.') { return false; }
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) { return false; }
  }
  return true;
}

std::uint64_t start_time(long pid, bool* zombie) noexcept
{
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  std::FILE* f = std::fopen(path, "re");
  if (f == nullptr) { return 0; }
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr) { return 0; }
  char state = '?';
  unsigned long long t = 0;
  // after ')': state (field 3), then fields 4..21 skipped, starttime (field 22)
  if (std::sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", &state,
                  &t) != 2) {
    return 0;
  }
  if (zombie != nullptr) { *zombie = state == 'Z' || state == 'X'; }
  return t;
}

bool alive(long pid, std::uint64_t started) noexcept
{
  if (pid <= 0) { return false; }
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) { return false; }
  bool zombie = false;
  const std::uint64_t t = start_time(pid, &zombie);
  if (zombie) { return false; }
  return started == 0 || t == 0 || t == started;
}

segment::~segment()
{
  if (staging_ != nullptr && staging_ != MAP_FAILED && staging_ != control_ + staging_offset_) {
    ::munmap(staging_, staging_bytes_);
  }
  if (control_ != nullptr) { ::munmap(control_, control_bytes_); }
  if (fd_ >= 0) { ::close(fd_); }
}

std::shared_ptr<segment> segment::create(const std::string& name, std::uint64_t capacity, std::uint64_t staging_bytes,
                                         std::uint64_t schema_capacity, std::span<const std::byte> schema,
                                         std::uint64_t record_capacity)
{
  std::shared_ptr<segment> s{new segment{name}};
  const std::string obj = object_name(name);
  for (int attempt = 0;; ++attempt) {
    s->fd_ = ::shm_open(obj.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (s->fd_ >= 0) { break; }
    const int e = errno;
    if (e != EEXIST || attempt == 2) {
      FERRY_FAIL_IO(io_error, "/dev/shm" + obj, e, "shm stream '{}': creating shared memory {}", name, obj);
    }
    replace_stale(name, obj);
  }
  const std::uint64_t desc_end = header_bytes + capacity * descriptor_bytes;
  s->schema_offset_ = align_page(desc_end);
  s->schema_capacity_ = align_page(std::max<std::uint64_t>(schema_capacity, schema.size()));
  s->record_offset_ = s->schema_offset_ + s->schema_capacity_;
  s->record_capacity_ = align_page(record_capacity);
  s->staging_offset_ = s->record_offset_ + s->record_capacity_;
  s->staging_bytes_ = staging_bytes;
  s->control_bytes_ = s->staging_offset_ + align_page(staging_bytes);
  if (const int e = ::posix_fallocate(s->fd_, 0, static_cast<off_t>(s->control_bytes_)); e != 0) {
    ::shm_unlink(obj.c_str());
    FERRY_FAIL_IO(io_error, "/dev/shm" + obj, e, "shm stream '{}': reserving {} bytes of shared memory (/dev/shm)",
                  name, s->control_bytes_);
  }
  void* p = ::mmap(nullptr, s->control_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::shm_unlink(obj.c_str());
    FERRY_FAIL_IO(io_error, "/dev/shm" + obj, e, "shm stream '{}': mapping {} bytes", name, s->control_bytes_);
  }
  s->control_ = static_cast<std::byte*>(p);
  s->staging_ = s->control_ + s->staging_offset_;
  s->capacity_ = capacity;
  s->owner_ = true;
  std::byte* h = s->control_;
  const std::uint64_t fixed[] = {0, layout_version, header_bytes, s->control_bytes_, header_bytes, capacity,
                                 s->staging_offset_, staging_bytes, generation(),
                                 static_cast<std::uint64_t>(::getpid()), start_time(::getpid()), descriptor_bytes,
                                 s->schema_offset_, s->schema_capacity_, s->record_offset_, s->record_capacity_};
  for (std::size_t i = 1; i < std::size(fixed); ++i) { store(h, i * 8, fixed[i], std::memory_order_relaxed); }
  store(h, w_state, state_open, std::memory_order_relaxed);
  if (!schema.empty()) {  // S0, a schema known at creation: its bytes and word before the magic
    std::memcpy(h + s->schema_offset_, schema.data(), schema.size());
    store(h, w_schema, schema.size(), std::memory_order_relaxed);
  }
  store(h, w_magic, magic);  // last, release: a reader that sees the magic sees every field above
  return s;
}

std::shared_ptr<segment> segment::open(const std::string& name, std::chrono::milliseconds timeout)
{
  FERRY_EXPECTS(valid_name(name), ferry::logic_error,
                "shm reader: expected a stream name of 1..200 characters [A-Za-z0-9._-], got '{}'", name);
  std::shared_ptr<segment> s{new segment{name}};
  const std::string obj = object_name(name);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  struct stat st {};
  for (;;) {
    if (s->fd_ < 0) { s->fd_ = ::shm_open(obj.c_str(), O_RDWR | O_CLOEXEC, 0); }
    if (s->fd_ >= 0 && ::fstat(s->fd_, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= header_bytes) {
      if (s->control_ == nullptr) {
        void* p = ::mmap(nullptr, header_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
        if (p != MAP_FAILED) {
          s->control_ = static_cast<std::byte*>(p);
          s->control_bytes_ = header_bytes;
        }
      }
      if (s->control_ != nullptr && load(s->control_, w_magic) == magic) { break; }
    } else if (s->fd_ < 0 && errno != ENOENT) {
      const int e = errno;
      FERRY_FAIL_IO(io_error, "/dev/shm" + obj, e, "shm reader: opening stream '{}' ({})", name, obj);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      FERRY_FAIL(ferry::timeout_error, "shm reader: expected stream '{}' ({}) within {} ms, got {}", name, obj,
                 timeout.count(), s->fd_ < 0 ? "no such stream" : "a segment not initialized");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::byte* h = s->control_;
  const std::uint64_t version = load(h, w_version);
  if (version != layout_version) {
    throw layout_version_error(
      ::ferry::detail::format("ferry: shm reader: stream '{}' expected layout version {} (this reader's), got version "
                              "{} (the producer's); use a ferry of the producer's version [{}:{}]",
                              name, layout_version, version, __FILE__, __LINE__),
      layout_version, version);
  }
  s->capacity_ = load(h, w_desc_capacity);
  s->schema_offset_ = load(h, w_schema_offset);
  s->schema_capacity_ = load(h, w_schema_capacity);
  s->record_offset_ = load(h, w_record_offset);
  s->record_capacity_ = load(h, w_record_capacity);
  s->staging_offset_ = load(h, w_staging_offset);
  s->staging_bytes_ = load(h, w_staging_bytes);
  const std::uint64_t total = load(h, w_total_bytes);
  FERRY_EXPECTS(load(h, w_descriptor_bytes) == descriptor_bytes && s->capacity_ != 0 &&
                    (s->capacity_ & (s->capacity_ - 1)) == 0 && s->capacity_ <= (std::uint64_t{1} << 40) &&
                    s->schema_offset_ % page == 0 &&
                    s->schema_offset_ >= header_bytes + s->capacity_ * descriptor_bytes &&
                    s->record_offset_ % page == 0 && s->record_offset_ >= s->schema_offset_ &&
                    s->schema_capacity_ <= s->record_offset_ - s->schema_offset_ && s->staging_offset_ % page == 0 &&
                    s->staging_offset_ >= s->record_offset_ && s->record_capacity_ >= page &&
                    s->record_capacity_ <= s->staging_offset_ - s->record_offset_ && total >= s->staging_offset_ &&
                    total - s->staging_offset_ >= s->staging_bytes_ && static_cast<std::uint64_t>(st.st_size) >= total,
                ferry::logic_error,
                "shm reader: stream '{}' expected a consistent header (descriptors of {} bytes, a power-of-two "
                "capacity, then the schema region, the record region, the staging, within the {} byte segment), got "
                "capacity {}, schema region at {} of {} bytes, record region at {} of {} bytes, staging at {} of {} "
                "bytes, total {}",
                name, descriptor_bytes, st.st_size, s->capacity_, s->schema_offset_, s->schema_capacity_,
                s->record_offset_, s->record_capacity_, s->staging_offset_, s->staging_bytes_, total);
  ::munmap(s->control_, header_bytes);
  s->control_ = nullptr;
  void* c = ::mmap(nullptr, s->staging_offset_, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
  void* d = c == MAP_FAILED ? MAP_FAILED
                            : ::mmap(nullptr, align_page(s->staging_bytes_), PROT_READ, MAP_SHARED, s->fd_,
                                     static_cast<off_t>(s->staging_offset_));
  if (c == MAP_FAILED || d == MAP_FAILED) {
    const int e = errno;
    if (c != MAP_FAILED) { ::munmap(c, s->staging_offset_); }
    FERRY_FAIL_IO(io_error, "/dev/shm" + obj, e, "shm reader: mapping stream '{}' ({} bytes)", name, total);
  }
  s->control_ = static_cast<std::byte*>(c);
  s->control_bytes_ = s->staging_offset_;
  s->staging_ = static_cast<std::byte*>(d);
  return s;
}

void segment::publish_schema(std::span<const std::byte> schema)
{
  FERRY_EXPECTS(owner_ && load(control_, w_schema, std::memory_order_relaxed) == 0 && schema.size() <= schema_capacity_,
                ferry::logic_error, "shm stream '{}': expected to write the schema region once, its {} bytes of "
                "schema (shm_stream_config::schema_bytes), got {} bytes{}", name_, schema_capacity_, schema.size(),
                load(control_, w_schema, std::memory_order_relaxed) != 0 ? " for a region written already" : "");
  std::memcpy(control_ + schema_offset_, schema.data(), schema.size());
  store(control_, w_schema, schema.size());  // release: the bytes above before the word
}

void segment::replace_stale(const std::string& name, const std::string& obj)
{
  const int fd = ::shm_open(obj.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd >= 0) {
    struct stat st {};
    void* p = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= header_bytes) {
      p = ::mmap(nullptr, header_bytes, PROT_READ, MAP_SHARED, fd, 0);
    }
    ::close(fd);
    if (p != MAP_FAILED) {
      auto* h = static_cast<std::byte*>(p);
      for (int i = 0; i < 100 && load(h, w_magic) != magic; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      const bool ours = load(h, w_magic) == magic;
      const long pid = ours ? static_cast<long>(load(h, w_producer_pid)) : 0;
      const bool live = ours && load(h, w_state) != state_closed && alive(pid, load(h, w_producer_start));
      ::munmap(p, header_bytes);
      if (live) {
        throw stream_busy_error(
          ::ferry::detail::format("ferry: shm stream '{}': expected a free name, got a stream of the live producer pid "
                                  "{} ({}) [{}:{}]", name, pid, obj, __FILE__, __LINE__), pid);
      }
    }
  }
  ::shm_unlink(obj.c_str());
}

std::uint64_t segment::generation()
{
  std::random_device rd;
  const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return ((std::uint64_t{rd()} << 32) ^ rd() ^ now) | 1;
}

}  // namespace ferry::sink::detail::shm
