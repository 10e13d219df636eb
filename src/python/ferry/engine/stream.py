# SPDX-License-Identifier: Apache-2.0
"""The reader's side of ``Capture(model, taps, out=ferry.sinks.shm_stream(name))``: every step's entries (one per
tap) reach another process with their attribution, and ``stream_rows`` splits them per request.

    with ferry.ShmReader(name) as reader:                       # in the trainer's process
        for step, tap, request, first_position, rows in ferry.engine.stream_rows(reader):
            ...   # rows: uint8 [n, row_bytes] (bf16 bits: .view(np.uint16)), positions first_position .. + n - 1

``request`` is transformers' request id (the forward's meta carries it beside each request's first position). A
row-capture entry that failed (``ShmEntry.ok`` false) is yielded with ``rows=None`` so that its positions are seen
as missing.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

__all__ = ["open_reader", "positions_meta", "read_meta", "stream_rows"]


def positions_meta(firsts: list[int], request_ids: list[str]) -> bytes:
    """A step's forward ``meta``, for the requests of its ``requests`` in that order: each one's first position
    (int64), then their ids (UTF-8, NUL-separated), so that a reader in another process names them as the engine
    does. ``sink::sample_assembler`` (C++, the per-request files' assembler) reads the same leading int64s."""
    return np.asarray(firsts, dtype="<i8").tobytes() + "\0".join(request_ids).encode()


def read_meta(meta: bytes | None, n: int) -> tuple[np.ndarray, list[str]]:
    """``(first positions, request ids)`` of a forward's ``meta`` (``positions_meta``) for its ``n`` requests;
    empty without meta."""
    if not meta or len(meta) < 8 * n:
        return np.zeros(0, "<i8"), []
    ids = meta[8 * n:].decode().split("\0") if n else []
    return np.frombuffer(meta, dtype="<i8", count=n), ids


def open_reader(name: str, timeout: float = 60.0) -> Any:
    """``ferry.ShmReader(name)`` once the producer has made the stream (a reader started first waits for it), up to
    ``timeout`` seconds; then the reader's own error."""
    import time

    from .. import Error, ShmReader

    end = time.monotonic() + timeout
    while True:
        try:
            return ShmReader(name)
        except Error:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def stream_rows(reader: Any, timeout: float = 0.05) -> Iterator[tuple[int, int, str, int, Any]]:
    """``(step, tap, request, first_position, rows)`` for every request of every entry of ``reader`` (a
    ``ferry.ShmReader``), until the stream ends. ``rows`` is a zero-copy view that holds its entry (copy it to
    keep it); ``first_position`` comes from the forward's meta (int64 per request, in ``requests`` order)."""
    while True:
        got = reader.poll(256, timeout)
        if not got:
            if reader.ended:
                return
            continue
        for e in got:
            reqs = e.requests or []
            firsts, ids = read_meta(e.meta, len(reqs))
            for k, (h, _, _) in enumerate(reqs):
                p0 = int(firsts[k]) if k < len(firsts) else -1
                rid = ids[k] if k < len(ids) else str(h)
                yield int(e.tag), int(e.hook), rid, p0, (e.rows_of(h) if e.ok else None)
            e.release()
