// SPDX-License-Identifier: Apache-2.0
// Kernel getters of the D2H side, one per backend tag. Defined in kernels/d2h_kernels.cu (CUDA, HIP) and
// src/d2h_host_kernels.cpp (host). Launch: b.launch(copy_kernel(typename B::tag{}), cfg, stream, args).
//   copy_entry_publish_kernel  one block: copy, block join, optional fused publication
//   copy_entry_kernel          any grid: copy only (publication follows as a separate kernel)
//   (both per copy_form: one small kernel per vector width and one for unaligned sources; the host backend
//   has one body for every form)
//   publish_head_kernel        one thread: produced += n, system-scope release of published_head
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

host_kernel<copy_args> copy_entry_publish_kernel(host_tag, copy_form f);
cuda_kernel<copy_args> copy_entry_publish_kernel(cuda_tag, copy_form f);
hip_kernel<copy_args> copy_entry_publish_kernel(hip_tag, copy_form f);

host_kernel<copy_args> copy_entry_kernel(host_tag, copy_form f);
cuda_kernel<copy_args> copy_entry_kernel(cuda_tag, copy_form f);
hip_kernel<copy_args> copy_entry_kernel(hip_tag, copy_form f);

host_kernel<head_args> publish_head_kernel(host_tag);
cuda_kernel<head_args> publish_head_kernel(cuda_tag);
hip_kernel<head_args> publish_head_kernel(hip_tag);

host_kernel<commit_check_args> commit_check_kernel(host_tag);
cuda_kernel<commit_check_args> commit_check_kernel(cuda_tag);
hip_kernel<commit_check_args> commit_check_kernel(hip_tag);

}  // namespace ferry::d2h::detail
