// SPDX-License-Identifier: Apache-2.0
// Kernel getters of the D2H side, one per kernel and backend tag; each getter is its kernel's name +
// `_kernel`, and the kernel lives in kernels/d2h/<folder>/<name>.{cuh (body), cu (CUDA, HIP), _host.cpp (host)}:
//   copy_entry_kernel          copy/copy_entry: any grid, copy only (publication follows as a separate kernel)
//   copy_entry_publish_kernel  copy/copy_entry: one block: copy, block join, optional fused publication
//   (both per copy_form: one small kernel per vector width, lean form and unaligned source; the host
//   backend has one body for every form)
//   gather_publish_kernel      gather/gather_publish: one launch per batch of deferred entries (per vector width)
//   publish_head_kernel        publish/publish_head: one thread: produced += n, system-scope release of published_head
//   commit_check_kernel        publish/commit_check: one thread: commits in place of a user writer that did not
//   select_rows_kernel         select/select_rows: the selected rows of a tensor into one dynamic entry (capture_rows)
//   gather_rows_publish_kernel select/gather_rows_publish: one launch per batch of row-selected deferred entries
//                              (capture_rows_deferred; optional release in its last block)
//   reduce_rows_kernel         reduce/reduce_rows: a reducer's records over the selected rows (capture_reduced)
//   reduce_rows_publish_kernel reduce/reduce_rows_publish: one launch per batch of reduced row entries with a record
//                              per row (capture_reduced_deferred; the row gather's order, optional release)
//   (both per reduce_op: one kernel per reducer, so that each gets the registers of its own body, not the most any
//   reducer needs; the host backend has one body for every reducer)
//   arm_replay_kernel          replay/arm_replay: one thread: a plan()'s token for the next graph launch on the stream
//   claim_replay_kernel        replay/claim_replay: one thread, a captured forward's first node: takes the token,
//                              or marks the launch unplanned (it writes and publishes nothing) and reports it
// Launch: b.launch(copy_entry_kernel(typename B::tag{}, form), cfg, stream, args). Arguments: kernel_args.hpp;
// shapes: launch_shape.hpp (copy), gather.hpp (the gathers and the row kernels). for_each_kernel (below) is the
// table of every kernel and form a channel launches: channel_impl preloads through it.
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/d2h/detail/kernel_args.hpp>
#include <ferry/d2h/detail/launch_shape.hpp>  // copy_form

namespace ferry::d2h::detail {

using ferry::backend::cuda_kernel;
using ferry::backend::hip_kernel;
using ferry::backend::host_kernel;
using ferry::backend::cuda_tag;
using ferry::backend::hip_tag;
using ferry::backend::host_tag;

host_kernel<copy_args> copy_entry_kernel(host_tag, copy_form f);
cuda_kernel<copy_args> copy_entry_kernel(cuda_tag, copy_form f);
hip_kernel<copy_args> copy_entry_kernel(hip_tag, copy_form f);

host_kernel<copy_args> copy_entry_publish_kernel(host_tag, copy_form f);
cuda_kernel<copy_args> copy_entry_publish_kernel(cuda_tag, copy_form f);
hip_kernel<copy_args> copy_entry_publish_kernel(hip_tag, copy_form f);

/// `f` is vec_form(gather_args::vecs_per_thread) (an unaligned entry takes the byte path inside every form).
host_kernel<gather_args> gather_publish_kernel(host_tag, copy_form f);
cuda_kernel<gather_args> gather_publish_kernel(cuda_tag, copy_form f);
hip_kernel<gather_args> gather_publish_kernel(hip_tag, copy_form f);

host_kernel<head_args> publish_head_kernel(host_tag);
cuda_kernel<head_args> publish_head_kernel(cuda_tag);
hip_kernel<head_args> publish_head_kernel(hip_tag);

host_kernel<commit_check_args> commit_check_kernel(host_tag);
cuda_kernel<commit_check_args> commit_check_kernel(cuda_tag);
hip_kernel<commit_check_args> commit_check_kernel(hip_tag);

host_kernel<select_args> select_rows_kernel(host_tag);
cuda_kernel<select_args> select_rows_kernel(cuda_tag);
hip_kernel<select_args> select_rows_kernel(hip_tag);
host_kernel<gather_rows_args> gather_rows_publish_kernel(host_tag);
cuda_kernel<gather_rows_args> gather_rows_publish_kernel(cuda_tag);
hip_kernel<gather_rows_args> gather_rows_publish_kernel(hip_tag);

host_kernel<reduce_args> reduce_rows_kernel(host_tag, reduce_op op);
cuda_kernel<reduce_args> reduce_rows_kernel(cuda_tag, reduce_op op);
hip_kernel<reduce_args> reduce_rows_kernel(hip_tag, reduce_op op);
host_kernel<gather_rows_args> reduce_rows_publish_kernel(host_tag, reduce_op op);
cuda_kernel<gather_rows_args> reduce_rows_publish_kernel(cuda_tag, reduce_op op);
hip_kernel<gather_rows_args> reduce_rows_publish_kernel(hip_tag, reduce_op op);

host_kernel<replay_token_args> arm_replay_kernel(host_tag);
cuda_kernel<replay_token_args> arm_replay_kernel(cuda_tag);
hip_kernel<replay_token_args> arm_replay_kernel(hip_tag);

host_kernel<replay_token_args> claim_replay_kernel(host_tag);
cuda_kernel<replay_token_args> claim_replay_kernel(cuda_tag);
hip_kernel<replay_token_args> claim_replay_kernel(hip_tag);

/// The forms the copy getters are compiled for: the vector forms and bytes (copy_entry, copy_entry_publish,
/// gather_publish), and the lean forms (copy_entry only).
inline constexpr copy_form vector_forms[] = {copy_form::bytes, copy_form::v1, copy_form::v2, copy_form::v4,
                                             copy_form::v8};
inline constexpr copy_form lean_forms[] = {copy_form::v1_lean, copy_form::v2_lean, copy_form::v4_lean,
                                           copy_form::v8_lean};

/// The kernel table: `fn(kernel)` for every kernel a channel launches, in every form, of backend tag `t`. The
/// commit check is not in it: the producer loads it itself, where it launches it (producer::check_commits).
template <class Tag, class Fn>
void for_each_kernel(Tag t, Fn&& fn)
{
  fn(publish_head_kernel(t));
  fn(arm_replay_kernel(t));
  fn(claim_replay_kernel(t));
  fn(select_rows_kernel(t));
  fn(gather_rows_publish_kernel(t));
  for (const reduce_op op : {reduce_op::topk, reduce_op::fp8_e4m3, reduce_op::mean, reduce_op::stats}) {
    fn(reduce_rows_kernel(t, op));
  }
  fn(reduce_rows_publish_kernel(t, reduce_op::topk));
  fn(reduce_rows_publish_kernel(t, reduce_op::fp8_e4m3));
  for (const copy_form f : vector_forms) {
    fn(copy_entry_kernel(t, f));
    fn(copy_entry_publish_kernel(t, f));
    fn(gather_publish_kernel(t, f));
  }
  for (const copy_form f : lean_forms) { fn(copy_entry_kernel(t, f)); }
}

}  // namespace ferry::d2h::detail
