# SPDX-License-Identifier: Apache-2.0
"""Sinks: native D2H consumers that put captured tensors somewhere, running in C++ on their own thread (no
Python per entry). Pass one as ``ferry.Channel(..., sink=...)``; docs/api/sinks.md.

``safetensors(directory, schema, ...)`` writes safetensors shards and an index.json in the style of Hugging
Face's sharded checkpoints; ``ferry.shards.open(directory)`` reads them back. The schema maps each hook id to
``(name, dtype, row_shape)``: an entry of n rows is the tensor ``[n, *row_shape]``.

``shm_stream(name, ...)`` publishes every entry zero-copy to ONE reader process through shared memory
(/dev/shm/ferry-<name>): the channel's D2H lands in the shared segment, and ``ferry.ShmReader(name)`` in the
other process reads it there.
"""

from __future__ import annotations

import os as _os

from . import _ferry
from ._ferry import LogicError

__all__ = ["SafetensorsSink", "ShmStreamSink", "dtype_name", "row_spec", "safetensors", "shm_stream"]

SafetensorsSink = _ferry.SafetensorsSink
ShmStreamSink = _ferry.ShmStreamSink

# safetensors' dtype names by the names numpy, ml_dtypes and torch give their dtypes
_BY_NAME = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8",
    "bool": "BOOL",
}
_NAMES = frozenset(_BY_NAME.values())


def dtype_name(dtype) -> str:
    """safetensors' name ("F32", "BF16", ...) of a torch.dtype, a numpy dtype (or type, or ml_dtypes'
    bfloat16), or a string: a safetensors name as is, or a numpy / torch name ("float32", "torch.bfloat16")."""
    if isinstance(dtype, str):
        if dtype in _NAMES:
            return dtype
        name = dtype[6:] if dtype.startswith("torch.") else dtype
    elif type(dtype).__module__ == "torch":  # a torch.dtype, without importing torch
        name = str(dtype)[6:]
    else:
        import numpy as np

        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise LogicError(f"ferry.sinks: expected a dtype (torch, numpy or a name such as 'BF16'), got "
                             f"{dtype!r}") from None
    if name == "bool_":
        name = "bool"
    if name not in _BY_NAME:
        raise LogicError(f"ferry.sinks: expected a dtype safetensors stores ({', '.join(sorted(_NAMES))}), got "
                         f"{dtype!r}")
    return _BY_NAME[name]


def row_spec(name: str, example) -> tuple[str, str, tuple[int, ...]]:
    """The schema entry ``(name, dtype, row_shape)`` of a hook whose tensors look like `example` (a torch
    tensor or a numpy array): its first dimension is the rows, the rest is one row."""
    shape = tuple(int(d) for d in example.shape)
    if not shape:
        raise LogicError(f"ferry.sinks.row_spec({name!r}): expected a tensor with a row dimension, got a scalar")
    return (name, dtype_name(example.dtype), shape[1:])


def _schema(schema) -> list[tuple[int, str, str, list[int]]]:
    if not isinstance(schema, dict) or not schema:
        raise LogicError(f"ferry.sinks.safetensors: expected schema a non-empty dict {{hook_id: (name, dtype, "
                         f"row_shape)}}, got {type(schema).__name__}")
    out = []
    for hook, spec in schema.items():
        if not isinstance(hook, int) or isinstance(hook, bool):
            raise LogicError(f"ferry.sinks.safetensors: expected int hook ids, got {hook!r}")
        if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
            raise LogicError(f"ferry.sinks.safetensors: hook {hook}: expected (name, dtype, row_shape), got {spec!r}")
        name, dtype = spec[0], spec[1]
        row = spec[2] if len(spec) == 3 else ()
        if not isinstance(name, str):
            raise LogicError(f"ferry.sinks.safetensors: hook {hook}: expected a str name, got {name!r}")
        row = (row,) if isinstance(row, int) else tuple(row)
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in row):
            raise LogicError(f"ferry.sinks.safetensors: hook {hook} {name!r}: expected row_shape a tuple of ints, "
                             f"got {spec[2]!r}")
        out.append((hook, name, dtype_name(dtype), list(row)))
    return out


def safetensors(directory, schema, *, shard_bytes: int = 1 << 30, policy: str = "block", fsync: bool = False,
                overwrite: bool = False, max_queue_bytes: int = 64 << 20, block_timeout: float = 5.0) -> SafetensorsSink:
    """A sink writing every forward's entries as tensors ``"{tag}/{hook name}"`` into safetensors shards of at most
    `shard_bytes` of data (whole forwards; a forward larger than that gets a shard of its own) plus index.json,
    in `directory` (created if missing; another run's files are refused unless `overwrite`).

    `schema`: ``{hook_id: (name, dtype, row_shape)}`` (dtype a torch.dtype, numpy dtype or "BF16"-style name;
    ``row_spec(name, tensor)`` makes one from an example). `max_queue_bytes`: entry bytes waiting for the writer,
    at most; when full, `policy` "block" makes the drain thread wait up to `block_timeout` seconds (then the
    entry is queued anyway and a TimeoutError is kept), "drop" drops the whole forward (counted). `fsync`:
    each shard and the index reach the disk before they are renamed into place.

    ``stats()`` (dict), ``flush()``, ``close()`` (raises the first error kept: ferry.IOError for a failed file
    operation, ferry.LogicError for an entry outside the schema or a repeated tag, ferry.TimeoutError for a
    stall); a context manager. Close the channel first, then the sink.
    """
    return _ferry.SafetensorsSink(_os.fspath(directory), _schema(schema), shard_bytes=shard_bytes,
                                  max_queue_bytes=max_queue_bytes, policy=policy, block_timeout=float(block_timeout),
                                  fsync=bool(fsync), overwrite=bool(overwrite))


def shm_stream(name: str, *, staging_bytes: int = 64 << 20, descriptors: int = 4096, policy: str = "block",
               timeout: float = 5.0, max_lag_entries: int = 0, max_lag_bytes: int = 0,
               poll_interval: float = 1e-4) -> ShmStreamSink:
    """A sink streaming every entry zero-copy to a reader in another process: ``ferry.ShmReader(name)`` there.

    Creates the shared-memory segment /dev/shm/ferry-<name> (a name of [A-Za-z0-9._-]; ferry.StreamBusyError if a
    live producer holds it) with `staging_bytes` of staging, which the channel given this sink uses as its own
    (``Channel(..., sink=s)``: its staging_bytes must be 0 or equal), and a ring of `descriptors` (a power of two)
    entries published and not yet released. An entry's bytes are reused only after the reader released it.

    `policy` when the reader has no room (absent, dead or slow): "block" waits up to `timeout` seconds, then keeps
    the entry anyway and records a TimeoutError (raised by ``close()``): nothing is lost and the channel's own
    backpressure reaches the producer; a reader attaching later starts at the first entry not released. "drop"
    admits or drops each forward whole at its first entry (admitted while a reader is attached and lags by at most
    `max_lag_entries` entries and `max_lag_bytes` of staging; 0: half the ring / staging), counted in ``stats()``;
    a reader that releases nothing for `timeout` while room is needed is evicted (ferry.ReaderDetachedError there).
    `poll_interval`: the stream thread's period (seconds) while the reader holds entries (else 1 ms).

    ``stats()`` (dict), ``close()`` (marks the stream ended, waits up to `timeout` for the reader to release,
    raises the first error kept); a context manager. Close the channel first, then the sink.
    """
    return _ferry.ShmStreamSink(str(name), staging_bytes=staging_bytes, descriptors=descriptors, policy=policy,
                                timeout=float(timeout), max_lag_entries=max_lag_entries, max_lag_bytes=max_lag_bytes,
                                poll_interval=float(poll_interval))
