# SPDX-License-Identifier: Apache-2.0
"""ferry: GPU<->CPU transfer publication for inference engines.

D2H: ``ferry.Channel`` captures device tensors into a device ring; ``poll()`` returns the entries as
zero-copy numpy views of pinned staging. H2D: ``ferry.Publisher`` publishes per-forward metadata from
pinned sources into fixed device destinations; ``ferry.h2d_producer(publisher, group)`` declares a function
as the producer of a group. Sinks (``ferry.sinks``) consume a channel's entries natively: safetensors shards,
or a zero-copy shared-memory stream that ``ferry.ShmReader`` reads in another process. See docs/api/python.md.

Backends: ``"cuda"`` (built with FERRY_PYTHON_CUDA and a GPU present) or ``"host"`` (a host-emulated
device, always available); ``"auto"`` picks cuda where it can, else host. The environment variable
FERRY_PYTHON_BACKEND overrides what ``"auto"`` picks.
"""

from __future__ import annotations

import abc as _abc
import os as _os

from . import _ferry
from ._ferry import (  # noqa: F401  (re-exported)
    AttributionOverflowError,
    BackendError,
    Buffer,
    Entry,
    EntryBatch,
    Error,
    InvalidatedError,
    IOError,
    LayoutVersionError,
    LogicError,
    OutOfMemory,
    Plan,
    ProducerGoneError,
    ReaderDetachedError,
    ShmEntry,
    ShmReader,
    ShutdownError,
    SizeOverflowError,
    StreamBusyError,
    TimeoutError,
)
from .h2d import h2d_producer  # noqa: F401  (re-exported)
# ferry.arrow, ferry.reduce, ferry.sinks.safetensors, ferry.shards.open, ferry.tp
from . import arrow, reduce, schema as _schema, shards, sinks, tp  # noqa: F401,E402
from .schema import dtype_name, row_spec  # noqa: F401,E402  (re-exported)

__version__ = _ferry.version

__all__ = [
    "AttributionOverflowError", "BackendError", "Buffer", "Channel", "Entry", "EntryBatch", "Error", "Graph",
    "IOError", "InvalidatedError", "LayoutVersionError", "LogicError", "OutOfMemory", "Plan", "Producer",
    "ProducerGoneError", "Publisher", "ReaderDetachedError", "ShmEntry", "ShmReader", "ShutdownError",
    "SizeOverflowError", "Slot", "Stream", "StreamBusyError", "TimeoutError", "arrow", "available_backends",
    "default_backend", "dtype_name", "h2d_producer", "reduce", "row_spec", "shards", "sinks", "tp",
]

_BACKENDS = ("auto", "host", "cuda")


def _cuda_devices() -> int:
    if not _ferry.has_cuda:
        return 0
    try:
        return int(_ferry.cuda.device_count())
    except Error:  # no driver, no device
        return 0


def available_backends() -> list[str]:
    """The backends usable here: always "host", and "cuda" when built with CUDA and a GPU is present."""
    return ["cuda", "host"] if _cuda_devices() > 0 else ["host"]


def default_backend() -> str:
    """What backend="auto" picks: FERRY_PYTHON_BACKEND if set, else "cuda" where usable, else "host"."""
    env = _os.environ.get("FERRY_PYTHON_BACKEND", "")
    if env:
        return _resolve(env)
    return "cuda" if _cuda_devices() > 0 else "host"


def _resolve(backend: str) -> str:
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise LogicError(f"ferry: expected backend one of {_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return default_backend()
    if backend == "cuda":
        if not _ferry.has_cuda:
            raise LogicError("ferry: backend 'cuda' requested, but this ferry was built without CUDA "
                             "(rebuild with FERRY_PYTHON_CUDA=ON)")
        if _cuda_devices() == 0:
            raise LogicError("ferry: backend 'cuda' requested, expected a CUDA device, got none")
    return backend


def _module(backend: str):
    return getattr(_ferry, _resolve(backend))


class _Factory(_abc.ABC):
    """Constructing one returns the chosen backend's class instance; isinstance() holds for every backend."""

    _name = ""

    def __new__(cls, *args, backend: str = "auto", **kwargs):
        return getattr(_module(backend), cls._name)(*args, **kwargs)


class Channel(_Factory):
    """ferry.Channel(device=0, *, backend="auto", <config keywords>, sink=None, schema=None, tuning=None).

    The signature is written once, generated from the C++ field lists: the stub ``ferry/_ferry/host.pyi``
    (``help(ferry.host.Channel.__init__)``), appended below. The keywords are what a user chooses
    (d2h::config); ``tuning`` is a dict of performance knobs and platform overrides (d2h::tuning, every key
    checked: an unknown key or a wrong type is a ``ferry.LogicError``). docs/api/python.md says which knob
    matters for which workload.

    begin_forward(stream), capture(hook, tensor, stream), end_forward(stream) -> Plan, plan(plan),
    poll(max_entries=1024, timeout=0.0) -> list[Entry], poll_batch(max_entries=1024, timeout=None) ->
    EntryBatch, stats() -> dict, close(timeout=None) -> dict.
    ``handle``: the integer handle for native code (torch.ops.ferry.capture, ferry_capi.h); ``sink``: a
    ``ferry.sinks`` sink (e.g. ``ferry.sinks.safetensors(...)``) or a "ferry.sink" capsule, a native consumer
    that gets every entry instead of poll(); ``schema``: ``{hook_id: (name, dtype, row_shape) | (name, example)}``
    (ferry.schema): entries of those hooks are typed (``Entry.numpy()``, ``Entry.tensor()``), and a safetensors
    sink made without a schema takes it.
    """

    _name = "Channel"

    def __new__(cls, *args, backend: str = "auto", schema=None, **kwargs):
        if schema is not None:
            kwargs["schema"] = _schema.tuples(schema, "ferry.Channel")
        return getattr(_module(backend), cls._name)(*args, **kwargs)


class Publisher(_Factory):
    """ferry.Publisher(device=0, *, backend="auto"): declare(), initialize(), begin(slot),
    producer(group, slot=None), publish(group, stream), stage(), capture_upload(), device_pointer(),
    device_array() (read-only on the host backend). ``ferry.h2d_producer`` wraps producer() as a decorator."""

    _name = "Publisher"


class Stream(_Factory):
    """ferry.Stream(device=0, *, backend="auto"): an owning stream (the host backend's stream type)."""

    _name = "Stream"


class Graph(_abc.ABC):
    """An executable graph from Stream.end_capture(); launch(stream)."""


class Slot(_abc.ABC):
    """Publisher.begin(slot): one forward epoch of a runner slot (context manager; finish())."""


class Producer(_abc.ABC):
    """Publisher.producer(group): the group's producer scope (context manager; source(), write(), set_count())."""


for _name in ("host", "cuda"):
    _m = getattr(_ferry, _name, None)
    if _m is not None:
        for _abstract in (Channel, Publisher, Stream, Graph, Slot, Producer):
            _abstract.register(getattr(_m, _abstract.__name__))
del _name, _m
if Channel.__doc__ is not None:  # (python -OO strips docstrings) the generated signature and tuning keys
    Channel.__doc__ += "\n" + (_ferry.host.Channel.__init__.__doc__ or "")
