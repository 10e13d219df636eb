# SPDX-License-Identifier: Apache-2.0
"""Activations as a Hugging Face dataset, written with pyarrow (``pip install ./src/python[arrow]``).

``ferry.arrow.ArrowSink(channel, directory, context)`` drains a channel on its own thread (off the engine's path:
``Channel.poll_batch``) and writes every forward's whole-context rows in SAELens's cache layout: one row per
context of ``context`` tokens, one ``Array2D(context, width)`` column per hook of the channel's schema (float32;
BF16 and F16 are widened, exactly) and ``token_ids`` (``Sequence(int, length=context)``) from the hook named
``token_ids``. A forward's ``[tokens, width]`` entries (or ``[B, T, width]``) must hold a whole number of contexts.
The directory is what ``datasets.load_from_disk`` reads as it is (and each shard ``datasets.Dataset.from_file``):
Arrow IPC stream shards ``data-NNNNN.arrow``, ``state.json``, ``dataset_info.json`` with the features.

Crash consistency (``_Shards``, shared with ``ferry.engine``'s per-request Arrow samples): a shard is written under a
temporary name (through ferry's sink writer, ``_ferry.SequentialFile``: O_DIRECT with ``fsync``) and renamed whole,
then ``state.json`` (the shards ``load_from_disk`` reads) is rewritten by rename; after a SIGKILL the dataset holds
the complete shards. A write error (a full disk) ends the run: the open shard's temporary is removed,
``stats()["first_error"]`` says why, the earlier shards stay loadable.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import numpy as np

from ._files import replace_json

__all__ = ["ArrowSink", "ContextWriter"]


def pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError as err:
        from . import LogicError
        raise LogicError(f"ferry.arrow: expected pyarrow to import (pip install pyarrow), got {err}") from None
    return pa


class _Shards:
    """A dataset's shards: ``write(batch, nbytes)`` appends to the open shard (closed once it holds ``shard_bytes``),
    ``flush()`` renames it into the dataset and rewrites ``state.json`` and ``dataset_info.json`` by rename."""

    def __init__(self, directory: str, schema: Any, info: dict, shard_bytes: int, fsync: bool) -> None:
        self.pa = pyarrow()
        self.dir, self.schema, self.info = directory, schema, info
        self.shard_bytes, self.fsync = int(shard_bytes), fsync
        self.names: list[str] = []
        self._w = self._f = self._tmp = None
        self._open_bytes = 0

    def write(self, batch: Any, nbytes: int) -> None:
        if self._w is None:
            self._tmp = os.path.join(self.dir, f".data-{len(self.names):05d}.arrow.tmp-{os.getpid()}")
            from . import _ferry  # the safetensors sink's writer (O_DIRECT when durable), as pyarrow's file
            self._f = self.pa.PythonFile(_ferry.SequentialFile(self._tmp, durable=self.fsync), mode="w")
            self._w = self.pa.ipc.new_stream(self._f, self.schema)
            self._open_bytes = 0
        try:
            self._w.write_batch(batch)
        except BaseException:
            self.abandon()
            raise
        self._open_bytes += nbytes
        if self._open_bytes >= self.shard_bytes:
            self.flush()

    def abandon(self) -> None:
        """Drops the open shard (its temporary removed): a failed write ends the run with the earlier shards."""
        for part in (self._w, self._f):  # each closed even when the other's close fails (a full disk)
            try:
                part.close()
            except Exception:  # the temporary is removed below either way
                pass
        try:
            os.unlink(self._tmp)
        except (OSError, TypeError):
            pass
        self._w = self._f = None

    def flush(self) -> None:
        if self._w is None:
            return
        try:
            self._w.close()
            self._f.close()  # every byte in the file, synced when durable
            name = f"data-{len(self.names):05d}.arrow"
            os.replace(self._tmp, os.path.join(self.dir, name))
        except BaseException:
            self.abandon()
            raise
        self._w = self._f = None
        self.names.append(name)
        state = {"_data_files": [{"filename": n} for n in self.names], "_fingerprint": f"ferry-{len(self.names)}",
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
                 "_split": None}
        for fname, obj in (("dataset_info.json", self.info), ("state.json", state)):
            replace_json(os.path.join(self.dir, fname), obj, fsync=self.fsync, indent=1)


_FLOAT = {"F32", "F16", "BF16"}


class ContextWriter:
    """SAELens's layout from arrays: ``write({hook name: [tokens, width] array}, token_ids)`` appends
    ``tokens / context`` rows. ``hooks``: ``{name: (dtype name, row_shape)}`` (a channel's schema values)."""

    def __init__(self, directory: str, hooks: dict, context: int, *, token_ids: str = "token_ids",
                 shard_bytes: int = 1 << 30, fsync: bool = False) -> None:
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
        self.shards = _Shards(directory, schema, info, shard_bytes, fsync)
        self.rows = 0
        self.bytes = 0
        self._buf: dict[str, np.ndarray] = {}  # widen's float32 buffer per hook

    def widen(self, name: str, a: Any) -> np.ndarray:
        """Hook ``name``'s values as float32 (BF16 and F16 widened exactly) in this writer's buffer for the hook: one
        pass, no temporaries, the buffer reused by the next forward (the array is valid until the next ``write``)."""
        dtype = self.hooks[name][0]
        a = np.asarray(a)
        src = (np.ascontiguousarray(a).view(np.uint16) if dtype == "BF16" else a).reshape(-1)
        buf = self._buf.get(name)
        if buf is None or buf.size < src.size:
            buf = self._buf[name] = np.empty(src.size, np.float32)
        out = buf[:src.size]
        if dtype == "BF16":  # the bits above 16 zero bits: float32 of the same value
            np.left_shift(src, np.uint32(16), out=out.view(np.uint32), dtype=np.uint32)
        else:
            np.copyto(out, src, casting="same_kind")
        return out

    def write(self, arrays: dict, token_ids: Any, *, widened: bool = False) -> int:
        """Appends the contexts of one forward; LogicError (nothing written) for a hook missing or a token count
        that is not a whole number of contexts. ``widened``: every array came from ``widen`` (ArrowSink's path)."""
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
        nbytes = sum(int(c.nbytes) for c in cols)
        self.shards.write(pa.RecordBatch.from_arrays(cols, schema=self.shards.schema), nbytes)
        self.rows += n // ctx
        self.bytes += nbytes
        return n // ctx

    def close(self) -> None:
        self.shards.flush()


class ArrowSink:
    """Drains ``channel`` (made with a schema, no sink) on its own thread into a ``ContextWriter`` at ``directory``:
    a forward's entries are one write (the next forward's first entry, or ``close()``, ends it). ``stats()``:
    ``forwards_written``, ``rows_written``, ``bytes_written``, ``shards``, ``forwards_refused`` (a forward the layout
    refuses: its error is ``first_error``, the next forwards go on) and ``first_error``; a write error (a full disk)
    stops the sink with the earlier shards loadable. ``close()`` closes the channel, then the dataset."""

    def __init__(self, channel: Any, directory: str, context: int, *, token_ids: str = "token_ids",
                 shard_bytes: int = 1 << 30, fsync: bool = False) -> None:
        from . import LogicError
        schema = dict(channel.schema)
        if not schema:
            raise LogicError("ferry.arrow.ArrowSink: expected a channel made with a schema (its hooks are the "
                             "columns), got none")
        self.ch, self.names = channel, {h: v[0] for h, v in schema.items()}
        self.writer = ContextWriter(directory, {v[0]: (v[1], v[2]) for v in schema.values()}, context,
                                    token_ids=token_ids, shard_bytes=shard_bytes, fsync=fsync)
        self._stats = {"forwards_written": 0, "rows_written": 0, "bytes_written": 0, "shards": 0,
                       "forwards_refused": 0, "first_error": None}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ferry-arrow-sink", daemon=True)
        self._thread.start()

    def _write(self, fwd: dict) -> None:
        from . import LogicError
        tok = fwd.pop(self.writer.token_name, None)
        try:
            if tok is None:
                raise LogicError(f"ferry.arrow: expected a {self.writer.token_name!r} entry in every forward, got "
                                 f"hooks {sorted(fwd)}")
            rows = self.writer.write(fwd, tok, widened=True)  # a name not among the hooks: refused before any use
        except LogicError as err:
            self._stats["forwards_refused"] += 1
            self._stats["first_error"] = self._stats["first_error"] or str(err)
            return
        self._stats["forwards_written"] += 1
        self._stats["rows_written"] += rows
        self._stats["bytes_written"] = self.writer.bytes
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
        cur, fwd = None, {}
        try:
            while True:
                got = self._poll()
                if got is None or (not got and self._stop.is_set()):
                    break
                for e in got:
                    try:
                        if cur is not None and e.forward != cur:
                            self._write(fwd)
                            fwd = {}
                        cur = e.forward
                        if e.ok:  # a hook's values widened straight from the staging (one pass), others copied
                            name = self.names.get(e.hook, str(e.hook))
                            w = self.writer
                            fwd[name] = w.widen(name, e.numpy()) if name in w.hooks else np.array(e.numpy())
                    finally:
                        e.release()
            if fwd:
                self._write(fwd)
            self.writer.close()
            self._stats["shards"] = len(self.writer.shards.names)
        except Exception as err:  # a write error (a full disk): the run ends with the earlier shards
            self._stats["first_error"] = self._stats["first_error"] or f"{type(err).__name__}: {err}"

    def stats(self) -> dict:
        return dict(self._stats)

    def close(self) -> dict:
        """Closes the channel (every entry delivered), lets the thread write the last forward and the dataset's
        files, and returns stats()."""
        self.ch.close()
        self._stop.set()
        self._thread.join()
        return self.stats()
