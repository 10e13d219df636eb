// SPDX-License-Identifier: Apache-2.0
// Benchmark-only kernels (not part of ferry). The baselines reproduce the designs ferry replaces:
//   bench_copy              copy only (no publication; every diagnostic cursor_mode)
//   bench_copy_plain        the copy-only baseline proper (cursor_mode 0): one small kernel per copy form, as
//                           ferry's copy kernels (copy_vectors<V>: vector passes and the byte tail; unaligned: bench_copy)
//   baseline_volatile_flag  copy + block join (+ grid join via __threadfence/atomicAdd when multi-block)
//                           + __threadfence() + volatile flag store: the OLD, INVALID publication
//   baseline_sysflag        same join, then one st.release.sys per entry (valid, expensive)
// (Event per hook, forward.cpp, is bench_copy_plain plus an event record after each hook: no kernel of its own.)
// Their names deliberately avoid "publish"/"release" (the PTX check applies to ferry's own kernels).
#pragma once

#include <ferry/backend/types.hpp>
#include <ferry/d2h/detail/launch_shape.hpp>  // copy_form

#include <cstddef>
#include <cstdint>

namespace ferry::bench {

struct copy_args {
  std::byte* dst{nullptr};
  const std::byte* src{nullptr};
  std::uint64_t bytes{0};
  std::uint64_t* flag{nullptr};         ///< device address of the per-entry flag (baselines)
  const std::uint64_t* fwd{nullptr};    ///< forward counter: flag value = *fwd * hooks_per_fwd + hook + 1
  std::uint64_t hooks_per_fwd{0};
  std::uint64_t hook{0};
  unsigned* join{nullptr};              ///< grid-join counter (multi-block baselines)
  std::uint32_t vecs_per_thread{1};     ///< 16-byte vectors per thread per pass (same body as ferry's copy)
  /// Diagnostic (copy-only kernel): 0 none; 1 every thread adds a device word (always 0) to dst, read after
  /// its first source loads as ferry reads its cursor; 2 the same, and thread (0, 0) rewrites that word,
  /// so each kernel reads a line the kernel before it just wrote (ferry's cursor chain); 3, 4 below. GPU only.
  std::uint32_t cursor_mode{0};
  std::uint64_t* cursor{nullptr};
  /// cursor_modes 3 and 4 (ferry's two-slot cursor, rebuilt here): `cursor` points at {phys, dyn} x 2; the
  /// kernel reads slot[parity] (16 bytes) and thread (0, 0) writes slot[parity ^ 1] = {phys + bytes (wrapped
  /// at ring_bytes), dyn}. Mode 3 still writes to dst; mode 4 writes to ring + phys (ferry's placement);
  /// mode 5 is mode 4 with the two slots 128 bytes apart; mode 6 is mode 4 with 8-byte slots {phys}.
  /// Where the mode-1 word lives or how it is read: 7 in the source's allocation (just past the payload),
  /// 8 in the ring's allocation (past the last slot), 9 one load per block broadcast through shared memory,
  /// 10 through the read-only data path (__ldg).
  std::uint32_t parity{0};
  std::byte* ring{nullptr};
  std::uint64_t ring_bytes{0};
};

struct layer_args {
  const std::uint64_t* fwd{nullptr};  ///< forward index (device), seq = fwd * hooks_per_fwd + first_hook + k
  std::uint64_t hooks_per_fwd{0};
  std::uint64_t first_hook{0};
  std::uint64_t n_hooks{0};
  std::byte* act{nullptr};  ///< hook h's source at act + h * bytes
  std::uint64_t bytes{0};
  std::uint64_t spin_ns{0};
  /// Size mixes (forward/.../vllm_full_b1): hook h's source at act + hook_off[h], hook_bytes[h] bytes
  /// (ceil(bytes / 8) pattern words). Both null: the uniform layout above.
  const std::uint64_t* hook_off{nullptr};
  const std::uint64_t* hook_bytes{nullptr};
};

using ferry::backend::cuda_kernel;
using ferry::backend::host_kernel;

host_kernel<copy_args> bench_copy_kernel(ferry::backend::host_tag);
host_kernel<copy_args> bench_copy_plain_kernel(ferry::backend::host_tag, ferry::d2h::detail::copy_form f);
host_kernel<copy_args> baseline_volatile_kernel(ferry::backend::host_tag);
host_kernel<copy_args> baseline_sysflag_kernel(ferry::backend::host_tag);
host_kernel<layer_args> layer_kernel(ferry::backend::host_tag);
host_kernel<std::uint64_t*> next_forward_kernel(ferry::backend::host_tag);

cuda_kernel<copy_args> bench_copy_kernel(ferry::backend::cuda_tag);
cuda_kernel<copy_args> bench_copy_plain_kernel(ferry::backend::cuda_tag, ferry::d2h::detail::copy_form f);
cuda_kernel<copy_args> baseline_volatile_kernel(ferry::backend::cuda_tag);
cuda_kernel<copy_args> baseline_sysflag_kernel(ferry::backend::cuda_tag);
cuda_kernel<layer_args> layer_kernel(ferry::backend::cuda_tag);
cuda_kernel<std::uint64_t*> next_forward_kernel(ferry::backend::cuda_tag);

}  // namespace ferry::bench
