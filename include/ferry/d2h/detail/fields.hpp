// SPDX-License-Identifier: Apache-2.0
// The D2H configuration, its tuning and the counters as named fields: ONE list each, in declaration order, for
// code that maps them by name (the Python keyword arguments and tuning keys, their defaults, the stubs and
// stats(); an engine's own config file). A static_assert counts the members of config, tuning and counters,
// so a new knob or counter that is not listed here fails to compile.
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
  static constexpr std::array<std::pair<std::string_view, head_memory>, 3> values{
      {{"platform", head_memory::platform},
       {"managed", head_memory::managed},
       {"pinned_mapped", head_memory::pinned_mapped}}};
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

template <>
struct enum_names<error_policy> {
  static constexpr std::array<std::pair<std::string_view, error_policy>, 2> values{
    {{"raise", error_policy::raise}, {"disable", error_policy::disable}}};
};

// The lists, in declaration order (X-macros: one name per field, expanded below).
// config's fields but its `tuning` member (listed apart: FERRY_D2H_TUNING_FIELDS).
#define FERRY_D2H_CONFIG_FIELDS(X) \
  X(ring_bytes) X(staging_bytes) X(publish_every) X(on_full) X(timeout) X(drain) X(fifo_capacity) X(on_error)
#define FERRY_D2H_TUNING_FIELDS(X)                                                                              \
  X(head_memory) X(size_slots) X(gather_batch) X(max_copies_in_flight) X(fused_copy_max_bytes)                 \
  X(single_block_copy_max_bytes) X(copy_block_threads) X(copy_vecs_per_thread) X(lean_copy_kernel)            \
  X(programmatic_launch) X(branch_publish) X(gather_branch_publish) X(bounce_capture_max_bytes) X(drain_idle_sleep)
#define FERRY_D2H_COUNTERS(X)                                                                                \
  X(entries_reserved) X(entries_published) X(entries_drained) X(bytes_drained) X(bytes_copied) X(copies)     \
  X(stalls) X(high_watermark) X(size_overflows) X(callback_errors) X(publishes) X(capture_errors) X(selection_errors)

/// f(name, member) for every field of `c` (a config or const config) but `tuning`, in declaration order.
template <class Config, class F>
constexpr void for_each_config_field(Config& c, F&& f)
{
#define FERRY_D2H_VISIT(n) f(#n, c.n);
  FERRY_D2H_CONFIG_FIELDS(FERRY_D2H_VISIT)
#undef FERRY_D2H_VISIT
}
/// f(name, member) for every field of `t` (a tuning or const tuning), in declaration order.
template <class Tuning, class F>
constexpr void for_each_tuning_field(Tuning& t, F&& f)
{
#define FERRY_D2H_VISIT(n) f(#n, t.n);
  FERRY_D2H_TUNING_FIELDS(FERRY_D2H_VISIT)
#undef FERRY_D2H_VISIT
}
/// f(name, value) for every counter of `c`, in declaration order.
template <class Counters, class F>
constexpr void for_each_counter(Counters& c, F&& f)
{
#define FERRY_D2H_VISIT(n) f(#n, c.n);
  FERRY_D2H_COUNTERS(FERRY_D2H_VISIT)
#undef FERRY_D2H_VISIT
}
#define FERRY_D2H_COUNT(n) +1
inline constexpr std::size_t config_field_count = 0 FERRY_D2H_CONFIG_FIELDS(FERRY_D2H_COUNT);
inline constexpr std::size_t tuning_field_count = 0 FERRY_D2H_TUNING_FIELDS(FERRY_D2H_COUNT);
inline constexpr std::size_t counter_count = 0 FERRY_D2H_COUNTERS(FERRY_D2H_COUNT);
#undef FERRY_D2H_COUNT

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

static_assert(fields_detail::member_count<config>() == config_field_count + 1,  // + its tuning member
              "d2h::config gained or lost a member: list it in for_each_config_field (d2h/detail/fields.hpp)");
static_assert(fields_detail::member_count<tuning>() == tuning_field_count,
              "d2h::tuning gained or lost a member: list it in for_each_tuning_field (d2h/detail/fields.hpp)");
static_assert(fields_detail::member_count<counters>() == counter_count,
              "d2h::counters gained or lost a member: list it in for_each_counter (d2h/detail/fields.hpp)");

}  // namespace ferry::d2h::detail
