# SPDX-License-Identifier: Apache-2.0
"""The shards of an Arrow dataset being written (``ferry.arrow``'s SAELens layout, ``ferry.engine``'s per-request
Arrow samples): each shard under a temporary name through ferry's sink writer (``_ferry.SequentialFile``: O_DIRECT
with ``fsync``; every shard of the run through one ``_ferry.FileWriter``, whose buffers and I/O threads stay warm
from one shard to the next), renamed whole, then ``state.json`` and ``dataset_info.json`` rewritten by rename, so
that a SIGKILL leaves a dataset of complete shards. ``tuning``: the writer's buffers and I/O threads
(``_ferry.FileWriter``'s keywords, ``sink::write_tuning``: ``io_threads``, ``write_buffers``, ``write_bytes``; never
what is written). A full shard is finished (its last writes and fsync, the rename, the JSON files) by a finisher
thread, in shard order, while the writer fills the next one, as the safetensors sink does
(src/sink/shard_finisher.hpp): at most two wait, and ``flush()`` returns once every one is in the dataset."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ._files import replace_json


def pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError as err:
        from . import LogicError
        raise LogicError(f"ferry.arrow: expected pyarrow to import (pip install pyarrow), got {err}") from None
    return pa


MAX_SEALED = 2  # shards sealed and not yet in the dataset, at most (the writer waits for room)


def file_writer(tuning: dict | None) -> Any:
    """The run's writer (``_ferry.FileWriter``, sink::write_tuning) from ``tuning``, checked at the call that takes
    it: LogicError for a key FileWriter does not take, a value out of range, or too few open files for the open
    shard and the sealed ones."""
    from . import LogicError, _ferry  # the safetensors sink's writer (O_DIRECT when durable), as pyarrow's file
    try:
        w = _ferry.FileWriter(**(tuning or {}))
    except TypeError as err:
        raise LogicError(f"ferry.arrow: expected tuning keys of _ferry.FileWriter, got {sorted(tuning or {})}: "
                         f"{err}") from None
    if w.max_open < MAX_SEALED + 1:  # the open shard and the sealed ones each hold a file
        raise LogicError(f"ferry.arrow: expected a writer that holds {MAX_SEALED + 1} open files (a shard written "
                         f"while {MAX_SEALED} finish), got tuning {tuning} with {w.max_open}")
    return w


class Shards:
    """A dataset's shards: ``write(batch, nbytes)`` appends to the open shard (sealed once it holds ``shard_bytes``
    and handed to the finisher), ``flush()`` seals the open one and waits until every sealed shard is renamed into
    the dataset, with ``state.json`` and ``dataset_info.json`` rewritten by rename. The first error of a finish
    (a full disk) is raised by the next ``write()`` or ``flush()``; the shards sealed after it are dropped.
    ``writer``: ``file_writer(tuning)``'s."""

    def __init__(self, directory: str, schema: Any, info: dict, shard_bytes: int, fsync: bool, writer: Any) -> None:
        self.pa = pyarrow()
        self._writer = writer
        self.dir, self.schema, self.info = directory, schema, info
        self.shard_bytes, self.fsync = int(shard_bytes), fsync
        self.names: list[str] = []  # the shards in the dataset (the finisher appends)
        self._w = self._f = self._raw = self._tmp = None
        self._open_bytes = 0
        self._sealed = 0  # shards sealed so far (the next one's number)
        self._pending: list[Future] = []
        self._error: BaseException | None = None  # the first failed finish
        self._lock = threading.Lock()
        self._fin: ThreadPoolExecutor | None = None
        self.seal_wait = 0.0  # seconds the writer waited for the finisher to take a sealed shard
        self.copy = self.io_wait = 0.0  # the FileWriter's times at the last seal: copying, waiting for a buffer

    def write(self, batch: Any, nbytes: int) -> None:
        self._raise_failed()
        if self._w is None:
            self._tmp = os.path.join(self.dir, f".data-{self._sealed:05d}.arrow.tmp-{os.getpid()}")
            from . import _ferry
            self._raw = _ferry.SequentialFile(self._tmp, durable=self.fsync, writer=self._writer)
            self._f = self.pa.PythonFile(self._raw, mode="w")
            self._w = self.pa.ipc.new_stream(self._f, self.schema)
            self._open_bytes = 0
        try:
            self._w.write_batch(batch)
        except BaseException:
            self.abandon()
            raise
        self._open_bytes += nbytes
        if self._open_bytes >= self.shard_bytes:
            self._seal()

    def abandon(self) -> None:
        """Drops the open shard (its temporary removed): a failed write ends the run with the earlier shards."""
        _drop(self._w, self._f, self._tmp)
        self._w = self._f = None

    def flush(self) -> None:
        """Seals the open shard; returns once every sealed shard is in the dataset (raises the first failure)."""
        self._seal()
        self.settle()
        self._raise_failed()

    def settle(self) -> None:
        """Returns once every sealed shard is in the dataset, or dropped after a failure (kept, not raised); the open
        shard is left as it is (a failed run's was abandoned)."""
        for f in list(self._pending):
            f.exception()  # waits; the error is kept by _finish
        self._pending.clear()
        if self._fin is not None:  # idle: its thread ends (a later seal starts another)
            self._fin.shutdown(wait=False)
            self._fin = None

    def _raise_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _seal(self) -> None:
        """The open shard's stream ended (its last bytes on their way) and handed to the finisher."""
        if self._w is None:
            return
        try:
            self._w.close()  # the stream's end marker, through the file's buffers
        except BaseException:
            self.abandon()
            raise
        self.copy, self.io_wait = self._writer.times  # over every shard so far
        shard = (self._f, self._tmp, f"data-{self._sealed:05d}.arrow")
        self._w = self._f = self._raw = None
        self._sealed += 1
        self._pending = [f for f in self._pending if not f.done()]
        t0 = time.perf_counter()
        while len(self._pending) >= MAX_SEALED:  # room: the oldest finished
            self._pending.pop(0).exception()
        self.seal_wait += time.perf_counter() - t0
        if self._fin is None:
            self._fin = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-arrow-finisher")
        self._pending.append(self._fin.submit(self._finish, *shard))

    def _finish(self, f: Any, tmp: str, name: str) -> None:
        """The finisher thread, one shard at a time in order: fsync, rename, the dataset's JSON files; after a
        failure, the later shards are dropped (their temporaries removed)."""
        if self._error is not None:
            _drop(None, f, tmp)
            return
        try:
            f.close()  # every byte in the file, synced when durable
            os.replace(tmp, os.path.join(self.dir, name))
        except BaseException as err:
            _drop(None, f, tmp)
            self._error = err
            return
        with self._lock:
            self.names.append(name)
            names = list(self.names)
        state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": f"ferry-{len(names)}",
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
                 "_split": None}
        try:
            for fname, obj in (("dataset_info.json", self.info), ("state.json", state)):
                replace_json(os.path.join(self.dir, fname), obj, fsync=self.fsync, indent=1)
        except BaseException as err:
            self._error = err


def _drop(w: Any, f: Any, tmp: str | None) -> None:
    """Closes a shard's stream and file (each even when the other's close fails: a full disk) and removes it."""
    for part in (w, f):
        try:
            if part is not None:
                part.close()
        except Exception:  # the temporary is removed below either way
            pass
    try:
        os.unlink(tmp)
    except (OSError, TypeError):
        pass
