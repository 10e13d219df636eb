// SPDX-License-Identifier: Apache-2.0
// The user code that README.md's and docs/api/*.md's snippets call, declared so the snippets compile as
// written (tests/docs/check_snippets.cmake). Declarations only: the snippets are compiled, not run.
#pragma once

#include <ferry/backend.hpp>
#include <ferry/d2h.hpp>
#include <ferry/h2d.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

// ---- D2H: the engine's forward ----
template <class Stream>
void run_layer(std::uint32_t layer, const Stream& s);
const void* hidden(std::uint32_t layer);
const void* hidden_states(std::uint32_t layer);
inline constexpr std::uint64_t hidden_bytes = 4096;
inline constexpr std::uint64_t max_bytes = 1 << 20;
void consume(ferry::d2h::hook_id hook, std::span<const std::byte> bytes);
void consume(std::uint64_t request, std::span<const std::byte> rows);  // a request's rows (sinks.md, the reader)

// ---- H2D: the engine's step ----
template <class T>
void fill(std::span<T> dst);
template <class Stream>
void launch_forward(const Stream& s);
template <class Stream>
void launch_consumers(const Stream& s);
inline std::uint32_t n = 8;
inline std::uint64_t steps = 4;
extern const std::int32_t token[256];
extern const std::byte temps_bf16[512];
