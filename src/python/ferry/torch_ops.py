# SPDX-License-Identifier: Apache-2.0
"""torch.ops.ferry: ferry's capture as a torch operator (eager, torch.compile, torch.cuda.graph).

Importing this module loads ``ferry/_torch_ops.so`` (built only where torch is importable) and registers::

    torch.ops.ferry.capture(Tensor(a!) token, Tensor x, int channel, int hook) -> ()

``channel`` is ``ferry.Channel.handle``; ``token`` is any tensor, declared mutated and never read, so
``torch.compile`` keeps every capture and keeps the captures sharing a token in program order (use one
token, e.g. ``token(device)``, for a whole forward). ``x`` must be contiguous and on the channel's device.
CUDA: the capture is enqueued on torch's current stream, so ``torch.cuda.graph`` records it. Host backend:
``x`` is snapshotted at the call and copied on the stream of the channel's open forward. Errors are
ferry's own (``ferry.LogicError``, ``ferry.InvalidatedError``, ...), as ``Channel.capture`` raises them.

Deferred capture (one gather launch per batch of K entries, ``Channel.capture_deferred``)::

    torch.ops.ferry.capture_deferred(Tensor(a!) token, Tensor x, int channel, int hook) -> ()
    torch.ops.ferry.flush(Tensor(a!) token, int channel) -> ()

Row-selected capture (``Channel.capture_rows``: the rows each request asked for, from a device-resident
selection that a graph replay reads at each step)::

    torch.ops.ferry.capture_rows(Tensor(a!) token, Tensor x, Tensor selection, Tensor? query_start_loc,
                                 Tensor? count, int channel, int hook, int window_begin=0, int window_end=0,
                                 int max_count=0) -> ()

``selection``: int32/int64 row indices, or with ``query_start_loc`` int32 request ids (the last token of each,
or the window ``[window_begin, window_end)`` when ``window_end > window_begin``); ``count``: ``None`` (every
element) or a 1-element int32 tensor (a GPU-resolved count, at most ``max_count``, by default the selection's
length).

Importing this module also lends the library's tensor reader to ``ferry._ferry``: ``Channel.capture`` /
``capture_deferred`` / ``capture_fn`` then read a plain dense ``torch.Tensor`` (address, size, device, version
counter) in C++ instead of through its Python attributes.

``x`` is held, and ``x._version`` recorded, until the gather of its batch is enqueued (the K-th deferred
entry, ``end_forward``, ``flush``, an immediate capture). A pending ``x`` written in place since its capture
makes the call that would flush it raise ``ferry.LogicError`` naming the hook, before anything of the batch
is launched (call ``ch.abort_forward(stream)`` then, and capture that hook immediately). In
``torch.cuda.graph`` capture the check runs while capturing. Under ``torch.compile`` the check sees only
eager version bumps: inductor writes its buffers without them (docs/api/python.md).
"""

from __future__ import annotations

import ctypes as _ctypes
import os as _os

import torch as _torch

from . import Channel, LogicError, _ferry

__all__ = ["capture", "capture_deferred", "capture_rows", "flush", "library_path", "token"]

_LIB = _os.path.join(_os.path.dirname(__file__), "_torch_ops.so")


def library_path() -> str:
    """The path of the op library (for torch.ops.load_library in a process that does not import ferry)."""
    return _LIB


def _load() -> None:
    if not _os.path.exists(_LIB):
        raise ImportError(f"ferry.torch_ops: expected the op library {_LIB}, got none (ferry was built without "
                          "torch: rebuild where torch is importable, or with -DFERRY_BUILD_TORCH=ON)")
    if not hasattr(_torch.ops.ferry, "capture_rows"):
        _torch.ops.load_library(_LIB)
    get = _ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = _ctypes.c_void_p
    get.argtypes = [_ctypes.py_object, _ctypes.c_char_p]
    _torch.ops.ferry._bind_capi(get(_ferry._capi, b"ferry._ferry._capi"))
    # the other way: the library's tensor reader for the core module's eager capture (src/python/tensor_reader.h)
    if hasattr(_torch.ops.ferry, "_tensor_reader") and hasattr(_ferry, "_bind_tensor_reader"):
        _ferry._bind_tensor_reader(_torch.ops.ferry._tensor_reader())


_load()


def _check_contiguous(op, x, hook):
    # Shape propagation has nothing to do (no outputs); the checks that need no channel are done here too,
    # so a bad input fails while tracing already.
    if not x.is_contiguous():
        raise LogicError(f"ferry: torch.ops.ferry.{op} (hook {hook}): expected a C-contiguous tensor, "
                         f"got a strided one ({x.dim()}-d)")


@_torch.library.register_fake("ferry::capture")
def _capture_fake(token, x, channel, hook):
    _check_contiguous("capture", x, hook)


@_torch.library.register_fake("ferry::capture_deferred")
def _capture_deferred_fake(token, x, channel, hook):
    _check_contiguous("capture_deferred", x, hook)


@_torch.library.register_fake("ferry::capture_rows")
def _capture_rows_fake(token, x, selection, query_start_loc, count, channel, hook, window_begin=0, window_end=0,
                       max_count=0):
    _check_contiguous("capture_rows", x, hook)


@_torch.library.register_fake("ferry::flush")
def _flush_fake(token, channel):
    return None


def token(device="cpu") -> _torch.Tensor:
    """A fresh token for torch.ops.ferry.capture: a 1-element int64 tensor on `device` (never read)."""
    return _torch.zeros(1, dtype=_torch.int64, device=device)


def capture(token: _torch.Tensor, x: _torch.Tensor, channel, hook: int) -> None:
    """torch.ops.ferry.capture(token, x, channel, hook); `channel` may be a ferry.Channel or its handle.

    For eager code; in a function given to torch.compile call the op with the int handle (read outside)."""
    if isinstance(channel, Channel):
        channel = channel.handle
    _torch.ops.ferry.capture(token, x, channel, hook)


def capture_deferred(token: _torch.Tensor, x: _torch.Tensor, channel, hook: int) -> None:
    """torch.ops.ferry.capture_deferred(token, x, channel, hook); `channel` may be a ferry.Channel."""
    if isinstance(channel, Channel):
        channel = channel.handle
    _torch.ops.ferry.capture_deferred(token, x, channel, hook)


def flush(token: _torch.Tensor, channel) -> None:
    """torch.ops.ferry.flush(token, channel): enqueues the gather of the pending deferred entries."""
    if isinstance(channel, Channel):
        channel = channel.handle
    _torch.ops.ferry.flush(token, channel)


def capture_rows(token: _torch.Tensor, x: _torch.Tensor, channel, hook: int, selection: _torch.Tensor,
                 query_start_loc: _torch.Tensor | None = None, count: _torch.Tensor | None = None,
                 window: tuple[int, int] | None = None, max_count: int = 0) -> None:
    """torch.ops.ferry.capture_rows(token, x, selection, query_start_loc, count, channel, hook, a, b, max_count);
    `channel` may be a ferry.Channel, `window` the (begin, end) of each request."""
    if isinstance(channel, Channel):
        channel = channel.handle
    a, b = window if window is not None else (0, 0)
    _torch.ops.ferry.capture_rows(token, x, selection, query_start_loc, count, channel, hook, a, b, max_count)
