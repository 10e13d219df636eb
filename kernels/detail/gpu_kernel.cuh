// SPDX-License-Identifier: Apache-2.0
// Compiled as CUDA (ferry::cuda) or as HIP (ferry::hip) from the same .cu sources: picks the kernel
// handle type of the language being compiled. Kernel TUs stay light (types.hpp, no runtime or error
// headers): device code needs none of them.
#pragma once

#include <ferry/backend/types.hpp>

#include <type_traits>

#if defined(__HIP__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define FERRY_KERNEL_TAG ::ferry::backend::hip_tag
#define FERRY_KERNEL_HANDLE ::ferry::backend::hip_kernel
#else
#define FERRY_KERNEL_TAG ::ferry::backend::cuda_tag
#define FERRY_KERNEL_HANDLE ::ferry::backend::cuda_kernel
#endif

namespace ferry::kernels {

/// A getter's one switch from a run-time form to a kernel compiled per form: the host stub that
/// `of(std::integral_constant<form, F>{})` returns for the instantiation of `f` when `f` is one of `Forms`,
/// else for `Fallback`. E.g. [](auto F) { return reinterpret_cast<const void*>(&copy_entry<decltype(F)::value>); }.
template <auto Fallback, auto... Forms, class Of>
const void* form_instance(decltype(Fallback) f, Of of)
{
  using form = decltype(Fallback);
  const void* fn = of(std::integral_constant<form, Fallback>{});
  (void)((f == Forms && ((fn = of(std::integral_constant<form, Forms>{})), true)) || ...);
  return fn;
}

}  // namespace ferry::kernels
