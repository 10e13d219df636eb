// SPDX-License-Identifier: Apache-2.0
// sink::detail::handle (sink/detail/handle.hpp): the calls every sink's handle has, each forwarded to its state,
// instantiated for both sinks; and each sink's own calls (safetensors::flush, shm_stream::staging).
#include "safetensors_impl.hpp"
#include "shm_stream_impl.hpp"

namespace ferry::sink {
namespace detail {

namespace {
/// The sink a handle is, for its errors.
template <class Impl>
constexpr const char* sink_name = "sink";
template <>
constexpr const char* sink_name<safetensors_impl> = "safetensors sink";
template <>
constexpr const char* sink_name<shm_stream_impl> = "shm stream";
}  // namespace

template <class Impl, class Config, class Stats>
handle<Impl, Config, Stats>::handle(Config cfg) : impl_{std::make_shared<Impl>(std::move(cfg))}
{
}

template <class Impl, class Config, class Stats>
handle<Impl, Config, Stats>& handle<Impl, Config, Stats>::operator=(handle&& o) noexcept
{
  if (this != &o) {
    if (impl_) { impl_->close_quietly(); }
    impl_ = std::move(o.impl_);
  }
  return *this;
}

template <class Impl, class Config, class Stats>
handle<Impl, Config, Stats>::~handle()
{
  if (impl_) { impl_->close_quietly(); }
}

template <class Impl, class Config, class Stats>
Impl& handle<Impl, Config, Stats>::impl() const
{
  FERRY_EXPECTS(impl_ != nullptr, ferry::logic_error, "{}: expected a live handle, got a moved-from one (its state "
                "moved to another handle)", sink_name<Impl>);
  return *impl_;
}

template <class Impl, class Config, class Stats>
std::function<void(d2h::entry_view&&)> handle<Impl, Config, Stats>::callback() const
{
  (void)impl();
  return [p = impl_](d2h::entry_view&& e) { p->deliver(std::move(e)); };
}

template <class Impl, class Config, class Stats>
void handle<Impl, Config, Stats>::operator()(d2h::entry_view&& e) const
{
  impl().deliver(std::move(e));
}
template <class Impl, class Config, class Stats>
void handle<Impl, Config, Stats>::adopt_schema(const d2h::hook_schema& channel_schema)
{
  impl().adopt_schema(channel_schema);
}
template <class Impl, class Config, class Stats>
Stats handle<Impl, Config, Stats>::stats() const
{
  return impl().stats();
}
template <class Impl, class Config, class Stats>
std::vector<request_drop> handle<Impl, Config, Stats>::dropped_requests() const
{
  return impl().dropped_requests();
}
template <class Impl, class Config, class Stats>
Stats handle<Impl, Config, Stats>::close()
{
  return impl().close();
}
template <class Impl, class Config, class Stats>
bool handle<Impl, Config, Stats>::closed() const
{
  return impl().closed();
}
template <class Impl, class Config, class Stats>
const Config& handle<Impl, Config, Stats>::cfg() const
{
  return impl().cfg();
}

template class handle<safetensors_impl, safetensors_config, safetensors_stats>;
template class handle<shm_stream_impl, shm_stream_config, shm_stream_stats>;

}  // namespace detail

safetensors::safetensors(safetensors_config cfg) : handle{std::move(cfg)} {}
void safetensors::flush() { impl().flush(); }

shm_stream::shm_stream(shm_stream_config cfg) : handle{std::move(cfg)} {}
d2h::staging_memory shm_stream::staging(const d2h::host_registration& r) const { return impl().staging(r); }

}  // namespace ferry::sink
