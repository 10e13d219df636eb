// SPDX-License-Identifier: Apache-2.0
// ferry::sink::shm_reader and shm_entry (sink/shm_reader.hpp): the handle's calls, forwarded to its
// detail::shm_reader_impl (shm_reader_impl.hpp), and the entry's release() and rows_of().
#pragma once

#include <ferry/sink/detail/shm_reader_impl.hpp>

namespace ferry::sink {

inline void shm_entry::release() noexcept
{
  if (r_) {
    r_->release(d_.index);
    r_.reset();
  }
  data_ = nullptr;
}

inline std::span<const std::byte> shm_entry::rows_of(std::uint64_t request) const
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
  FERRY_EXPECTS(r->first_row <= n && r->rows <= n - r->first_row, ferry::logic_error, "shm entry {} (hook {}, seq {}): "
                "request {} expected rows [{}, {}) within the entry's {} rows, got past them", d_.index, d_.hook, d_.seq,
                request, r->first_row, r->first_row + r->rows, n);
  return all.subspan(static_cast<std::size_t>(r->first_row * d_.row_bytes), static_cast<std::size_t>(r->rows * d_.row_bytes));
}

inline shm_reader::shm_reader(const std::string& name, std::chrono::milliseconds attach_timeout)
  : impl_{std::make_shared<detail::shm_reader_impl>(name, attach_timeout)}
{
}
inline shm_reader& shm_reader::operator=(shm_reader&& o) noexcept
{
  if (this != &o) {
    if (impl_) { impl_->close(); }
    impl_ = std::move(o.impl_);
  }
  return *this;
}
inline shm_reader::~shm_reader()
{
  if (impl_) { impl_->close(); }
}
inline detail::shm_reader_impl& shm_reader::impl() const
{
  FERRY_EXPECTS(impl_ != nullptr, ferry::logic_error, "shm reader: expected a live reader, got a moved-from one");
  return *impl_;
}
inline std::vector<shm_entry> shm_reader::poll(std::size_t max, std::chrono::microseconds timeout)
{
  return impl().poll(max, timeout);
}
inline std::optional<shm_entry> shm_reader::next(std::chrono::microseconds timeout)
{
  auto v = impl().poll(1, timeout);
  if (v.empty()) { return std::nullopt; }
  return std::move(v.front());
}
inline bool shm_reader::ended() const { return impl().ended(); }
inline std::shared_ptr<const d2h::hook_schema> shm_reader::schema() const { return impl().schema(); }
inline shm_reader_stats shm_reader::stats() const { return impl().stats(); }
inline void shm_reader::close() noexcept
{
  if (impl_) { impl_->close(); }
}
inline const std::string& shm_reader::name() const { return impl().name(); }

}  // namespace ferry::sink
