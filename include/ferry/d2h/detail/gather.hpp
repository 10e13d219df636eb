// SPDX-License-Identifier: Apache-2.0
// The gather kernels' dispatch (gather_publish, kernels/d2h/gather/; the row kernels gather_rows_publish and
// select_rows, kernels/d2h/select/): each batch's descriptor table and each launch shape, on the launch rules of
// ferry/detail/launch_rules.hpp: apportion_gather (blocks by entry size) and rows_shape (row work items). Pure:
// tests/d2h/d2h_units_test.cpp checks them. The argument blocks are in kernel_args.hpp, the getters in
// kernels.hpp (both included here). Device-safe (no fmt, no error.hpp).
#pragma once

#include <ferry/d2h/detail/kernel_args.hpp>
#include <ferry/d2h/detail/kernels.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/detail/launch_rules.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace ferry::d2h::detail {

/// Fills `a.e[0..n)` from (source, bytes) pairs and `a.pre` from their reserved sizes (align_up to
/// entry_alignment); `a.n` = n.
template <class SrcBytes>
constexpr void set_gather_entries(gather_args& a, std::uint32_t n, SrcBytes&& src_bytes) noexcept
{
  a.n = n;
  a.pre[0] = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    a.e[i] = src_bytes(i);
    a.pre[i + 1] = a.pre[i] + align_up(a.e[i].bytes, entry_alignment);
  }
}

/// The grid of one gather launch.
struct gather_shape {
  std::uint32_t blocks{1};
  std::uint32_t threads{128};
  std::uint32_t vecs_per_thread{1};
};

/// Apportions blocks to `a.e[0..a.n)` by size and fills `a.first_block`: every entry gets at least one
/// block and about one block per pass (threads x V x 16 bytes, launch_rules: block_threads of
/// copy_block_threads, vecs_per_thread of copy_vecs_per_thread); when the batch needs more than one wave
/// (one_wave_blocks: `sm_count` x 2048 threads) the pass doubles until it fits, so one large entry gets
/// many blocks and each small one its own block, all in one launch.
[[nodiscard]] constexpr gather_shape apportion_gather(const config& cfg, gather_args& a, int sm_count) noexcept
{
  namespace rules = ferry::detail::launch_rules;
  gather_shape s;
  s.vecs_per_thread = rules::vecs_per_thread(cfg.tuning.copy_vecs_per_thread);
  s.threads = static_cast<std::uint32_t>(rules::block_threads(cfg.tuning.copy_block_threads));
  const std::uint64_t max_blocks = std::max<std::uint64_t>(a.n, rules::one_wave_blocks(sm_count, s.threads));
  std::uint64_t pass = static_cast<std::uint64_t>(s.threads) * s.vecs_per_thread * 16;
  for (;;) {
    std::uint64_t total = 0;
    for (std::uint32_t i = 0; i < a.n; ++i) {
      a.first_block[i] = static_cast<std::uint32_t>(total);
      total += std::max<std::uint64_t>(1, (a.e[i].bytes + pass - 1) / pass);
    }
    if (total <= max_blocks) {
      a.first_block[a.n] = static_cast<std::uint32_t>(total);
      s.blocks = static_cast<std::uint32_t>(total);
      return s;
    }
    pass *= 2;
  }
}

/// The row gather's work item: at most this many bytes of one row (a wider row is split into chunks).
inline constexpr std::uint32_t row_gather_chunk = 16 << 10;

/// One row-selected deferred entry: its [n_rows, row_bytes] source and its ring bytes (row_reserved of the
/// selection's item bound, as the CPU placed it).
struct gather_row_entry {
  const std::byte* src{nullptr};
  std::uint64_t row_bytes{0};
  std::uint64_t reserved{0};
};

/// Fills `a.src`, `a.row_bytes` [0..n) from entry(i) (a gather_row_entry; row_bytes < 2^32) and `a.pre` from
/// their reserved sizes; `a.n` = n.
template <class Entry>
constexpr void set_gather_rows(gather_rows_args& a, std::uint32_t n, Entry&& entry) noexcept
{
  a.n = n;
  a.pre[0] = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const gather_row_entry e = entry(i);
    a.src[i] = e.src;
    a.row_bytes[i] = static_cast<std::uint32_t>(e.row_bytes);
    a.pre[i + 1] = a.pre[i] + e.reserved;
  }
}

/// The planned prefix sums' closed form of a row batch (`a.rpre16`, `a.rpre16_ok`: every row a 16-byte multiple and
/// the sums within 32 bits), from `a.n` and `a.row_bytes`: both row batches' (rows_shape, reduce_rows_shape).
constexpr void set_rows_plan(gather_rows_args& a) noexcept
{
  a.rpre16_ok = 1;
  a.rpre16[0] = 0;
  for (std::uint32_t i = 0; i < a.n; ++i) {
    const std::uint64_t rb = a.row_bytes[i];
    const std::uint64_t r16 = std::uint64_t{a.rpre16[i]} + rb / 16;
    if (rb % 16 != 0 || r16 > 0xffffffffULL) { a.rpre16_ok = 0; }
    a.rpre16[i + 1] = static_cast<std::uint32_t>(r16);
  }
}

/// The row gather's shape (gather_rows_publish) from `a.n`, `a.src`, `a.row_bytes` and `a.sel`: fills the work
/// item tables (`cpre`: each row in chunks of row_gather_chunk; `rpre16`, `rpre16_ok`: the planned prefix sums'
/// closed form where every row is a 16-byte multiple and the sums fit 32 bits; `vec`: every row and source
/// 16-byte aligned). Blocks take (entry, row, chunk) work items over at most one wave (one_wave_blocks), each
/// block as wide as the widest chunk's 16-byte vectors in whole warps (32 .. block_threads(copy_block_threads)).
[[nodiscard]] inline gather_shape rows_shape(const config& cfg, gather_rows_args& a, int sm_count) noexcept
{
  namespace rules = ferry::detail::launch_rules;
  a.chunk_bytes = row_gather_chunk;
  a.vec = 1;
  set_rows_plan(a);
  a.cpre[0] = 0;
  std::uint64_t widest = 0;
  for (std::uint32_t i = 0; i < a.n; ++i) {
    const std::uint64_t rb = a.row_bytes[i];
    a.cpre[i + 1] = a.cpre[i] + static_cast<std::uint32_t>((rb + row_gather_chunk - 1) / row_gather_chunk);
    widest = std::max(widest, std::min<std::uint64_t>(rb, row_gather_chunk));
    if (rb % 16 != 0 || reinterpret_cast<std::uintptr_t>(a.src[i]) % 16 != 0) { a.vec = 0; }
  }
  gather_shape s;
  const auto cap = static_cast<std::uint64_t>(rules::block_threads(cfg.tuning.copy_block_threads));
  s.threads = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((widest / 16 + 31) / 32 * 32, 32, cap));
  const std::uint64_t work = std::uint64_t{a.cpre[a.n]} * a.sel.item_bound() * a.sel.rows_per_item();
  s.blocks =
      static_cast<std::uint32_t>(std::clamp<std::uint64_t>(work, 1, rules::one_wave_blocks(sm_count, s.threads)));
  return s;
}

/// The reduce_rows_publish shape (a reduced row batch, capture_reduced_deferred: `a.width` set): the plan's closed
/// form (set_rows_plan); blocks of reduce_threads take (entry, row) work items, one record each, over at most one
/// wave.
[[nodiscard]] inline gather_shape reduce_rows_shape(gather_rows_args& a, int sm_count) noexcept
{
  namespace rules = ferry::detail::launch_rules;
  set_rows_plan(a);
  gather_shape s;
  s.threads = reduce_threads;
  const std::uint64_t work = std::uint64_t{a.n} * a.sel.item_bound() * a.sel.rows_per_item();
  s.blocks = static_cast<std::uint32_t>(
      std::clamp<std::uint64_t>(work, 1, rules::one_wave_blocks(sm_count, reduce_threads)));
  return s;
}

/// The select_rows shape (one row entry, capture_rows) from `a.src`, `a.row_bytes` and `a.sel`: `a.vec` (the row
/// and the source 16-byte aligned); blocks of block_threads(copy_block_threads) threads, one per selected row
/// (the selection's bound) over at most one wave.
[[nodiscard]] inline gather_shape rows_shape(const config& cfg, select_args& a, int sm_count) noexcept
{
  namespace rules = ferry::detail::launch_rules;
  a.vec = a.row_bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.src) % 16 == 0 ? 1U : 0U;
  gather_shape s;
  s.threads = static_cast<std::uint32_t>(rules::block_threads(cfg.tuning.copy_block_threads));
  const std::uint64_t rows = a.sel.item_bound() * a.sel.rows_per_item();
  s.blocks =
      static_cast<std::uint32_t>(std::clamp<std::uint64_t>(rows, 1, rules::one_wave_blocks(sm_count, s.threads)));
  return s;
}

}  // namespace ferry::d2h::detail
