// SPDX-License-Identifier: Apache-2.0
// ferry/_torch_ops.so: the torch.ops.ferry.* operators (TORCH_LIBRARY). A libtorch library, loaded
// by ferry/torch_ops.py with torch.ops.load_library; it reaches the channels of the core module ferry._ferry
// only through the C ABI table of ferry_capi.h (bound once by torch.ops.ferry._bind_capi), so the two
// modules share no C++ type (this one uses only the Python C API and torch's pybind11 headers, to raise).
//
//   capture / capture_deferred(Tensor(a!) token, Tensor x, int channel, int hook), flush(Tensor(a!) token, int
//   channel), capture_rows(token, x, selection, query_start_loc?, count?, channel, hook, window, max_count): the
//   Channel calls of the same names (schemas and semantics: ferry/torch_ops.py). token: declared mutated, never
//   read (torch.compile keeps every capture, in program order per token). CUDA: enqueued on torch's current
//   stream (torch.cuda.graph records it); host backend: on the stream of the channel's open forward. Sources are
//   held until the core no longer needs them (d2h::source_owner); a deferred x written in place before its
//   flush fails the flushing call with ferry.LogicError naming the hook.
#include "ops_common.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cstdint>
#include <string>

namespace {

using ferry_torch::g_capi;
using ferry_torch::logic;
using ferry_torch::raise;

const ferry_capi& capi()
{
  const ferry_capi* p = g_capi.load(std::memory_order_acquire);
  if (p == nullptr) {
    logic("ferry: torch.ops.ferry: expected the ferry C ABI to be bound (import ferry.torch_ops), got none");
  }
  return *p;
}

void bind_capi(int64_t address)
{
  const auto* p = reinterpret_cast<const ferry_capi*>(static_cast<std::uintptr_t>(address));
  if (p == nullptr || p->version < FERRY_CAPI_VERSION || p->struct_size < sizeof(ferry_capi)) {
    logic("ferry: torch.ops.ferry._bind_capi: expected a ferry_capi table of version >= " +
          std::to_string(FERRY_CAPI_VERSION) + ", got " +
          (p == nullptr ? std::string{"NULL"} : "version " + std::to_string(p->version)));
  }
  g_capi.store(p, std::memory_order_release);
}

void release_tensor(void* owner) { delete static_cast<at::Tensor*>(owner); }

/// A capture's source: x, and its version counter at the capture (deferred capture; an inference tensor
/// (torch.inference_mode) has none: -1, not checked). The channel holds it until the copy no longer needs
/// x (the core's rule: d2h::source_owner), then calls release_source.
struct source {
  at::Tensor x;
  std::int64_t version;
};
void release_source(void* owner) { delete static_cast<source*>(owner); }
int source_unchanged(void* owner)
{
  const auto* d = static_cast<const source*>(owner);
  return d->version < 0 || d->x._version() == d->version ? 1 : 0;
}

/// `t` is on the channel's device (a cpu tensor for the host backend) and contiguous; LogicError naming
/// who() (called on the error path only: a capture builds no message).
template <class Who>
void check_on_channel(const at::Tensor& t, int backend, int device, Who&& who)
{
  if (backend == FERRY_BACKEND_HOST) {
    if (!t.device().is_cpu()) {
      logic(who() + ": expected a cpu tensor (host backend channel), got one on " + t.device().str() +
            " (a device tensor where the host backend needs a host array)");
    }
  } else if (!t.device().is_cuda() || t.device().index() != device) {
    logic(who() + ": expected a tensor on cuda:" + std::to_string(device) + " (the channel's device), got one on " +
          t.device().str() + (t.device().is_cpu() ? " (a host tensor where a device tensor is needed)" : ""));
  }
  if (!t.is_contiguous()) {
    logic(who() + ": expected a C-contiguous tensor, got a strided one (" + std::to_string(t.dim()) + "-d)");
  }
}

/// CUDA: torch's current stream of `t`'s device (a torch.cuda.graph capture records it); the host backend:
/// the stream of the channel's open forward.
std::uintptr_t stream_for(const at::Tensor& t, int backend)
{
  return backend == FERRY_BACKEND_HOST
           ? FERRY_STREAM_OF_FORWARD
           : reinterpret_cast<std::uintptr_t>(
               c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle());
}

int capture_impl(const at::Tensor& x, int64_t channel, int64_t hook, bool deferred, char* err, std::size_t len)
{
  const ferry_capi& api = capi();
  // The message prefix, built only on an error path (not per call).
  const auto who = [&] {
    return std::string{"ferry: torch.ops.ferry."} + (deferred ? "capture_deferred" : "capture") + " (hook " +
           std::to_string(hook) + ")";
  };
  if (hook < 0 || hook > int64_t{UINT32_MAX}) {
    logic(who() + ": expected a hook in [0, 2^32), got " + std::to_string(hook));
  }
  int backend = 0;
  int device = 0;
  if (int rc = api.channel_info(static_cast<std::uint64_t>(channel), &backend, &device, nullptr, err, len);
      rc != FERRY_OK) {
    return rc;
  }
  check_on_channel(x, backend, device, who);
  const auto bytes = static_cast<std::uint64_t>(x.nbytes());
  const std::uintptr_t stream = stream_for(x, backend);
  auto* src = new source{x, deferred && !x.is_inference() ? static_cast<std::int64_t>(x._version()) : -1};
  const auto ch = static_cast<std::uint64_t>(channel);
  const auto h = static_cast<std::uint32_t>(hook);
  return deferred ? api.capture_deferred(ch, h, x.const_data_ptr(), bytes, stream, &release_source, &source_unchanged,
                                         src, err, len)
                  : api.capture(ch, h, x.const_data_ptr(), bytes, stream, &release_source, src, err, len);
}

void capture(at::Tensor& token, const at::Tensor& x, int64_t channel, int64_t hook)
{
  (void)token;
  char err[1024];
  if (int rc = capture_impl(x, channel, hook, false, err, sizeof err); rc != FERRY_OK) { raise(rc, err); }
}

void capture_deferred(at::Tensor& token, const at::Tensor& x, int64_t channel, int64_t hook)
{
  (void)token;
  char err[1024];
  if (int rc = capture_impl(x, channel, hook, true, err, sizeof err); rc != FERRY_OK) { raise(rc, err); }
}

/// The tensors a row-selected capture reads, held until the kernel read them.
struct rows_source {
  at::Tensor x, selection, query_start_loc, count;
};
void release_rows(void* owner) { delete static_cast<rows_source*>(owner); }

/// torch.ops.ferry.capture_rows: the rows `selection` names of x (rows: int32/int64 row indices; with
/// query_start_loc: int32 request ids, the last token of each, or the window [window_begin, window_end) when
/// window_end > window_begin); count: None (every element) or a 1-element int32 tensor (GPU-resolved, at most
/// max_count, or the selection's length when max_count <= 0).
void capture_rows(at::Tensor& token, const at::Tensor& x, const at::Tensor& selection,
                  const std::optional<at::Tensor>& query_start_loc, const std::optional<at::Tensor>& count,
                  int64_t channel, int64_t hook, int64_t window_begin, int64_t window_end, int64_t max_count)
{
  (void)token;
  const ferry_capi& api = capi();
  const std::string who = "ferry: torch.ops.ferry.capture_rows (hook " + std::to_string(hook) + ")";
  if (hook < 0 || hook > int64_t{UINT32_MAX}) {
    logic(who + ": expected a hook in [0, 2^32), got " + std::to_string(hook));
  }
  char err[1024];
  int backend = 0;
  int device = 0;
  if (int rc = api.channel_info(static_cast<std::uint64_t>(channel), &backend, &device, nullptr, err, sizeof err);
      rc != FERRY_OK) {
    raise(rc, err);
  }
  check_on_channel(x, backend, device, [&] { return who; });
  check_on_channel(selection, backend, device, [&] { return who + " selection"; });
  const bool rows_form = !query_start_loc.has_value();
  const bool wide = selection.scalar_type() == at::kLong;
  if (selection.dim() != 1 || !(selection.scalar_type() == at::kInt || (rows_form && wide))) {
    logic(who + ": expected a 1-D " + (rows_form ? "int32 or int64" : "int32") + " selection, got a " +
          std::to_string(selection.dim()) + "-d " + std::string{c10::toString(selection.scalar_type())} + " one");
  }
  ferry_row_selection sel{};
  sel.form = rows_form ? 0U : window_end > window_begin ? 2U : 1U;
  sel.index_bytes = wide ? 8U : 4U;
  sel.indices = selection.const_data_ptr();
  sel.count = static_cast<std::uint64_t>(selection.numel());
  sel.max_count = sel.count;
  sel.window_begin = window_begin;
  sel.window_end = window_end;
  if (!rows_form) {
    const at::Tensor& q = *query_start_loc;
    check_on_channel(q, backend, device, [&] { return who + " query_start_loc"; });
    if (q.dim() != 1 || q.scalar_type() != at::kInt || q.numel() < 1) {
      logic(who + ": expected a 1-D int32 query_start_loc of >= 1 element");
    }
    sel.query_start_loc = static_cast<const std::int32_t*>(q.const_data_ptr());
    sel.n_requests = static_cast<std::uint32_t>(q.numel() - 1);
  }
  if (count.has_value()) {
    check_on_channel(*count, backend, device, [&] { return who + " count"; });
    if (count->numel() != 1 || count->scalar_type() != at::kInt) { logic(who + ": expected a 1-element int32 count"); }
    sel.device_count = static_cast<const std::int32_t*>(count->const_data_ptr());
    sel.max_count = max_count > 0 ? static_cast<std::uint64_t>(max_count) : sel.count;
    sel.count = 0;
  }
  const auto n_rows = static_cast<std::uint64_t>(x.dim() > 0 ? x.size(0) : 0);
  const std::uint64_t row_bytes = n_rows > 0 ? static_cast<std::uint64_t>(x.nbytes()) / n_rows : 0;
  auto* src = new rows_source{x, selection, query_start_loc.value_or(at::Tensor{}), count.value_or(at::Tensor{})};
  const auto ch = static_cast<std::uint64_t>(channel);
  if (int rc = api.capture_rows(ch, static_cast<std::uint32_t>(hook), x.const_data_ptr(), n_rows, row_bytes, &sel,
                                stream_for(x, backend), &release_rows, src, err, sizeof err);
      rc != FERRY_OK) {
    raise(rc, err);
  }
}

void flush(at::Tensor& token, int64_t channel)
{
  const ferry_capi& api = capi();
  char err[1024];
  int backend = 0;
  if (int rc = api.channel_info(static_cast<std::uint64_t>(channel), &backend, nullptr, nullptr, err, sizeof err);
      rc != FERRY_OK) {
    raise(rc, err);
  }
  const std::uintptr_t stream = stream_for(token, backend);  // the token is on the channel's device
  if (int rc = api.flush(static_cast<std::uint64_t>(channel), stream, err, sizeof err); rc != FERRY_OK) {
    raise(rc, err);
  }
}

}  // namespace

TORCH_LIBRARY(ferry, m)
{
  m.def("capture(Tensor(a!) token, Tensor x, int channel, int hook) -> ()");
  m.def("capture_deferred(Tensor(a!) token, Tensor x, int channel, int hook) -> ()");
  m.def("flush(Tensor(a!) token, int channel) -> ()");
  m.def("capture_rows(Tensor(a!) token, Tensor x, Tensor selection, Tensor? query_start_loc, Tensor? count, "
        "int channel, int hook, int window_begin=0, int window_end=0, int max_count=0) -> ()");
  m.def("_bind_capi(int address) -> ()", &bind_capi);
}

// The kernels, one per backend key; other layouts are refused (layouts.cpp).
#define FERRY_IMPL(key)                            \
  TORCH_LIBRARY_IMPL(ferry, key, m)                \
  {                                                \
    m.impl("capture", &capture);                   \
    m.impl("capture_deferred", &capture_deferred); \
    m.impl("flush", &flush);                       \
    m.impl("capture_rows", &capture_rows);         \
  }
FERRY_IMPL(CPU)
FERRY_IMPL(CUDA)
#undef FERRY_IMPL
