# SPDX-License-Identifier: Apache-2.0
"""The shards of an Arrow dataset being written (``ferry.arrow``'s SAELens layout, ``ferry.engine``'s per-request
Arrow samples): each shard under a temporary name through ferry's sink writer (``_ferry.SequentialFile``: O_DIRECT
with ``fsync``), renamed whole, then ``state.json`` and ``dataset_info.json`` rewritten by rename, so that a SIGKILL
leaves a dataset of complete shards."""

from __future__ import annotations

import os
from typing import Any

from ._files import replace_json


def pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError as err:
        from . import LogicError
        raise LogicError(f"ferry.arrow: expected pyarrow to import (pip install pyarrow), got {err}") from None
    return pa


class Shards:
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
