// SPDX-License-Identifier: Apache-2.0
// ferry::sink::safetensors (sink/safetensors.hpp): the handle's calls, each forwarded to its
// detail::safetensors_impl (safetensors_impl.hpp).
#include "safetensors_impl.hpp"

namespace ferry::sink {

safetensors::safetensors(safetensors_config cfg)
  : impl_{std::make_shared<detail::safetensors_impl>(std::move(cfg))}
{
}

safetensors& safetensors::operator=(safetensors&& o) noexcept
{
  if (this != &o) {
    if (impl_) { impl_->close_quietly(); }
    impl_ = std::move(o.impl_);
  }
  return *this;
}

safetensors::~safetensors()
{
  if (impl_) { impl_->close_quietly(); }
}

detail::safetensors_impl& safetensors::impl() const
{
  FERRY_EXPECTS(impl_ != nullptr, ferry::logic_error, "safetensors sink: expected a live sink, got a moved-from one");
  return *impl_;
}

std::function<void(d2h::entry_view&&)> safetensors::callback() const
{
  (void)impl();
  return [p = impl_](d2h::entry_view&& e) { p->deliver(std::move(e)); };
}

void safetensors::operator()(d2h::entry_view&& e) const { impl().deliver(std::move(e)); }
void safetensors::adopt_schema(const d2h::hook_schema& channel_schema) { impl().adopt_schema(channel_schema); }
void safetensors::flush() { impl().flush(); }
safetensors_stats safetensors::stats() const { return impl().stats(); }
safetensors_stats safetensors::close() { return impl().close(); }
bool safetensors::closed() const { return impl().closed(); }
const safetensors_config& safetensors::cfg() const { return impl().cfg(); }

}  // namespace ferry::sink
