// SPDX-License-Identifier: Apache-2.0
// ferry/_torch_ops.so's tensor reader (../tensor_reader.h): a torch.Tensor's address, size, device, layout and
// version counter read from the at::Tensor inside the Python object, for ferry._ferry's eager capture (no
// Python attribute call). torch.ops.ferry._tensor_reader() returns the table's address; ferry.torch_ops binds
// it into ferry._ferry. Only THPVariable's inline unpacking is used (its layout is this torch build's own): the
// library links no libtorch_python symbol.
#include "../tensor_reader.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <cstdint>

namespace {

std::int64_t version_of_tensor(const at::Tensor& t)
{
  return t.is_inference() ? -1 : static_cast<std::int64_t>(t._version());
}

int read(void* obj, ferry_tensor_facts* out) noexcept
{
  try {
    const at::Tensor& t = THPVariable_Unpack(static_cast<PyObject*>(obj));
    if (!t.defined()) { return 1; }
    const c10::Device d = t.device();
    out->device_type = d.is_cpu() ? FERRY_TENSOR_CPU : d.is_cuda() ? FERRY_TENSOR_CUDA : FERRY_TENSOR_OTHER;
    out->device_index = d.has_index() ? d.index() : -1;
    out->version = version_of_tensor(t);
    const bool dense = t.layout() == c10::kStrided && !t.is_nested() && t.has_storage() && t.is_contiguous() &&
                       !t.is_conj() && !t.is_neg();
    out->dense = dense ? 1U : 0U;
    out->data = dense ? t.const_data_ptr() : nullptr;
    out->nbytes = dense ? static_cast<std::uint64_t>(t.nbytes()) : 0;
    return 0;
  } catch (...) {
    return 1;
  }
}

std::int64_t version_of(void* obj) noexcept
{
  try {
    return version_of_tensor(THPVariable_Unpack(static_cast<PyObject*>(obj)));
  } catch (...) {
    return -1;
  }
}

constexpr ferry_tensor_reader reader{FERRY_TENSOR_READER_VERSION, sizeof(ferry_tensor_reader), &read, &version_of};

std::int64_t reader_address() { return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(&reader)); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(ferry, m) { m.def("_tensor_reader() -> int", &reader_address); }
