// SPDX-License-Identifier: Apache-2.0
// The D2H configuration and counters as named fields: ONE list each, in declaration order, for code that
// maps them by name (the Python keyword arguments, their defaults, the stubs and stats(); an engine's own
// config file). A static_assert counts the members of config and counters, so a new knob or counter that
// is not listed here fails to compile.
#pragma once

#include <ferry/d2h/types.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <utility>

namespace ferry::d2h::detail {

/// The names of an enum's values (config's enum fields), in one table per enum.
template <class E>
struct enum_names;
template <>
struct enum_names<head_memory> {
  static constexpr std::array<std::pair<std::string_view, head_memory>, 2> values{
    {{"managed", head_memory::managed}, {"pinned_mapped", head_memory::pinned_mapped}}};
};
template <>
struct enum_names<full_policy> {
  static constexpr std::array<std::pair<std::string_view, full_policy>, 2> values{
    {{"block", full_policy::block_with_timeout}, {"fail_fast", full_policy::fail_fast}}};
};
template <>
struct enum_names<drain_mode> {
  static constexpr std::array<std::pair<std::string_view, drain_mode>, 2> values{
    {{"thread", drain_mode::thread}, {"poll", drain_mode::poll}}};
};

/// f(name, member) for every field of `c` (a config or const config), in declaration order.
template <class Config, class F>
constexpr void for_each_config_field(Config& c, F&& f)
{
  f("ring_bytes", c.ring_bytes);
  f("staging_bytes", c.staging_bytes);
  f("publish_every", c.publish_every);
  f("head_memory", c.head_memory);
  f("on_full", c.on_full);
  f("timeout", c.timeout);
  f("size_slots", c.size_slots);
  f("drain", c.drain);
  f("fifo_capacity", c.fifo_capacity);
  f("max_copies_in_flight", c.max_copies_in_flight);
  f("fused_copy_max_bytes", c.fused_copy_max_bytes);
  f("single_block_copy_max_bytes", c.single_block_copy_max_bytes);
  f("copy_block_threads", c.copy_block_threads);
  f("copy_vecs_per_thread", c.copy_vecs_per_thread);
  f("lean_copy_kernel", c.lean_copy_kernel);
  f("programmatic_launch", c.programmatic_launch);
  f("branch_publish", c.branch_publish);
  f("gather_branch_publish", c.gather_branch_publish);
  f("staged_capture_max_bytes", c.staged_capture_max_bytes);
  f("drain_idle_sleep", c.drain_idle_sleep);
}
inline constexpr std::size_t config_field_count = 20;

/// f(name, value) for every counter of `c`, in declaration order.
template <class Counters, class F>
constexpr void for_each_counter(Counters& c, F&& f)
{
  f("entries_reserved", c.entries_reserved);
  f("entries_published", c.entries_published);
  f("entries_drained", c.entries_drained);
  f("bytes_drained", c.bytes_drained);
  f("bytes_copied", c.bytes_copied);
  f("copies", c.copies);
  f("stalls", c.stalls);
  f("high_watermark", c.high_watermark);
  f("size_overflows", c.size_overflows);
  f("callback_errors", c.callback_errors);
  f("publishes", c.publishes);
}
inline constexpr std::size_t counter_count = 11;

namespace fields_detail {
struct any {
  template <class T>
  operator T() const;  // NOLINT(google-explicit-constructor): only used unevaluated
};
/// The number of members of aggregate T (the longest brace initializer it accepts).
template <class T, class... A>
consteval std::size_t member_count()
{
  if constexpr (requires { T{A{}..., any{}}; }) {
    return member_count<T, A..., any>();
  } else {
    return sizeof...(A);
  }
}
}  // namespace fields_detail

static_assert(fields_detail::member_count<config>() == config_field_count,
              "d2h::config gained or lost a member: list it in for_each_config_field (d2h/detail/fields.hpp)");
static_assert(fields_detail::member_count<counters>() == counter_count,
              "d2h::counters gained or lost a member: list it in for_each_counter (d2h/detail/fields.hpp)");

}  // namespace ferry::d2h::detail
