# SPDX-License-Identifier: Apache-2.0
"""Sinks: native D2H consumers that put captured tensors somewhere, running in C++ on their own thread (no
Python per entry). Pass one as ``ferry.Channel(..., sink=...)``; docs/api/sinks.md.

``safetensors(directory, schema, ...)`` writes safetensors shards and an index.json in the style of Hugging
Face's sharded checkpoints; ``ferry.shards.open(directory)`` reads them back. The schema (ferry.schema; by
default the channel's) maps each hook id to ``(name, dtype, row_shape)``: an entry of n rows is the tensor
``[n, *row_shape]``.

``shm_stream(name, ...)`` publishes every entry zero-copy to ONE reader process through shared memory
(/dev/shm/ferry-<name>): the channel's D2H lands in the shared segment, and ``ferry.ShmReader(name)`` in the
other process reads it there, typed by the schema (its own, or by default the channel's).
"""

from __future__ import annotations

import os as _os

from . import _ferry
from .schema import dtype_name, row_spec, tuples as _tuples

__all__ = ["SafetensorsSink", "ShmStreamSink", "dtype_name", "row_spec", "safetensors", "shm_stream"]

SafetensorsSink = _ferry.SafetensorsSink
ShmStreamSink = _ferry.ShmStreamSink


def safetensors(directory, schema=None, *, shard_bytes: int = 1 << 30, policy: str = "block", fsync: bool = False,
                overwrite: bool = False, max_queue_bytes: int = 64 << 20, block_timeout: float = 5.0,
                direct_io: bool = True, open_shards: int = 0) -> SafetensorsSink:
    """A sink writing every forward's entries as tensors ``"{tag}/{hook name}"`` into safetensors shards of at most
    `shard_bytes` of data (whole forwards; a forward larger than that gets a shard of its own) plus index.json,
    in `directory` (created if missing; another run's files are refused unless `overwrite`).

    `schema`: ``{hook_id: (name, dtype, row_shape)}`` (dtype a torch.dtype, numpy dtype or "BF16"-style name;
    ``(name, tensor)`` or ``row_spec(name, tensor)``: from an example; ferry.schema); None: the schema of the
    channel the sink is given to (``ferry.Channel(..., schema=..., sink=...)``; one of them must have one).
    `max_queue_bytes`: entry bytes waiting for the writer, at most; when full, `policy` "block" makes the drain
    thread wait up to `block_timeout` seconds (then the entry is queued anyway and a TimeoutError is kept),
    "drop" drops the whole forward (counted). `fsync`: each shard and the index reach the disk before they are
    renamed into place; with it, `direct_io` writes the tensor data with O_DIRECT where the filesystem takes it
    (the disk's sequential rate, the page cache left alone), buffered otherwise. `open_shards`: shard files written
    at once, the forwards dealt to them in turn (``ferry.shards`` reads them back in forward order); 0: two on tmpfs,
    whose files written at once scale, else one.

    ``stats()`` (dict), ``flush()``, ``close()`` (raises the first error kept: ferry.IOError for a failed file
    operation, ferry.LogicError for an entry outside the schema or a repeated tag, ferry.TimeoutError for a
    stall); a context manager. Close the channel first, then the sink.
    """
    hooks = [] if schema is None else _tuples(schema, "ferry.sinks.safetensors")
    return _ferry.SafetensorsSink(_os.fspath(directory), hooks, shard_bytes=shard_bytes,
                                  max_queue_bytes=max_queue_bytes, policy=policy, block_timeout=float(block_timeout),
                                  fsync=bool(fsync), overwrite=bool(overwrite), direct_io=bool(direct_io),
                                  open_shards=open_shards)


def shm_stream(name: str, schema=None, *, staging_bytes: int = 64 << 20, descriptors: int = 4096,
               policy: str = "block", timeout: float = 5.0, max_lag_entries: int = 0, max_lag_bytes: int = 0,
               poll_interval: float = 1e-4, schema_bytes: int = 256 << 10,
               record_bytes: int = 1 << 20) -> ShmStreamSink:
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

    `schema`: ``{hook_id: (name, dtype, row_shape)}`` as for ``safetensors``; None: the schema of the channel the
    sink is given to, if it has one (``ferry.Channel(..., schema=..., sink=...)``; else the entries stay bytes).
    Written into the segment: the reader's ``ShmEntry.numpy()`` / ``tensor()`` of a declared hook are then
    ``[rows, *row_shape]`` of its dtype. `schema_bytes`: the segment's room for a channel's schema.

    Each forward's attribution (``begin_forward(tag=, requests=, meta=)``) reaches the reader with its entries
    (``ShmEntry.requests``, ``meta``, ``rows_of``) through a record region of `record_bytes` (rounded up to pages):
    a forward's record (64 + 24 per request + its meta bytes) waits for room there as an entry waits for a
    descriptor; one larger than the whole region is published without it (``ShmEntry.attribution`` 'overflow',
    ferry.AttributionOverflowError there; counted in ``stats()["attribution_overflows"]``).

    ``stats()`` (dict), ``close()`` (marks the stream ended, waits up to `timeout` for the reader to release,
    raises the first error kept); a context manager. Close the channel first, then the sink.
    """
    hooks = [] if schema is None else _tuples(schema, "ferry.sinks.shm_stream")
    return _ferry.ShmStreamSink(str(name), hooks, schema_bytes=schema_bytes, staging_bytes=staging_bytes,
                                descriptors=descriptors, policy=policy, timeout=float(timeout),
                                max_lag_entries=max_lag_entries, max_lag_bytes=max_lag_bytes,
                                poll_interval=float(poll_interval), record_bytes=record_bytes)
