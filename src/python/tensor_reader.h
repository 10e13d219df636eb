/* SPDX-License-Identifier: Apache-2.0 */
/* The tensor reader: what the libtorch op library ferry/_torch_ops.so lends the core module ferry._ferry, so
 * that a capture reads a plain torch.Tensor argument in C++ (its address, size, device, layout and version
 * counter: one call of a few nanoseconds) instead of through five to eight Python attribute calls. Bound once
 * by ferry.torch_ops (ferry._ferry._bind_tensor_reader(torch.ops.ferry._tensor_reader())); until then, and
 * in a build without the op library, ferry._ferry reads the attributes. The reader only reads: what a
 * capture may take and what it is refused for stays the binding's conversion (arrays.hpp) and the core's.
 * Internal to the two modules of one build (not installed); plain C. */
#ifndef FERRY_PYTHON_TENSOR_READER_H
#define FERRY_PYTHON_TENSOR_READER_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#define FERRY_TENSOR_READER_VERSION 1u
/** ferry_tensor_facts::device_type */
#define FERRY_TENSOR_OTHER 0
#define FERRY_TENSOR_CPU 1
#define FERRY_TENSOR_CUDA 2
/** What a capture needs to know of a tensor. */
typedef struct ferry_tensor_facts {
  const void* data;      /**< the address of its first element (its storage offset applied) */
  uint64_t nbytes;       /**< numel * element size */
  int32_t device_type;   /**< FERRY_TENSOR_* */
  int32_t device_index;  /**< -1 for the cpu */
  int64_t version;       /**< its version counter (torch's _version); -1: none (an inference tensor) */
  uint32_t dense;        /**< 1: strided, not nested, C-contiguous, no conjugate or negative bit, with storage:
                              the nbytes at data are its values */
  uint32_t unused;
} ferry_tensor_facts;
/** The table torch.ops.ferry._tensor_reader() returns the address of (static: lives as long as the library). */
typedef struct ferry_tensor_reader {
  uint32_t version;      /**< FERRY_TENSOR_READER_VERSION */
  uint32_t struct_size;  /**< sizeof(ferry_tensor_reader) of the library */
  /** Reads `tensor`, an object whose type is exactly torch.Tensor (the caller checks it), the GIL held; 0 when
   * `out` is filled, nonzero when the tensor could not be read (the caller takes its general path). Never
   * throws, never sets a Python error. */
  int (*read)(void* tensor, ferry_tensor_facts* out);
  /** The version counter of `tensor` (exactly torch.Tensor, the GIL held); -1: none (an inference tensor, or it
   * could not be read). */
  int64_t (*version_of)(void* tensor);
} ferry_tensor_reader;
#ifdef __cplusplus
}
#endif
#endif /* FERRY_PYTHON_TENSOR_READER_H */
