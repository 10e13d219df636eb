// SPDX-License-Identifier: Apache-2.0
// ferry/_torch_ops.so: every torch.ops.ferry op on a tensor of a layout ferry does not copy (sparse, quantized,
// MKL-DNN) is a ferry.LogicError naming the op and the layout (boxed: one function for every schema).
#include "ops_common.hpp"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <sstream>
#include <string>

namespace {

using ferry_torch::logic;

/// Every ferry op on a tensor of a layout ferry does not copy (sparse, quantized, MKL-DNN): a ferry.LogicError
/// naming the op and the layout, instead of torch's "Could not run ... with arguments from the ... backend".
void refuse_layout(const c10::OperatorHandle& op, torch::jit::Stack* stack)
{
  std::string layout = "non-strided";
  for (const auto& v : *stack) {
    if (!v.isTensor()) { continue; }
    std::ostringstream o;
    o << v.toTensor().layout();
    if (v.toTensor().layout() != c10::kStrided) { layout = o.str(); }
    if (v.toTensor().is_quantized()) { layout = "quantized"; }
  }
  std::string name = op.schema().name();  // "ferry::capture"
  name.replace(name.find("::"), 2, ".");
  logic("ferry: torch.ops." + name + ": expected dense (strided) tensors, got a " + layout +
        " tensor (ferry copies the bytes of a contiguous tensor)");
}

}  // namespace

// Layouts ferry does not copy: the same refusal for every op (boxed: one function for every schema).
#define FERRY_REFUSE_LAYOUT(key)                                                              \
  TORCH_LIBRARY_IMPL(ferry, key, m)                                                           \
  {                                                                                           \
    for (const char* op : {"capture", "capture_deferred", "flush", "capture_rows"}) {         \
      m.impl(op, torch::CppFunction::makeFromBoxedFunction<&refuse_layout>());                \
    }                                                                                         \
  }
FERRY_REFUSE_LAYOUT(SparseCPU)
FERRY_REFUSE_LAYOUT(SparseMeta)
FERRY_REFUSE_LAYOUT(SparseCUDA)
FERRY_REFUSE_LAYOUT(SparseCsrCPU)
FERRY_REFUSE_LAYOUT(SparseCsrCUDA)
FERRY_REFUSE_LAYOUT(QuantizedCPU)
FERRY_REFUSE_LAYOUT(QuantizedCUDA)
FERRY_REFUSE_LAYOUT(MkldnnCPU)
#undef FERRY_REFUSE_LAYOUT
