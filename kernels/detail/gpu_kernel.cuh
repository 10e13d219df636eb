// SPDX-License-Identifier: Apache-2.0
// Compiled as CUDA (ferry::cuda) or as HIP (ferry::hip) from the same .cu sources: picks the kernel
// handle type of the language being compiled. Kernel TUs stay light (types.hpp, no runtime or error
// headers): device code needs none of them.
#pragma once

#include <ferry/backend/types.hpp>

#if defined(__HIP__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define FERRY_KERNEL_TAG ::ferry::backend::hip_tag
#define FERRY_KERNEL_HANDLE ::ferry::backend::hip_kernel
#else
#define FERRY_KERNEL_TAG ::ferry::backend::cuda_tag
#define FERRY_KERNEL_HANDLE ::ferry::backend::cuda_kernel
#endif
