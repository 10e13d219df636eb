// SPDX-License-Identifier: Apache-2.0
// Argument blocks of ferry's D2H kernels (trivially copyable, passed by value; kernels/d2h/: copy_entry and
// copy_entry_publish take copy_args, publish_head head_args, commit_check commit_check_args, select_rows
// select_args, arm_replay and claim_replay replay_token_args, gather_publish gather_args, gather_rows_publish
// gather_rows_args; both gathers' release part is gather_release_args), and the row formula (row_entry_bytes,
// row_reserved). Device-safe (no fmt, no error.hpp).
#pragma once

#include <ferry/d2h/reducer.hpp>
#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/row_selection.hpp>

#include <cstddef>
#include <cstdint>

namespace ferry::d2h::detail {

/// Copy `bytes` from `src` into the entry described by `dst` (dynamic entries: min(*actual_size, reserved)).
/// When `head_n` > 0 (one-block kernel only) the same kernel then publishes: produced += head_n and a
/// system-scope release of published_head.
struct copy_args {
  ring_ref dst;
  const std::byte* src{nullptr};
  std::uint64_t bytes{0};
  const std::uint64_t* actual_size{nullptr};  ///< device memory; dynamic entries only
  std::uint64_t head_n{0};
  std::uint64_t* head{nullptr};  ///< device address of published_head
  std::uint32_t vecs_per_thread{1};  ///< 16-byte vectors per thread per pass (1, 2, 4, 8): loads before stores
  std::uint32_t test_skip_wait{0};  ///< test hook (detail::debug_fault::programmatic_without_wait): omit the join
};

/// One thread: produced += n; store_release_system(head, produced). When `normalize` is set (forward
/// boundary after an odd number of entries) it first copies cursor slot 1 into slot 0. `boundary`: the
/// forward's last release (end_forward, abort_forward): in a forward no plan() armed (device_state::skip)
/// it publishes nothing and restores the cursor instead (replay_token.cuh); any other release of such a
/// forward publishes nothing.
struct head_args {
  device_state* state{nullptr};
  std::uint64_t* head{nullptr};
  std::uint64_t n{0};
  std::uint32_t normalize{0};
  std::uint32_t boundary{0};
};

/// The selection kernel (kernels/d2h/select, channel::capture_rows): copies the selected rows of the
/// [n_rows, row_bytes] source `src` into the dynamic entry `dst`, in selection order, and commits its size
/// (rows x row_bytes) or selection_error_size when an item is invalid (row_selection.hpp). `vec`: row_bytes
/// and `src` are 16-byte multiples (16-byte moves).
struct select_args {
  ring_ref dst;
  const std::byte* src{nullptr};
  std::uint64_t n_rows{0};
  std::uint64_t row_bytes{0};
  row_selection sel{};
  std::uint32_t vec{0};
  std::uint32_t planned{0};  ///< captured into a graph: a replay's plan()'d items place it (row_reserved)
};

/// The threads of a reduce_rows or reduce_rows_publish block (kernels/detail/reduce_block.cuh: 8 warps), and the
/// blocks of it an SM must hold at once (__launch_bounds__: its registers are capped to fit them).
inline constexpr std::uint32_t reduce_threads = 256;
inline constexpr std::uint32_t reduce_min_blocks = 2;

/// The reduce kernel (kernels/d2h/reduce, channel::capture_reduced): the records of reducer `r` (reducer.hpp) over
/// the rows `sel` names of the [n_rows, width] source `src` of `input` elements, into the dynamic entry `dst`; its
/// size: records x record_bytes, or selection_error_size when an item is invalid.
struct reduce_args {
  ring_ref dst;
  const std::byte* src{nullptr};
  std::uint64_t n_rows{0};
  std::uint64_t width{0};  ///< elements per row
  reduce_input input{reduce_input::f32};
  reducer r{};
  row_selection sel{};
  std::uint32_t planned{0};  ///< captured into a graph: a replay's plan()'d items place it (row_reserved)
};

/// The payload bound of a row entry of `items` items of `per_item` rows of `row_bytes` each: its rows' bytes, at
/// least 16 (an entry of no rows still takes its place). The one row formula: check_rows gives it for the
/// selection's item bound (capture_rows, capture_rows_deferred: the FIFO record's `bytes`), and row_reserved
/// aligns it.
FERRY_HD constexpr std::uint64_t row_entry_bytes(std::uint64_t items, std::uint64_t per_item,
                                                 std::uint64_t row_bytes) noexcept
{
  const std::uint64_t b = items * per_item * row_bytes;
  return b < entry_alignment ? entry_alignment : b;
}

/// The ring bytes of a row entry (row_entry_bytes, 16-byte aligned). The CPU reserves it for the selection's item
/// bound (capture_rows, capture_rows_deferred) or, in a replay whose plan() gave `items` (forward_meta::selected),
/// for exactly those items (plan()); the row kernels (kernels/d2h/select) place a planned entry with it
/// (device_state::planned_items), so both sides put it at the same offset.
FERRY_HD constexpr std::uint64_t row_reserved(std::uint64_t items, std::uint64_t per_item,
                                              std::uint64_t row_bytes) noexcept
{
  return align_up(row_entry_bytes(items, per_item, row_bytes), entry_alignment);
}

/// The replay token's kernels (kernels/d2h/replay): the channel's state block and its host-visible report
/// (two words in pinned mapped memory: the first unplanned launch, the number of unplanned launches).
struct replay_token_args {
  device_state* state{nullptr};
  std::uint64_t* report{nullptr};  ///< [0] first unplanned launch, [1] their count, [2] plan_overflow
  std::uint32_t quiet{0};  ///< arm_replay: a quiet token (capture disabled: the replay writes nothing, unreported)
  std::uint64_t items{no_planned_items};  ///< arm_replay: the plan()'s forward_meta::selected (none: the bounds)
};

/// The commit check after a user-written entry (one thread): `entry` is the ticket's view. When its writer
/// did not commit (slot[parity ^ 1] is not one commit ahead of slot[parity]) it commits in the writer's
/// place (a dynamic entry with size ~0: delivered as size_overflow) and, first time only, stores `tag`
/// (hook << 32 | index in the forward + 1) into the host-visible `flag`.
struct commit_check_args {
  ring_ref entry;
  std::uint64_t* flag{nullptr};
  std::uint64_t tag{0};
};

/// The most entries one gather launch copies (the descriptor table travels in the kernel parameters:
/// 128 x 16 bytes + 129 x 8 bytes of prefix sums + 129 x 4 bytes of block offsets, under the 4 KiB that every
/// backend passes by value; static_assert below): with one release per forward a vllm-full forward
/// (341 hooks) launches 3 gathers.
inline constexpr std::uint32_t gather_max_entries = 128;

/// One deferred entry: `bytes` (fixed size) from device memory `src`.
struct gather_entry {
  const std::byte* src{nullptr};
  std::uint64_t bytes{0};
};

/// The release part of a gather launch, one block shared by both gather argument blocks (gather_args::rel,
/// gather_rows_args::rel; producer::launch_deferred decides it, kernels/d2h/gather's gather_release runs it):
///   head_n     > 0: after the cross-block join the last block releases produced += head_n (system scope)
///   normalize  (forward boundary, head_n > 0) the last block copies cursor slot 1 into slot 0 before it
///              releases, as the boundary's publish kernel does (every block read its cursor before it arrived)
///   boundary   the forward's last release: in a forward no plan() armed it restores the cursor instead
struct gather_release_args {
  std::uint64_t* head{nullptr};  ///< device address of published_head
  std::uint64_t head_n{0};
  std::uint32_t normalize{0};
  std::uint32_t boundary{0};
};

/// The gather kernel's arguments (trivially copyable, passed by value; a captured graph keeps its copy).
/// ONE launch copies a flushed batch of deferred entries: they are placed consecutively from the device
/// cursor (the same two-slot cursor and place_phys chain as one entry per kernel, so graph replays land
/// where plan() put them), each entry is copied by its own range of blocks, and when `rel.head_n` > 0 the
/// last block to arrive at the join counter publishes published_head (system-scope release).
///   dst            ring, state block, ring size and the cursor parity of this writer (reserved: unused)
///   rel            the release part (gather_release_args)
///   e[0..n)        the batch, in entry order; entry i is placed after entry i - 1 (place_phys chain)
///   pre[0..n]      prefix sums of the reserved sizes (pre[0] = 0): the chain in closed form (gather_offset)
///   first_block    entry i is copied by blocks [first_block[i], first_block[i + 1]); first_block[n] = grid
struct gather_args {
  ring_ref dst;
  gather_release_args rel{};
  std::uint32_t n{0};
  std::uint32_t vecs_per_thread{1};
  std::uint32_t test_skip_wait{0};  ///< test hook (debug_fault::programmatic_without_wait): omit the join
  gather_entry e[gather_max_entries]{};
  std::uint64_t pre[gather_max_entries + 1]{};
  std::uint32_t first_block[gather_max_entries + 1]{};
};
static_assert(sizeof(gather_args) <= 4096, "gather_args travels as kernel parameters: at most 4 KiB");

/// The row gather's arguments (kernels/d2h/select/gather_rows_publish, channel::capture_rows_deferred): ONE
/// launch copies a flushed batch of row-selected deferred entries that share one selection `sel` and one row
/// count `n_rows`. Entry i holds the rows `sel` names of the [n_rows, row_bytes[i]] source src[i], in selection
/// order: a dynamic entry (size slot: the cursor's next + i) placed as gather_publish places its entries (pre:
/// prefix sums of the reservations, gather_offset), reserved for the selection's item bound. Blocks take
/// (entry, row, chunk) work items (a row of more than chunk_bytes is split: entry i has cpre[i + 1] - cpre[i]
/// chunks per row, so one wide row does not hold the launch back); block 0 writes the next cursor; the block that
/// arrives last at the join counter writes every size slot (rows x row_bytes[i]; selection_error_size for all when an
/// item is invalid: the entries share the selection) and, when rel.head_n > 0, releases as gather_publish does (the
/// same release part). The tables from `src` on are the batch's shape (gather.hpp: set_gather_rows, rows_shape).
struct gather_rows_args {
  ring_ref dst;
  gather_release_args rel{};
  std::uint32_t n{0};
  std::uint32_t vec{0};  ///< every row size and source is 16-byte aligned: 16-byte moves
  std::uint32_t test_skip_wait{0};
  std::uint64_t n_rows{0};
  row_selection sel{};
  const std::byte* src[gather_max_entries]{};
  std::uint32_t row_bytes[gather_max_entries]{};
  std::uint64_t pre[gather_max_entries + 1]{};
  union {
    std::uint32_t cpre[gather_max_entries + 1]{};  ///< a copied batch: prefix sums of the chunks per row of each entry
    std::uint32_t width[gather_max_entries + 1];    ///< a reduced batch: elements per source row of each entry
  };
  std::uint32_t chunk_bytes{0};                  ///< a multiple of 16
  /// A reduced batch (capture_reduced_deferred, the reduce_rows_publish kernel): each selected row of entry i is
  /// one record of `r` (row_bytes[i]: the record's bytes) from a source row of width[i] elements of `in`.
  reducer r{};
  reduce_input in{reduce_input::f32};
  /// Captured into a graph: a replay's plan()'d items place the batch (row_reserved per entry; the
  /// kernel's rows_layout). `rpre16`: prefix sums of row_bytes / 16 when every row is a 16-byte multiple and
  /// they fit (`rpre16_ok`): the planned prefix sums in closed form; else each block sums them.
  std::uint32_t planned{0};
  std::uint32_t rpre16_ok{0};
  std::uint32_t rpre16[gather_max_entries + 1]{};
};
static_assert(sizeof(gather_rows_args) <= 4096, "gather_rows_args travels as kernel parameters: at most 4 KiB");

}  // namespace ferry::d2h::detail
