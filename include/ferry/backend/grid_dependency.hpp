// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch, device side (CUDA sm_90+; a no-op everywhere else, where launches run in
// plain stream order). Every ferry kernel that may be launched with launch_config::programmatic calls, in
// every thread and before its first memory access:
//
//   grid_dependency_launch_dependents();  // the NEXT kernel on the stream may be scheduled now (it still
//                                         // waits in its own grid_dependency_wait for this grid to finish)
//   grid_dependency_wait();               // returns once the kernel ahead of this one on the stream has
//                                         // COMPLETED and all its memory operations are visible
//
// PTX ISA, griddepcontrol: ".wait causes the executing thread to wait until all prerequisite grids in flight
// have completed and all the memory operations from the prerequisite grids are performed and made visible
// to the current grid"; ".launch_dependents ... the dependent may launch before the completion of the
// current grid". So the wait is the same join as the kernel boundary of plain stream order: a writer kernel
// ahead of the publishing kernel happens-before everything after the wait. By induction it covers every
// earlier kernel on the stream too, because the kernel ahead could not complete before its own wait
// returned (every ferry kernel executes it unconditionally) or, launched without the attribute, did not
// start before its predecessor completed. launch_dependents gives no memory guarantee at all; it only lets
// the dependent's blocks become resident early, which hides the launch gap between back-to-back kernels.
//
// The "memory" clobbers keep the compiler from moving loads or stores across either instruction.
#pragma once

#include <ferry/backend/system_atomic.hpp>  // FERRY_HD

namespace ferry::backend {

FERRY_HD inline void grid_dependency_wait() noexcept
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(__HIP_DEVICE_COMPILE__)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

FERRY_HD inline void grid_dependency_launch_dependents() noexcept
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(__HIP_DEVICE_COMPILE__)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// The architecture (major * 10 + minor, as backend preload() reports it) from which the code above
/// contains the wait: programmatic launch is safe only for kernels compiled for at least this.
inline constexpr int grid_dependency_min_arch = 90;

/// Host side, the one rule for launch_config::programmatic: the device (compute capability major
/// `device_cc_major`) has programmatic dependent launch AND the code that will run (`code_arch`, from
/// preload(); the minimum over a set of kernels) contains grid_dependency_wait. Code JIT-compiled from
/// compute_80 PTX reports 80 and must be launched plainly.
constexpr bool programmatic_launch_ok(int device_cc_major, int code_arch) noexcept
{
  return device_cc_major >= 9 && code_arch >= grid_dependency_min_arch;
}

}  // namespace ferry::backend
