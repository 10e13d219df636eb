// SPDX-License-Identifier: Apache-2.0
// ferry::sink::shm_reader and shm_entry (sink/shm_reader.hpp): the handle's calls, forwarded to its
// detail::shm_reader_impl (shm_reader_impl.hpp), and the entry's calls that do more than return a field.
#include "shm_reader_impl.hpp"

namespace ferry::sink {

shm_entry::shm_entry(shm_entry&& o) noexcept { *this = std::move(o); }

shm_entry& shm_entry::operator=(shm_entry&& o) noexcept
{
  if (this != &o) {
    release();
    r_ = std::move(o.r_);
    schema_ = std::move(o.schema_);
    meta_ = std::move(o.meta_);
    overflow_stream_ = std::move(o.overflow_stream_);
    record_capacity_ = o.record_capacity_;
    d_ = o.d_;
    data_ = std::exchange(o.data_, nullptr);
  }
  return *this;
}

const std::shared_ptr<const d2h::forward_meta>& shm_entry::shared_meta() const
{
  if (d_.attribution == detail::shm::attribution_overflow) {
    throw attribution_overflow_error(
        ferry::detail::format("ferry: shm reader: stream '{}': entry {} (hook {}, seq {}, forward {}): expected its "
                              "forward's attribution in the stream's record region, got a record of {} bytes, larger "
                              "than the region's {} bytes (shm_stream_config::record_bytes; counted by the producer "
                              "in attribution_overflows) [{}:{}]",
                              overflow_stream_ ? *overflow_stream_ : "?", d_.index, d_.hook, d_.seq, d_.forward,
                              d_.record_bytes, record_capacity_, __FILE__, __LINE__),
        d_.record_bytes, record_capacity_);
  }
  return meta_;
}

std::span<const std::byte> shm_entry::bytes() const
{
  if (status() == d2h::entry_status::size_overflow) {
    throw d2h::size_overflow_error(hook(), seq(), d_.reserved, d_.size);
  }
  if (status() == d2h::entry_status::selection_error) { throw d2h::selection_error(hook(), seq()); }
  FERRY_EXPECTS(r_ != nullptr || d_.size == 0, ferry::logic_error,
                "shm entry {} (hook {}, seq {}): expected a live entry, got a released one", d_.index, d_.hook, d_.seq);
  return {data_, static_cast<std::size_t>(d_.size)};
}

d2h::typed_view shm_entry::typed() const
{
  const std::span<const std::byte> b = bytes();
  FERRY_EXPECTS(schema_ != nullptr, ferry::logic_error, "shm entry {} (hook {}): typed() expected an entry read "
                "from a stream, got a default-constructed one", d_.index, d_.hook);
  return d2h::typed(*schema_, hook(), b, d_.row_bytes);
}

void shm_entry::release() noexcept
{
  if (r_) {
    r_->release(d_.index);
    r_.reset();
  }
  data_ = nullptr;
}

std::span<const std::byte> shm_entry::rows_of(std::uint64_t request) const
{
  const std::span<const std::byte> all = bytes();
  FERRY_EXPECTS(d_.row_bytes != 0, ferry::logic_error, "shm entry {} (hook {}, seq {}): rows_of(request {}) expected "
                "a row entry (capture_rows), got one captured whole", d_.index, d_.hook, d_.seq, request);
  const std::span<const d2h::request_rows> reqs = requests();
  const d2h::request_rows* r = nullptr;
  for (const auto& q : reqs) {
    if (q.request == request) {
      r = &q;
      break;
    }
  }
  FERRY_EXPECTS(r != nullptr, ferry::logic_error, "shm entry {} (hook {}, seq {}): rows_of expected a request of "
                "forward {} (tag {}; forward_meta::requests: {} requests), got request {}", d_.index, d_.hook, d_.seq,
                d_.forward, d_.tag, reqs.size(), request);
  const std::uint64_t n = rows();
  FERRY_EXPECTS(r->first_row <= n && r->rows <= n - r->first_row, ferry::logic_error,
                "shm entry {} (hook {}, seq {}): "
                "request {} expected rows [{}, {}) within the entry's {} rows, got past them",
                d_.index, d_.hook, d_.seq, request, r->first_row, r->first_row + r->rows, n);
  return all.subspan(static_cast<std::size_t>(r->first_row * d_.row_bytes),
                     static_cast<std::size_t>(r->rows * d_.row_bytes));
}

shm_reader::shm_reader(const std::string& name, std::chrono::milliseconds attach_timeout)
  : impl_{std::make_shared<detail::shm_reader_impl>(name, attach_timeout)}
{
}
shm_reader& shm_reader::operator=(shm_reader&& o) noexcept
{
  if (this != &o) {
    if (impl_) { impl_->close(); }
    impl_ = std::move(o.impl_);
  }
  return *this;
}
shm_reader::~shm_reader()
{
  if (impl_) { impl_->close(); }
}
detail::shm_reader_impl& shm_reader::impl() const
{
  FERRY_EXPECTS(impl_ != nullptr, ferry::logic_error, "shm reader: expected a live reader, got a moved-from one");
  return *impl_;
}
std::vector<shm_entry> shm_reader::poll(std::size_t max, std::chrono::microseconds timeout)
{
  return impl().poll(max, timeout);
}
std::optional<shm_entry> shm_reader::next(std::chrono::microseconds timeout)
{
  auto v = impl().poll(1, timeout);
  if (v.empty()) { return std::nullopt; }
  return std::move(v.front());
}
bool shm_reader::ended() const { return impl().ended(); }
std::shared_ptr<const d2h::hook_schema> shm_reader::schema() const { return impl().schema(); }
shm_reader_stats shm_reader::stats() const { return impl().stats(); }
void shm_reader::close() noexcept
{
  if (impl_) { impl_->close(); }
}
const std::string& shm_reader::name() const { return impl().name(); }

}  // namespace ferry::sink
