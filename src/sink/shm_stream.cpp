// SPDX-License-Identifier: Apache-2.0
// ferry::sink::shm_stream (sink/shm_stream.hpp): the handle's calls, each forwarded to its
// detail::shm_stream_impl (shm_stream_impl.hpp).
#include "shm_stream_impl.hpp"

namespace ferry::sink {

shm_stream::shm_stream(shm_stream_config cfg) : impl_{std::make_shared<detail::shm_stream_impl>(std::move(cfg))}
{
}

shm_stream& shm_stream::operator=(shm_stream&& o) noexcept
{
  if (this != &o) {
    if (impl_) { impl_->close_quietly(); }
    impl_ = std::move(o.impl_);
  }
  return *this;
}

shm_stream::~shm_stream()
{
  if (impl_) { impl_->close_quietly(); }
}

detail::shm_stream_impl& shm_stream::impl() const
{
  FERRY_EXPECTS(impl_ != nullptr, ferry::logic_error, "shm stream: expected a live stream, got a moved-from one");
  return *impl_;
}

std::function<void(d2h::entry_view&&)> shm_stream::callback() const
{
  (void)impl();
  return [p = impl_](d2h::entry_view&& e) { p->deliver(std::move(e)); };
}

d2h::staging_memory shm_stream::staging(const d2h::host_registration& r) const { return impl().staging(r); }

void shm_stream::operator()(d2h::entry_view&& e) const { impl().deliver(std::move(e)); }
void shm_stream::adopt_schema(const d2h::hook_schema& channel_schema) { impl().adopt_schema(channel_schema); }
shm_stream_stats shm_stream::stats() const { return impl().stats(); }
shm_stream_stats shm_stream::close() { return impl().close(); }
bool shm_stream::closed() const { return impl().closed(); }
const shm_stream_config& shm_stream::cfg() const { return impl().cfg(); }

}  // namespace ferry::sink
