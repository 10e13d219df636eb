# SPDX-License-Identifier: Apache-2.0
"""Activations as a Hugging Face dataset, written with pyarrow (``pip install ./src/python[arrow]``).

``ferry.arrow.ArrowSink(channel, directory, context)`` drains a channel on threads of its own (off the engine's
path: one widens a forward while another writes the one before) and writes every forward's whole-context rows in
SAELens's cache layout: one row per context of ``context`` tokens, one ``Array2D(context, width)`` column per hook of
the channel's schema (float32; BF16 and F16 are widened, exactly) and ``token_ids`` (``Sequence(int,
length=context)``) from the hook named ``token_ids``. A forward's ``[tokens, width]`` entries (or ``[B, T, width]``)
must hold a whole number of contexts. The directory is what ``datasets.load_from_disk`` reads as it is (and each
shard ``datasets.Dataset.from_file``): Arrow IPC stream shards ``data-NNNNN.arrow``, ``state.json``,
``dataset_info.json`` with the features.

Crash consistency (``_arrow_shards.Shards``, shared with ``ferry.engine``'s per-request Arrow samples): a shard is
written under a temporary name (through ferry's sink writer, ``_ferry.SequentialFile``: O_DIRECT with ``fsync``) and
renamed whole, then ``state.json`` (the shards ``load_from_disk`` reads) is rewritten by rename; after a SIGKILL the
dataset holds the complete shards. A write error (a full disk) ends the run: the open shard's temporary is removed,
``stats()["first_error"]`` says why, the earlier shards stay loadable.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from typing import Any

import numpy as np

from ._arrow_shards import Shards as _Shards, file_writer, pyarrow

__all__ = ["ArrowSink", "ContextWriter"]


_FLOAT = {"F32", "F16", "BF16"}


class ContextWriter:
    """SAELens's layout from arrays: ``write({hook name: [tokens, width] array}, token_ids)`` appends
    ``tokens / context`` rows. ``hooks``: ``{name: (dtype name, row_shape)}`` (a channel's schema values).
    ``tuning``: the shards' writer (``_ferry.FileWriter``'s keywords: ``io_threads``, ``write_buffers``,
    ``write_bytes``; never what is written; LogicError for a key it does not take or a value out of range)."""

    def __init__(self, directory: str, hooks: dict, context: int, *, token_ids: str = "token_ids",
                 shard_bytes: int = 1 << 30, fsync: bool = False, tuning: dict | None = None) -> None:
        from . import LogicError
        pa = pyarrow()
        self.context, self.token_name = int(context), token_ids
        if self.context < 1:
            raise LogicError(f"ferry.arrow: expected context >= 1 tokens, got {context}")
        self.hooks = {n: (d, tuple(r)) for n, (d, r) in hooks.items() if n != token_ids}
        bad = {n: d for n, (d, _) in self.hooks.items() if d not in _FLOAT}
        if bad or not self.hooks:
            raise LogicError(f"ferry.arrow: expected hooks of F32, F16 or BF16 rows (and {token_ids!r}), got "
                             f"{bad or 'none'}")
        self.width = {n: int(np.prod(r, dtype=np.int64)) for n, (_, r) in self.hooks.items()}
        feats, fields = {}, []
        for n, w in self.width.items():  # datasets' Array2D: its extension type over list<list<float>>
            ext = {b"ARROW:extension:name": b"datasets.features.features.Array2DExtensionType",
                   b"ARROW:extension:metadata": json.dumps([[self.context, w], "float32"]).encode()}
            fields.append(pa.field(n, pa.list_(pa.list_(pa.float32())), metadata=ext))
            feats[n] = {"shape": [self.context, w], "dtype": "float32", "_type": "Array2D"}
        fields.append(pa.field(token_ids, pa.list_(pa.int64(), self.context)))
        feats[token_ids] = {"feature": {"dtype": "int64", "_type": "Value"}, "length": self.context, "_type": "List"}
        schema = pa.schema(fields, metadata={"huggingface": json.dumps({"info": {"features": feats}})})
        info = {"description": "activations written by ferry.arrow (SAELens's cache layout)", "citation": "",
                "homepage": "", "license": "", "features": feats}
        os.makedirs(directory, exist_ok=True)
        self.shards = _Shards(directory, schema, info, shard_bytes, fsync, file_writer(tuning))
        self.rows = 0
        self.bytes = 0
        self._buf: dict[tuple, np.ndarray] = {}  # widen's float32 buffer per (slot, hook)

    def widen(self, name: str, a: Any, slot: int = 0) -> np.ndarray:
        """Hook ``name``'s values as float32 (BF16 and F16 widened exactly, ``_ferry.widen_to_f32``: one pass, the GIL
        released) in this writer's buffer ``slot`` for the hook, reused by the next forward of the slot (the array is
        valid until then; ArrowSink widens one forward while the one before it is written)."""
        dtype = self.hooks[name][0]
        a = np.ascontiguousarray(a)
        n = a.size if dtype == "F32" or a.dtype.itemsize == 2 else a.nbytes // 2
        buf = self._buf.get((slot, name))
        if buf is None or buf.size < n:
            buf = self._buf[(slot, name)] = np.empty(n, np.float32)
        out = buf[:n]
        if dtype == "F32":
            np.copyto(out, a.reshape(-1), casting="same_kind")
        else:
            from . import _ferry
            _ferry.widen_to_f32(a.reshape(-1).view(np.uint16), dtype, out)
        return out

    def batch(self, arrays: dict, token_ids: Any, *, widened: bool = False) -> tuple[Any, int]:
        """The contexts of one forward as a record batch and its bytes, nothing written; LogicError for a hook missing
        or a token count that is not a whole number of contexts. ``widened``: every array came from ``widen``."""
        from . import LogicError
        pa, ctx = self.shards.pa, self.context
        tok = np.ascontiguousarray(token_ids, dtype=np.int64).reshape(-1)
        n = tok.size
        if n == 0 or n % ctx or set(arrays) != set(self.hooks):
            raise LogicError(f"ferry.arrow: expected every hook {sorted(self.hooks)} and a whole number of "
                             f"{ctx}-token contexts, got hooks {sorted(arrays)} and {n} tokens")
        cols = []
        for name in self.hooks:
            a = arrays[name] if widened else self.widen(name, arrays[name])
            if a.size != n * self.width[name]:
                raise LogicError(f"ferry.arrow: hook {name!r}: expected {n} tokens (token_ids') of {self.width[name]} "
                                 f"values, got {a.size} values")
            a = a.reshape(n, -1)
            inner = pa.ListArray.from_arrays(pa.array(np.arange(0, a.size + 1, a.shape[1], dtype=np.int32)),
                                             pa.array(a.reshape(-1)))
            cols.append(pa.ListArray.from_arrays(pa.array(np.arange(0, n + 1, ctx, dtype=np.int32)), inner))
        cols.append(pa.FixedSizeListArray.from_arrays(pa.array(tok), ctx))
        return pa.RecordBatch.from_arrays(cols, schema=self.shards.schema), sum(int(c.nbytes) for c in cols)

    def append(self, batch: Any, nbytes: int) -> int:
        """Appends a ``batch()`` to the open shard; returns its rows. A write error (a full disk) propagates with
        the open shard dropped."""
        self.shards.write(batch, nbytes)
        self.rows += batch.num_rows
        self.bytes += nbytes
        return batch.num_rows

    def write(self, arrays: dict, token_ids: Any, *, widened: bool = False) -> int:
        """Appends the contexts of one forward (``batch``, then ``append``); returns the rows written."""
        return self.append(*self.batch(arrays, token_ids, widened=widened))

    def close(self) -> None:
        self.shards.flush()


class ArrowSink:
    """Drains ``channel`` (made with a schema, no sink) into a ``ContextWriter`` at ``directory``, off the engine's
    path and in two stages: its poll thread widens a forward's entries (the next forward's first entry, or
    ``close()``, ends it) into one of two buffer slots, and its writer thread writes the forward before it, so the
    widening of one forward and the write of the last take turns with neither waiting. ``stats()``:
    ``forwards_written``, ``rows_written``, ``bytes_written``, ``shards``, ``forwards_refused`` (a forward the layout
    refuses: its error is ``first_error``, the next forwards go on) and ``first_error``; a write error (a full disk)
    stops the sink with the earlier shards loadable. ``stats()["seconds"]`` says where the threads' time went: the
    poll thread polling, widening and waiting for a free slot, the writer writing (``write``; of it, copying into
    the file writer's buffers: ``copy``, waiting for one the medium had not taken yet: ``io_wait``, waiting for the
    finisher to take a sealed shard: ``seal_wait``) and waiting for a forward; ``tuning`` sizes the file writer
    (``ContextWriter``'s). ``close()`` closes the channel, then the dataset."""

    _SLOTS = 2  # forwards widened and not yet written, at most

    def __init__(self, channel: Any, directory: str, context: int, *, token_ids: str = "token_ids",
                 shard_bytes: int = 1 << 30, fsync: bool = False, tuning: dict | None = None) -> None:
        from . import LogicError
        schema = dict(channel.schema)
        if not schema:
            raise LogicError("ferry.arrow.ArrowSink: expected a channel made with a schema (its hooks are the "
                             "columns), got none")
        self.ch, self.names = channel, {h: v[0] for h, v in schema.items()}
        self.writer = ContextWriter(directory, {v[0]: (v[1], v[2]) for v in schema.values()}, context,
                                    token_ids=token_ids, shard_bytes=shard_bytes, fsync=fsync, tuning=tuning)
        self._stats = {"forwards_written": 0, "rows_written": 0, "bytes_written": 0, "shards": 0,
                       "forwards_refused": 0, "first_error": None}
        self._secs = dict.fromkeys(("poll", "widen", "slot_wait", "write", "copy", "io_wait", "seal_wait",
                                    "writer_wait"), 0.0)
        self._stop = threading.Event()
        self._failed = threading.Event()  # the writer ended the run (a write error)
        self._free = threading.Semaphore(self._SLOTS)  # slots no forward in the queue or in the write holds
        self._q: queue.Queue = queue.Queue()  # (forward, slot), then None: the writer's work
        self._writer = threading.Thread(target=self._write_loop, name="ferry-arrow-writer", daemon=True)
        self._thread = threading.Thread(target=self._run, name="ferry-arrow-sink", daemon=True)
        self._writer.start()
        self._thread.start()

    def _note(self, err: str) -> None:
        self._stats["first_error"] = self._stats["first_error"] or err

    def _write(self, fwd: dict) -> None:
        from . import LogicError
        tok = fwd.pop(self.writer.token_name, None)
        try:
            if tok is None:
                raise LogicError(f"ferry.arrow: expected a {self.writer.token_name!r} entry in every forward, got "
                                 f"hooks {sorted(fwd)}")
            batch = self.writer.batch(fwd, tok, widened=True)  # a name not among the hooks: refused before any use
        except LogicError as err:  # the layout's refusal: nothing written; the next forwards go on
            self._stats["forwards_refused"] += 1
            self._note(str(err))
            return
        rows = self.writer.append(*batch)  # any error here is the shard's: it ends the run (_write_loop)
        self._stats["forwards_written"] += 1
        self._stats["rows_written"] += rows
        self._stats["bytes_written"] = self.writer.bytes
        self._stats["shards"] = len(self.writer.shards.names)

    def _write_loop(self) -> None:
        """The writer thread: each queued forward in order (its slot free again after it), then the dataset's files."""
        while True:
            t0 = time.perf_counter()
            item = self._q.get()
            t1 = time.perf_counter()
            self._secs["writer_wait"] += t1 - t0
            if item is None:
                break
            try:
                if not self._failed.is_set():
                    self._write(item[0])
                    self._secs["write"] += time.perf_counter() - t1
            except Exception as err:  # a write error (a full disk): the run ends with the earlier shards
                self._note(f"{type(err).__name__}: {err}")
                self._failed.set()
            finally:
                self._free.release()
        try:
            if self._failed.is_set():  # the shards sealed before the failure are in the dataset once close() returns
                self.writer.shards.settle()
            else:
                self.writer.close()
        except Exception as err:
            self._note(f"{type(err).__name__}: {err}")
        self._stats["shards"] = len(self.writer.shards.names)

    def _poll(self) -> Any:
        """The next entries; None once the channel closed and every entry was taken."""
        from . import LogicError
        try:
            return self.ch.poll(256, timeout=0.05)
        except LogicError:
            if self.ch.closed:
                return None
            raise

    def _run(self) -> None:
        """The poll thread: entries widened into the current forward's slot; a whole forward to the writer."""
        cur, fwd, slot = None, {}, -1
        try:
            while not self._failed.is_set():
                t0 = time.perf_counter()
                got = self._poll()
                self._secs["poll"] += time.perf_counter() - t0
                if got is None or (not got and self._stop.is_set()):
                    break
                for e in got:
                    try:
                        if cur is not None and e.forward != cur:
                            self._q.put((fwd, slot))
                            fwd, cur = {}, None
                        if cur is None:  # a forward starts: a slot the writer is done with
                            t0 = time.perf_counter()
                            while not self._free.acquire(timeout=0.05):
                                if self._failed.is_set():
                                    return
                            self._secs["slot_wait"] += time.perf_counter() - t0
                            slot = (slot + 1) % self._SLOTS
                        cur = e.forward
                        if e.ok:  # a hook's values widened straight from the staging (one pass), others copied
                            name = self.names.get(e.hook, str(e.hook))
                            w, t0 = self.writer, time.perf_counter()
                            fwd[name] = w.widen(name, e.numpy(), slot) if name in w.hooks else np.array(e.numpy())
                            self._secs["widen"] += time.perf_counter() - t0
                    finally:
                        e.release()
            if cur is not None:
                self._q.put((fwd, slot))
        except Exception as err:  # the channel failed: the forwards queued are still written
            self._note(f"{type(err).__name__}: {err}")
        finally:
            self._q.put(None)

    def stats(self) -> dict:
        sh = self.writer.shards
        self._secs.update(seal_wait=sh.seal_wait, copy=sh.copy, io_wait=sh.io_wait)
        return dict(self._stats, seconds=dict(self._secs))

    def close(self) -> dict:
        """Closes the channel (every entry delivered), lets the threads write the last forward and the dataset's
        files, and returns stats()."""
        self.ch.close()
        self._stop.set()
        self._thread.join()
        self._writer.join()
        return self.stats()
