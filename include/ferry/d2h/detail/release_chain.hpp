// SPDX-License-Identifier: Apache-2.0
// The release chain: every system-scope release of published_head a channel issues, in ONE chain.
// `produced += n` in the state block is a plain read-modify-write and published_head must be monotonic, so
// releases never run concurrently: inline releases follow each other in compute-stream order, branch releases
// (tuning::branch_publish) follow each other in pub_stream order, and an inline release first joins an open
// branch back (join_ev). One word: a "release" is the system-scope store-release of published_head, whoever
// issues it; "publication" is what it does (entries become visible to the CPU). The ordering steps it
// enforces (docs/design/d2h.md, steps 2 and 3):
//   * inline release (release_inline): the kernel boundary on the producer stream after the batch's last writer
//     (griddepcontrol.wait under programmatic launch) is the writer join;
//   * branch release (release_on_branch): fork_ev recorded on the producer stream after the last writer,
//     waited by pub_stream, is the writer join;
//   * fused release (copy_entry_publish): the copy kernel's block barrier is the writer join;
//   * gather release (gather_publish, join_for_fused_release): block barrier + acq_rel join counter across blocks.
#pragma once

#include <ferry/backend/event.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/d2h/detail/channel_state.hpp>
#include <ferry/d2h/detail/kernels.hpp>

#include <cstdint>
#include <optional>

namespace ferry::d2h::detail {

template <ferry::backend::backend B>
class release_chain {
 public:
  using stream_type = typename B::stream_type;

  explicit release_chain(channel_state<B>& st) : st_{st}
  {
    if (st_.cfg.tuning.branch_publish) {
      pub_stream_.emplace(st_.b);
      fork_ev_.emplace(st_.b, ferry::backend::event_flags::disable_timing);
      join_ev_.emplace(st_.b, ferry::backend::event_flags::disable_timing);
    }
  }

  /// Releases the batch of `n` entries that `s`'s last writer completed (producer::commit_entry): counted only
  /// when the copy kernel fused it (`fused`), else on the branch (tuning::branch_publish), else inline.
  void release_batch(stream_type s, std::uint64_t n, bool fused)
  {
    if (fused) {
      st_.c_publishes.fetch_add(1, std::memory_order_relaxed);
    } else if (st_.cfg.tuning.branch_publish) {
      release_on_branch(s, n);
    } else {
      release_inline(s, n, 0);
    }
  }

  /// A release on the producer stream `s` (the forward boundary, an eager flush, close): stream order after
  /// every writer enqueued on `s` is the join. An open branch is joined back first (join_ev recorded on
  /// pub_stream, waited by `s`), so this release also follows every branch release: published_head and
  /// `produced` are only ever advanced by releases in one chain. `normalize`: copy cursor slot 1 into slot 0
  /// (forward boundary after an odd number of entries). `boundary`: the forward's last release (in a graph
  /// launch no plan() armed it restores the cursor instead of publishing; kernels/d2h/replay).
  void release_inline(stream_type s, std::uint64_t n, std::uint32_t normalize, bool boundary = false)
  {
    join_branch(s);
    head_args a{st_.device_state_ptr(), st_.head_dev, n, normalize, boundary ? 1U : 0U};
    st_.launch.own(publish_head_kernel(typename B::tag{}), 1, 1, s, a);
    st_.c_publishes.fetch_add(1, std::memory_order_relaxed);
  }

  /// A captured forward was dropped (producer::abort_forward): a branch release recorded in that capture
  /// is no work to join back (the capture ended; nothing of it runs).
  void forget_captured_branch() noexcept { branch_open_ = false; }

  /// Before a release fused into the kernel the producer enqueues next on `s` (the gather kernel's last
  /// block; this call releases nothing itself): like release_inline(), an open branch is joined back first,
  /// so the fused release follows every branch release in the one chain. Counts that release.
  void join_for_fused_release(stream_type s)
  {
    join_branch(s);
    st_.c_publishes.fetch_add(1, std::memory_order_relaxed);
  }

  /// Waits for every release queued on the branch (the destructor: nothing may touch freed state).
  void synchronize()
  {
    if (pub_stream_) { pub_stream_->synchronize(); }
  }

 private:
  /// A batch release on the branch: fork_ev recorded on `s` after the batch's last writer, pub_stream waits
  /// for it (that wait is the writer join: every kernel enqueued on `s` before the record has completed),
  /// then the 1-thread release. Launched plainly: the kernel ahead of it on pub_stream is not its only
  /// dependency.
  void release_on_branch(stream_type s, std::uint64_t n)
  {
    if (!st_.hooks.is(debug_fault::branch_publish_without_fork)) {
      st_.b.event_record(fork_ev_->handle(), s);
      fork_ev_->wait(pub_stream_->view());
    }
    head_args a{st_.device_state_ptr(), st_.head_dev, n, 0};
    st_.b.launch(publish_head_kernel(typename B::tag{}), ferry::backend::launch_config{{1}, {1}, 0, false},
                 pub_stream_->handle(), a);
    branch_open_ = true;
    st_.c_publishes.fetch_add(1, std::memory_order_relaxed);
  }

  /// join_ev recorded on pub_stream, waited by `s`: every branch release happens-before what `s` runs next.
  void join_branch(stream_type s)
  {
    if (branch_open_) {
      join_ev_->record(pub_stream_->view());
      st_.b.stream_wait_event(s, join_ev_->handle());
      branch_open_ = false;
    }
  }

  channel_state<B>& st_;
  std::optional<ferry::backend::stream<B>> pub_stream_;
  std::optional<ferry::backend::event<B>> fork_ev_, join_ev_;
  bool branch_open_{false};  ///< a release was enqueued on pub_stream and not yet joined back
};

}  // namespace ferry::d2h::detail
